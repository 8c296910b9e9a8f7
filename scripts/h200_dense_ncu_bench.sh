#!/usr/bin/env bash
# One device call: GPU checks of the dense kernels after the W8A16 orientation change, the dense
# and attention benchmarks, Nsight Compute reports of the dense FP8 kernels at M = 6 and 4096
# and of one decode step of the model (issue 5). Time-boxed steps, outputs archived as made.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_dense_ncu_bench.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_dense_ncu_bench.sh OUT_DIR}
deadline=$(( $(date +%s) + ${BUDGET_S:-570} ))
if ls .whl/ncu_report-*.whl >/dev/null 2>&1; then  # carried from PyPI (see README, Capturing)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ncu_report-*.whl
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
log="$out/log.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$log"
step() {  # step NAME NEEDED_S COMMAND...: run if time allows, with what is left as its limit
  local name=$1 need=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if (( left < need )); then echo "== skip $name: ${left} s left" | tee -a "$log"; return; fi
  echo "== $name (${left} s left)" | tee -a "$log"
  timeout $(( left - 5 )) "$@" 2>&1 | grep -v "it/s\]$" | tail -60 | tee -a "$log"
}
step gpu-tests 40 env WORKBENCH_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider \
  tests/test_dense_kernels.py
step bench-dense 60 python3 -m workbench.cli bench dense --out "$out"
step bench-attention 30 python3 -m workbench.cli bench attention --out "$out"
mkdir -p "$out/ncu"
step ncu-dense-w8a16 60 python3 -m workbench.cli ncu dense w8a16 --tokens 6 4096 --out "$out/ncu"
step ncu-dense-w8a8 60 python3 -m workbench.cli ncu dense w8a8 --tokens 6 4096 --out "$out/ncu"
step ncu-decode 60 python3 -m workbench.cli ncu model-decode-step stock --tokens 1 \
  --param layers=1 --out "$out/ncu"
for d in "$out"/bench-*/ "$out/ncu/"; do
  [ -d "$d" ] && tar czf "${d%/}.tar.gz" -C "$out" "$(basename "$d")" && rm -rf "$d"
done
ls -la "$out" | tee -a "$log"
