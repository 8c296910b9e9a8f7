#!/usr/bin/env bash
# One device call: GPU checks of the dense and attention kernels, a tile grid for the dense FP8
# kernels, where decode attention spends its time, and the MoE benchmark rows issue 3 still
# lacks (T=512 for every scheduler and format; INT4 at 4096 and 33863). Each step is
# time-boxed and its output kept as soon as it ends.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_tune_and_rows.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_tune_and_rows.sh OUT_DIR}
deadline=$(( $(date +%s) + ${BUDGET_S:-570} ))
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log="$out/log.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$log"
step() {  # step NAME NEEDED_S COMMAND...: run if time allows, with what is left as its limit
  local name=$1 need=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if (( left < need )); then echo "== skip $name: ${left} s left" | tee -a "$log"; return; fi
  echo "== $name (${left} s left)" | tee -a "$log"
  timeout $(( left - 5 )) "$@" 2>&1 | grep -v "it/s\]$" | tee -a "$log"
}
step gpu-tests 60 env WORKBENCH_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider \
  tests/test_dense_kernels.py tests/test_attention_kernels.py
step attention-steps 20 python3 scripts/time_attention_steps.py
step tune-dense 120 python3 scripts/tune_dense.py "$out" --budget-s 230
step bench-moe-512 60 python3 -m workbench.cli bench moe --tokens 512 --out "$out"
step bench-moe-int4 60 python3 -m workbench.cli bench moe --tokens 4096 33863 --formats int4 \
  --out "$out"
for d in "$out"/bench-*/; do
  [ -d "$d" ] && tar czf "${d%/}.tar.gz" -C "$out" "$(basename "$d")" && rm -rf "$d"
done
ls -la "$out" | tee -a "$log"
