#!/usr/bin/env bash
# One call on two H200s (kind nvidia-h200-x2): the TP2 NCCL profile (issue 9) first, then, with
# the GPUs split, the MoE correctness tests and a first benchmark on GPU 0 (issue 3) while GPU 1
# captures Nsight Compute reports (issue 5). Every step is time-boxed and archived as it ends.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_x2_capture.sh "$OUT" [moe variant for TP2]
set -uo pipefail
out=${1:?usage: h200_x2_capture.sh OUT_DIR [VARIANT]}
variant=${2:-stock}
deadline=$(( $(date +%s) + ${BUDGET_S:-575} ))
if ls .whl/ncu_report-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ncu_report-*.whl
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
log="$out/log.txt"
say() { echo "== $* ($(( deadline - $(date +%s) )) s left)" | tee -a "$log"; }
quiet() { grep --line-buffered -vE "UserWarning: Warning: Profiler|_warn_once"; }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,memory.used --format=csv,noheader \
  | tee "$log"
say "tp2-$variant"
mkdir -p "$out/tp2-$variant"
timeout $(( deadline - $(date +%s) - 330 )) python3 -m workbench.cli profile --tp 2 \
  --moe "$variant" --prompt-tokens 33863 --decode-tokens 64 --out "$out/tp2-$variant" \
  --no-progress 2>&1 | quiet | tee -a "$log"
tar cf "$out/tp2-$variant.tar" -C "$out" "tp2-$variant" && rm -rf "${out:?}/tp2-$variant"

gpu0() {  # correctness at GPU compile, then the decode and prefill rows of the benchmark
  say "gpu-tests (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 WORKBENCH_GPU_TESTS=1 timeout 120 python3 -m pytest -q \
    -p no:cacheprovider tests/test_moe_stock.py tests/test_moe_schedulers.py \
    tests/test_moe_formats.py tests/test_moe_routing_kernels.py 2>&1 | tail -25
  say "bench (GPU 0)"
  mkdir -p "$out/bench"
  CUDA_VISIBLE_DEVICES=0 timeout $(( deadline - $(date +%s) - 15 )) python3 -m workbench.cli \
    bench moe --tokens 6 4096 33863 --routing uniform skewed --formats bf16 fp8 \
    --out "$out/bench" 2>&1 | quiet | tail -60
  tar cf "$out/bench.tar" -C "$out" bench && rm -rf "${out:?}/bench"
}
gpu1() {  # one report per variant and token count, archived in groups under 16 MB
  for spec in "stock 6" "flat 6" "multirow 6 --param rows=2" "stock 4096" "flat 4096"; do
    set -- $spec; v=$1 t=$2; shift 2
    (( deadline - $(date +%s) < 80 )) && { say "skip ncu-$v-$t"; continue; }
    say "ncu-$v-$t (GPU 1)"
    mkdir -p "$out/ncu-$t"
    CUDA_VISIBLE_DEVICES=1 timeout $(( deadline - $(date +%s) - 15 )) python3 -m workbench.cli \
      ncu moe "$v" --tokens "$t" --param fmt=fp8 "$@" --out "$out/ncu-$t" 2>&1 | tail -30
    if [ "$t" = 4096 ]; then
      tar cf "$out/ncu-$v-4096.tar" -C "$out" ncu-4096 && rm -rf "${out:?}/ncu-4096"
    fi
  done
  [ -d "$out/ncu-6" ] && tar cf "$out/ncu-6.tar" -C "$out" ncu-6 && rm -rf "${out:?}/ncu-6"
}
gpu0 > "$out/gpu0.log" 2>&1 &
gpu1 > "$out/gpu1.log" 2>&1 &
wait
cat "$out/gpu0.log" "$out/gpu1.log" >> "$log" && rm -f "$out/gpu0.log" "$out/gpu1.log"
ls -la "$out" | tee -a "$log"
