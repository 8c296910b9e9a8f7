#!/usr/bin/env bash
# One device call for issue 5's remaining Nsight Compute reports: multirow at 6 tokens, stock,
# flat and multirow at 4096 (FP8 W8A16, TP2-rank shape), and one decode step of the model.
# One report per capture (each archive well under the 16 MB a returned file may be), archived
# as soon as it is written, most wanted first, so a call cut off still returns what finished.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_ncu_rest.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_ncu_rest.sh OUT_DIR}
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
if ls .whl/ncu_report-*.whl >/dev/null 2>&1; then  # carried from PyPI (see README, Capturing)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ncu_report-*.whl
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
log="$out/log.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$log"
capture() {  # capture NAME NEEDED_S ARGS...: one `workbench ncu` run into out/NAME.tar.gz
  local name=$1 need=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if (( left < need )); then echo "== skip $name: ${left} s left" | tee -a "$log"; return; fi
  echo "== $name (${left} s left)" | tee -a "$log"
  mkdir -p "$out/$name"
  timeout $(( left - 5 )) python3 -m workbench.cli ncu "$@" --out "$out/$name" 2>&1 \
    | tail -30 | tee -a "$log"
  tar czf "$out/$name.tar.gz" -C "$out" "$name" && rm -rf "${out:?}/$name"
}
capture ncu-stock-4096 70 moe stock --tokens 4096 --param fmt=fp8
capture ncu-flat-4096 70 moe flat --tokens 4096 --param fmt=fp8
capture ncu-multirow-4096 70 moe multirow --tokens 4096 --param fmt=fp8 --param rows=2
capture ncu-multirow-6 120 moe multirow --tokens 6 --param fmt=fp8 --param rows=2
capture ncu-decode 60 model-decode-step stock --tokens 1 --param layers=1
ls -la "$out" | tee -a "$log"
