#!/usr/bin/env bash
# One device call: GPU checks of the dense kernels after the W8A16 orientation change, the dense
# and attention benchmarks, and Nsight Compute reports of the dense FP8 kernels at M = 6 and
# 4096 and of one decode step of the model (issue 5), each report archived on its own (one
# archive of all three came to 38 MB, over the 16 MB a returned file may be).
#   WORKBENCH_GIT_COMMIT=<sha> bash scripts/h200_dense_ncu_bench.sh "$OUT"
source "$(dirname "$0")/device_call.sh" "$@"
step gpu-tests 40 env WORKBENCH_GPU_TESTS=1 python3 -m pytest -q -p no:cacheprovider \
  tests/test_dense_kernels.py
step bench-dense 60 python3 -m workbench.cli bench dense --out "$out"
step bench-attention 30 python3 -m workbench.cli bench attention --out "$out"
for variant in w8a16 w8a8; do
  step ncu-dense-$variant 60 python3 -m workbench.cli ncu dense $variant --tokens 6 4096 \
    --out "$out/ncu-dense-$variant"
done
step ncu-decode 60 python3 -m workbench.cli ncu model-decode-step stock --tokens 1 \
  --param layers=1 --out "$out/ncu-decode"
archive "$out"/bench-*/ "$out"/ncu-*/
ls -la "$out" | tee -a "$log"
