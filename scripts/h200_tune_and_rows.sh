#!/usr/bin/env bash
# One device call: GPU checks of the dense and attention kernels, a tile grid for the dense FP8
# kernels, where decode attention spends its time, and the MoE benchmark rows issue 3 still
# lacked (T=512 for every scheduler and format; INT4 at 4096 and 33863).
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_tune_and_rows.sh "$OUT"
source "$(dirname "$0")/device_call.sh" "$@"
step gpu-tests 60 env WORKBENCH_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider \
  tests/test_dense_kernels.py tests/test_attention_kernels.py
step attention-steps 20 python3 scripts/time_attention_steps.py
step tune-dense 120 python3 scripts/tune_dense.py "$out" --budget-s 230
step bench-moe-512 60 python3 -m workbench.cli bench moe --tokens 512 --out "$out"
step bench-moe-int4 60 python3 -m workbench.cli bench moe --tokens 4096 33863 --formats int4 \
  --out "$out"
archive "$out"/bench-*/
ls -la "$out" | tee -a "$log"
