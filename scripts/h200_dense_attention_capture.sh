#!/usr/bin/env bash
# One device call on one H200 for issue 4 (dense backends and sparse attention): the kernels'
# GPU tests first (compile, no spills, CUDA-graph replay of split-K, results against the
# references), then `bench attention`, `bench dense` (decode rows first, so a call cut off at
# its limit keeps them), and profiles with the Triton variants. Every step is time-boxed and
# archived as soon as it ends.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_dense_attention_capture.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_dense_attention_capture.sh OUT_DIR}
deadline=$(( $(date +%s) + ${BUDGET_S:-575} ))
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log="$out/log.txt"
say() { echo "== $* ($(( deadline - $(date +%s) )) s left)" | tee -a "$log"; }
step() {  # step NAME NEEDED_S COMMAND...: run if time allows, archive out/NAME, keep the log
  local name=$1 need=$2; shift 2
  local left=$(( deadline - $(date +%s) ))
  if (( left < need )); then say "skip $name: needs ${need} s"; return; fi
  say "$name"
  mkdir -p "$out/$name"
  timeout $(( left - 10 )) "$@" 2>&1 | grep -vE "UserWarning: Warning: Profiler|_warn_once" \
    | tee -a "$log"
  tar cf "$out/$name.tar" -C "$out" "$name" && rm -rf "${out:?}/$name"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader | tee "$log"
step gpu-tests 120 env WORKBENCH_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider \
  tests/test_dense_kernels.py tests/test_attention_kernels.py
step bench-attention 120 python3 -m workbench.cli bench attention --out "$out/bench-attention"
step bench-dense-decode 90 python3 -m workbench.cli bench dense --tokens 1 4 6 24 --no-ab \
  --out "$out/bench-dense-decode"
step bench-dense 200 python3 -m workbench.cli bench dense --out "$out/bench-dense"
for spec in "hybrid triton" "w8a16 triton"; do
  set -- $spec
  step profile-$1-$2 120 python3 -m workbench.cli profile --prompt-tokens 33863 \
    --decode-tokens 64 --dense "$1" --attention "$2" --out "$out/profile-$1-$2" --no-progress
done
ls -la "$out" | tee -a "$log"
