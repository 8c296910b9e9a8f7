"""Hybrid dense GEMM: W8A16 for small batches, W8A8 for large ones (the seed's DENSE_HYBRID_M).

W8A16 wins while a GEMM streams its weight (decode: half the bytes of bf16, no activation
quantisation), W8A8 once it is compute-bound (FP8 tensor cores at twice the bf16 rate), so one
row count decides. Both take the same FP8 weights, so switching costs nothing at run time.
"""

import os

from torch import Tensor

from kernels.dense.formats import DenseWeights
from kernels.dense.w8a8 import linear_w8a8
from kernels.dense.w8a16 import linear_w8a16

# On the H200 (graph replays, one run: raw/bench-dense-*T043838) a layer took 0.091 ms in
# W8A16 and 0.121 in W8A8 at M=32, 0.135 and 0.148 at M=64, 0.219 and 0.150 at M=128: W8A8
# wins between 64 and 128 rows. (Before W8A16's bit conversion it won from 64: 0.148 against
# 0.135, raw/logs/h200-tune-dense-graphs.csv.) With W8A16's direct 32-row middle tiles it
# still does: 0.111 against 0.148 at M=64, 0.177 against 0.150 at 128
# (raw/logs/h200-bench-dense-peers-m1-128-partial-*.txt). The seed's DENSE_HYBRID_M was 128.
# W8A16's Gluon kernel (from 48 rows) moved the crossing: a layer took 0.126 ms in W8A16 at 128
# rows, 0.159 at 256, 0.245 at 512 and 0.403 at 1024 (raw/logs/h200-dense-w8a16-gluon-times-
# de08917-*.csv) where W8A8 took 0.150, 0.180 (raw/bench-dense-*T010924), 0.243 and 0.344
# (raw/logs/h200-tune-dense-wgmma-waves-*.csv): W8A16 up to 256 rows, about even at 512.
DEFAULT_HYBRID_M = 256
ENV = "DENSE_HYBRID_M"


def hybrid_threshold(hybrid_m: int | None = None) -> int:
    """The largest M that takes W8A16: `hybrid_m`, else $DENSE_HYBRID_M, else 256."""
    source = "hybrid_m"
    if hybrid_m is None:
        text = os.environ.get(ENV)
        if text is None:
            return DEFAULT_HYBRID_M
        source = f"${ENV}"
        try:
            hybrid_m = int(text)
        except ValueError:
            raise ValueError(f"{source}={text!r} is not an integer; set it to e.g. 128.") from None
    if not isinstance(hybrid_m, int) or hybrid_m < 0:
        raise ValueError(f"{source}={hybrid_m!r} must be an integer >= 0 (0: always W8A8).")
    return hybrid_m


def linear_hybrid(
    x: Tensor, weights: DenseWeights, hybrid_m: int | None = None, pdl: bool | None = False
) -> Tensor:
    """x @ W.T through W8A16 when x has at most `hybrid_threshold(hybrid_m)` rows, else W8A8.
    `pdl` is the W8A16 side's (`linear_w8a16`); the W8A8 kernels launch without PDL."""
    if x.shape[0] <= hybrid_threshold(hybrid_m):
        return linear_w8a16(x, weights, pdl=pdl)
    return linear_w8a8(x, weights)
