#!/usr/bin/env bash
# Second call on two H200s: the TP2 NCCL profile with the flat kernel (issue 9); then GPU 1
# captures the Nsight Compute reports (issue 5, Triton kernels only, small enough to commit)
# while GPU 0 tunes the flat kernel's tiles (issue 3) and runs the pipeline-depth and
# rows-per-tile sweeps (issue 6). Time-boxed steps, archived as they end; at most 8 files.
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_x2_second.sh "$OUT"
set -uo pipefail
out=${1:?usage: h200_x2_second.sh OUT_DIR}
deadline=$(( $(date +%s) + ${BUDGET_S:-575} ))
if ls .whl/ncu_report-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/ncu_report-*.whl
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
log="$out/log.txt"
say() { echo "== $* ($(( deadline - $(date +%s) )) s left)" | tee -a "$log"; }
quiet() { grep --line-buffered -vE "UserWarning: Warning: Profiler|_warn_once|barrier\(\)|return func"; }
left() { echo $(( deadline - $(date +%s) - ${1:-15} )); }
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used --format=csv,noheader | tee "$log"
say "tp2-flat"
mkdir -p "$out/tp2-flat"
timeout $(left 375) python3 -m workbench.cli profile --tp 2 --moe flat --prompt-tokens 33863 \
  --decode-tokens 64 --out "$out/tp2-flat" --no-progress 2>&1 | quiet | tee -a "$log"
tar cf "$out/tp2-flat.tar" -C "$out" tp2-flat && rm -rf "${out:?}/tp2-flat"

gpu0() {
  mkdir -p "$out/exp"
  say "tune flat (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 scripts/tune_moe.py "$out/exp" --budget-s 130 2>&1
  say "sweep num_stages (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout $(left 130) python3 -m workbench.cli sweep moe num_stages \
    3 5 8 12 --tokens 6 4096 --param variant=stock --param fmt=fp8 --baseline 3 \
    --timeout 120 --out "$out/exp" 2>&1 | tail -30
  say "sweep rows (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout $(left 10) python3 -m workbench.cli sweep moe rows 1 2 4 \
    --tokens 512 4096 33863 --param variant=multirow --param fmt=fp8 --baseline 1 \
    --timeout 120 --out "$out/exp" 2>&1 | tail -30
  tar czf "$out/exp.tar.gz" -C "$out" exp && rm -rf "${out:?}/exp"
}
ncu1() {  # ncu1 NAME VARIANT TOKENS [ARGS...]: one report, gzipped as soon as it is written
  local name=$1 v=$2 t=$3; shift 3
  (( $(left) < 70 )) && { say "skip $name"; return; }
  say "$name (GPU 1)"
  mkdir -p "$out/$name"
  CUDA_VISIBLE_DEVICES=1 timeout $(left) python3 -m workbench.cli ncu "$v" "${@:1:1}" \
    --tokens "$t" "${@:2}" --out "$out/$name" 2>&1 | tail -12
  tar czf "$out/$name.tar.gz" -C "$out" "$name" && rm -rf "${out:?}/${name:?}"
}
gpu1() {
  ncu1 ncu-6 moe 6 stock --param fmt=fp8
  ncu1 ncu-flat-6 moe 6 flat --param fmt=fp8
  ncu1 ncu-stock-4096 moe 4096 stock --param fmt=fp8
  ncu1 ncu-flat-4096 moe 4096 flat --param fmt=fp8
  ncu1 ncu-decode model-decode-step 1 stock --param layers=1
}
gpu0 > "$out/gpu0.log" 2>&1 &
gpu1 > "$out/gpu1.log" 2>&1 &
wait
cat "$out/gpu0.log" "$out/gpu1.log" >> "$log" && rm -f "$out/gpu0.log" "$out/gpu1.log"
ls -la "$out" | tee -a "$log"
