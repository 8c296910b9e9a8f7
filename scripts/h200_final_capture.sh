#!/usr/bin/env bash
# One device call: CUDA-graph decode (issue 10) and Nsight Compute reports (issue 5).
# Each step is time-boxed and archived as soon as it ends, most valuable first, so a call cut
# off at its limit still returns what finished. At most 8 files come back: 7 archives + log.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_final_capture.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_final_capture.sh OUT_DIR}
deadline=$(( $(date +%s) + ${BUDGET_S:-570} ))
# ncu_report reads the reports: PyPI's wheel when carried in .whl/, else the copy ncu ships.
if ls .whl/ncu_report-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ncu_report-*.whl
  ncu_py=/tmp/site
else
  ncu_py=$(dirname "$(find /usr/local/cuda*/ /opt/nvidia -name ncu_report.py 2>/dev/null | head -1)")
fi
export PYTHONPATH=$PWD:$ncu_py PYTHONUNBUFFERED=1
log="$out/log.txt"
say() { echo "== $* ($(( deadline - $(date +%s) )) s left)" | tee -a "$log"; }
step() {  # step NAME NEEDED_S COMMAND...: run if time allows, archive out/NAME, keep the log
  local name=$1 need=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if (( left < need )); then say "skip $name: needs ${need} s"; return; fi
  say "$name"
  mkdir -p "$out/$name"
  timeout $(( left - 10 )) "$@" 2>&1 | grep -vE "UserWarning: Warning: Profiler|_warn_once" | tee -a "$log"
  tar cf "$out/$name.tar" -C "$out" "$name" && rm -rf "${out:?}/$name"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader | tee "$log"
echo "ncu_report from: $ncu_py" | tee -a "$log"
for mode in graphs eager; do
  flag=$([ $mode = graphs ] && echo --cuda-graphs || echo --no-cuda-graphs)
  step run-$mode 200 python3 -m workbench.cli profile --prompt-tokens 33863 --decode-tokens 64 \
    $flag --out "$out/run-$mode" --no-progress
done
step fixture-graphs 40 python3 -c "import workbench; r = workbench.profile(2048, 4, layers=2, \
out='$out/fixture-graphs', progress=False, keep_trace=True, cuda_graphs=True); \
print(r.path, r.meta['graph_matching'])"
for spec in "stock" "flat" "multirow --param rows=2"; do
  variant=${spec%% *}
  step ncu-$variant 70 python3 -m workbench.cli ncu moe $spec --tokens 6 4096 --param fmt=fp8 \
    --out "$out/ncu-$variant"
done
step gpu-tests 60 env WORKBENCH_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider -x \
  tests/test_cuda_graphs_gpu.py tests/test_moe_stock.py tests/test_moe_schedulers.py \
  tests/test_moe_formats.py tests/test_moe_routing_kernels.py
step ncu-decode 60 python3 -m workbench.cli ncu model-decode-step stock --tokens 1 \
  --param layers=1 --out "$out/ncu-decode"
ls -la "$out" | tee -a "$log"
