#!/usr/bin/env bash
# Last call on two H200s: GPU 0 runs the MoE benchmark with the tuned defaults (issue 3) and
# the expert-group sweep (issue 6); GPU 1 the dense and attention benchmarks (issue 4), then
# the 4096-token Nsight Compute reports (issue 5). Steps are time-boxed; each GPU's results are
# archived when its list ends, the ncu reports one by one. At most 8 files come back.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_x2_final.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_x2_final.sh OUT_DIR}
deadline=$(( $(date +%s) + ${BUDGET_S:-575} ))
if ls .whl/ncu_report-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ncu_report-*.whl
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
log="$out/log.txt"
say() { echo "== $* ($(( deadline - $(date +%s) )) s left)" | tee -a "$log"; }
left() { echo $(( deadline - $(date +%s) - ${1:-20} )); }
cap() { local a=$1 b; b=$(left); echo $(( a < b ? a : b )); }
wb() { python3 -m workbench.cli "$@"; }
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used --format=csv,noheader | tee "$log"

gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  say "bench moe, decode sizes (GPU 0)"
  timeout $(cap 170) python3 -m workbench.cli bench moe --tokens 1 6 24 48 512 \
    --routing uniform skewed --formats bf16 fp8 int4 --out "$out/g0" 2>&1 | grep "kernel=\|written\|Error"
  say "bench moe, prefill sizes (GPU 0)"
  timeout $(cap 200) python3 -m workbench.cli bench moe --tokens 4096 33863 --routing uniform \
    --formats bf16 fp8 int4 --out "$out/g0" 2>&1 | grep "kernel=\|written\|Error"
  say "sweep groups (GPU 0)"
  timeout $(left 30) python3 -m workbench.cli sweep moe groups 16 4 8 12 --tokens 6 24 48 512 4096 \
    --param variant=stock --param fmt=fp8 --baseline 16 --timeout 90 --out "$out/g0" 2>&1 | tail -30
  tar czf "$out/g0.tar.gz" -C "$out" g0 && rm -rf "${out:?}/g0"
}
gpu1_benches() {
  say "gpu-tests dense and attention"
  WORKBENCH_GPU_TESTS=1 timeout $(cap 100) python3 -m pytest -q -p no:cacheprovider \
    tests/test_dense_kernels.py tests/test_attention_kernels.py 2>&1 | tail -25
  say "bench dense"
  timeout $(cap 150) python3 -m workbench.cli bench dense --out "$out/g1" 2>&1 | tail -60
  say "bench attention"
  timeout $(cap 90) python3 -m workbench.cli bench attention --out "$out/g1" 2>&1 | tail -30
  tar czf "$out/g1.tar.gz" -C "$out" g1 && rm -rf "${out:?}/g1"
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  gpu1_benches
  for v in stock flat; do
    (( $(left) < 90 )) && { say "skip ncu-$v-4096"; continue; }
    say "ncu-$v-4096 (GPU 1)"
    timeout $(left) python3 -m workbench.cli ncu moe $v --tokens 4096 --param fmt=fp8 \
      --out "$out/ncu-$v-4096" 2>&1 | tail -8
    tar czf "$out/ncu-$v-4096.tar.gz" -C "$out" "ncu-$v-4096" && rm -rf "${out:?}/ncu-$v-4096"
  done
}
single() {  # one GPU (the two-GPU kind was not lent): issue 4's first GPU run, then decode rows
  gpu1_benches
  export CUDA_VISIBLE_DEVICES=0
  say "bench moe, decode sizes"
  timeout $(left 15) python3 -m workbench.cli bench moe --tokens 1 6 24 48 --routing uniform \
    skewed --formats bf16 fp8 int4 --out "$out/g0" 2>&1 | grep "kernel=\|written\|Error"
  tar czf "$out/g0.tar.gz" -C "$out" g0 && rm -rf "${out:?}/g0"
}
if [ "$(nvidia-smi -L | wc -l)" = 1 ]; then
  single 2>&1 | tee -a "$log"
else
  gpu0 > "$out/gpu0.log" 2>&1 &
  gpu1 > "$out/gpu1.log" 2>&1 &
  wait
  cat "$out/gpu0.log" "$out/gpu1.log" >> "$log" && rm -f "$out/gpu0.log" "$out/gpu1.log"
fi
ls -la "$out" | tee -a "$log"
