#!/usr/bin/env bash
# One device call for issue 5's last report: every kernel of one decode step of the model
# (stock MoE, Triton attention, one layer), collected three ways to learn which a committed
# report can afford: full's sections without PM sampling, --set detailed, and --set full.
# ncu's sets and sections are logged first; each report is archived on its own.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_decode_step_ncu.sh "$OUT"
source "$(dirname "$0")/device_call.sh" "$@"
export PATH=/usr/local/cuda/bin:$PATH
{ ncu --version; ncu --list-sets; ncu --list-sections; } 2>&1 | tee -a "$log" | tail -5
decode=(model-decode-step stock --tokens 1 --param layers=1 --param attention=triton)
capture() {  # capture NAME NEEDED_S ARGS...: one `workbench ncu` decode-step run, archived
  local name=$1 need=$2; shift 2
  step "$name" "$need" python3 -m workbench.cli ncu "${decode[@]}" "$@" --out "$out/$name" \
    --name "model-decode-step-stock-T1-$name"
  du -sh "$out/$name"/* 2>/dev/null | tee -a "$log"
  archive "$out/$name"
}
capture nopm 120 --section 'regex:^(?!PmSampling)'
capture detailed 100 --set detailed
capture full 120 --set full
ls -la "$out" | tee -a "$log"
