#!/usr/bin/env bash
# One device call for CUDA-graph decode: GPU checks, the 33,863-token profile with and without
# CUDA graphs, a small graphed profile whose trace is kept as a test fixture, and the ceilings.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_graphs_capture.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_graphs_capture.sh OUT_DIR}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$out/raw" "$out/fixtures" "$out/logs"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
  echo "== GPU checks: kernels against references, graph replay against eager steps"
  WORKBENCH_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider tests/test_moe_stock.py \
    tests/test_cuda_graphs_gpu.py 2>&1 | tail -3
  echo "== ceilings"
  python3 -c "from workbench.capture.ceilings import measure_ceilings as m; r = m(); print({k: f'{v:.4g}' for k, v in r.items()})"
  for graphs in --cuda-graphs --no-cuda-graphs; do
    echo "== main job $graphs"
    python3 -m workbench.cli profile --prompt-tokens 33863 --decode-tokens 64 $graphs \
      --out "$out/raw" --no-progress 2>&1 | grep -v UserWarning | grep -v _warn_once
  done
  echo "== small graphed profile kept as a fixture"
  python3 -c "import workbench; r = workbench.profile(2048, 4, layers=2, out='$out/fixtures', progress=False, keep_trace=True, cuda_graphs=True); print(r.path, r.meta['graph_matching'])"
} 2>&1 | tee "$out/logs/capture.txt"
for part in raw fixtures logs; do
  tar cf "$out/$part.tar" -C "$out" "$part" && rm -rf "${out:?}/$part"
done
ls -la "$out"
