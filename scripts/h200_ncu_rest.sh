#!/usr/bin/env bash
# One device call for issue 5's remaining Nsight Compute reports: multirow at 6 tokens, stock,
# flat and multirow at 4096 (FP8 W8A16, TP2-rank shape), and one decode step of the model.
# One report per capture, archived as soon as it is written (each well under the 16 MB a
# returned file may be), most wanted first.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_ncu_rest.sh "$OUT"
source "$(dirname "$0")/device_call.sh" "$@"
capture() {  # capture NAME NEEDED_S ARGS...: one `workbench ncu` run into out/NAME.tar.gz
  local name=$1 need=$2; shift 2
  step "$name" "$need" python3 -m workbench.cli ncu "$@" --out "$out/$name"
  archive "$out/$name"
}
capture ncu-stock-4096 70 moe stock --tokens 4096 --param fmt=fp8
capture ncu-flat-4096 70 moe flat --tokens 4096 --param fmt=fp8
capture ncu-multirow-4096 70 moe multirow --tokens 4096 --param fmt=fp8 --param rows=2
capture ncu-multirow-6 120 moe multirow --tokens 6 --param fmt=fp8 --param rows=2
capture ncu-decode 60 model-decode-step stock --tokens 1 --param layers=1
ls -la "$out" | tee -a "$log"
