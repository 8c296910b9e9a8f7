#!/usr/bin/env bash
# Nsight Compute reports for issue 5, sized for the device tool's return limits: one report per
# variant and token count (a stock report of 6 and 4096 tokens together came to 27 MB, over the
# 16 MB a returned file may be), each archived as soon as it is written; at most 8 files.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_ncu_capture.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_ncu_capture.sh OUT_DIR}
deadline=$(( $(date +%s) + ${BUDGET_S:-570} ))
if ls .whl/ncu_report-*.whl >/dev/null 2>&1; then  # carried from PyPI (see README, Capturing)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ncu_report-*.whl
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
log="$out/log.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$log"
for spec in "stock 6" "stock 4096" "flat 6" "flat 4096" "multirow 4096 --param rows=2" \
            "multirow 6 --param rows=2"; do
  set -- $spec
  variant=$1 tokens=$2; shift 2
  name=ncu-$variant-$tokens
  left=$(( deadline - $(date +%s) ))
  if (( left < 110 )); then echo "== skip $name: ${left} s left" | tee -a "$log"; continue; fi
  echo "== $name (${left} s left)" | tee -a "$log"
  mkdir -p "$out/$name"
  timeout $(( left - 10 )) python3 -m workbench.cli ncu moe "$variant" --tokens "$tokens" \
    --param fmt=fp8 "$@" --out "$out/$name" 2>&1 | tail -40 | tee -a "$log"
  tar cf "$out/$name.tar" -C "$out" "$name" && rm -rf "${out:?}/$name"
done
ls -la "$out" | tee -a "$log"
