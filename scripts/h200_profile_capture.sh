#!/usr/bin/env bash
# One device call for the profile captures: check the machine, check the kernels on the GPU,
# run the main job, and capture the trace fixtures. Everything lands in one tarball under the
# folder given (the device tool's $OUT), and a short summary is printed last.
#   bash scripts/h200_profile_capture.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_profile_capture.sh OUT_DIR}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$out/raw" "$out/fixtures" "$out/logs"
log="$out/logs/capture.txt"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv
  python3 -c "import torch, triton, pandas; print('torch', torch.__version__, 'triton', triton.__version__, 'pandas', pandas.__version__)"
  command -v ncu && ncu --version | tail -1
  echo "== kernels against their references, on the GPU"
  WORKBENCH_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider tests/test_moe_stock.py tests/test_kernels_reference.py 2>&1 | tail -3
  echo "== main job"
  time python3 -m workbench.cli profile --prompt-tokens 33863 --decode-tokens 64 \
    --out "$out/raw" --no-progress
  echo "== small model trace kept as a test fixture"
  python3 -c "import workbench; r = workbench.profile(2048, 4, layers=2, out='$out/fixtures', progress=False, keep_trace=True); print(r.path)"
  echo "== third-party trace: HF transformers Mixtral"
  python3 tests/fixtures/make_hf_mixtral_trace.py "$out/fixtures/hf-mixtral-h200.json.gz"
} 2>&1 | tee "$log"
# One archive per folder: the device tool returns files of at most 16 MB each.
for part in raw fixtures logs; do
  tar cf "$out/$part.tar" -C "$out" "$part" && rm -rf "${out:?}/$part"
done
ls -la "$out"
