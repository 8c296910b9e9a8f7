"""W8A16 dense GEMM, y = x @ W.T: FP8 weights dequantised in the kernel, activations as they
come (what Marlin W8A16 does), fp32 accumulation.

The kernel computes the transpose, y.T = W @ x.T, as Marlin and Machete do: the weight tile is
the MMA's first operand, which Hopper's wgmma reads from registers, so the dequantised weights
go from the load straight into the tensor cores with no trip through shared memory; and the
tokens are the MMA's narrow side, so a decode batch of 1 to 16 tokens fills a 16-column MMA
instead of wasting 48 of a 64-row one.

Each K tile is cut into sub-tiles of one scale block. The FP8 values and their power-of-two
scale multiply exactly in fp32 and convert to the activation dtype exactly, so the dequantised
weight is the weight `DenseWeights.dequantize()` gives, and one accumulator runs through every
MMA of the tile (no per-sub-tile rescaling of the accumulator). Decode sizes split K until
about two programs sit on every SM (see `tiles.split_plan`).
"""

import triton
import triton.language as tl
from torch import Tensor

from kernels.dense.formats import DenseWeights, check_linear_inputs
from kernels.dense.tiles import (
    GROUP_M,
    GemmTiles,
    TilesByM,
    outputs,
    program_tile,
    split_plan,
    store_tile,
)
from kernels.moe.compiled import launch, recording
from kernels.moe.routing import dot_options

# block_m: tokens per tile (the MMA's N side), block_n: weight rows per tile (its M side).
default_tiles = TilesByM(
    decode=GemmTiles(block_m=16, block_n=64, block_k=256, num_warps=4, num_stages=4),
    middle=GemmTiles(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=4),
    prefill=GemmTiles(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
)


@triton.jit
def _w8a16_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, locks_ptr, M, N, K, k_per_split,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sk, stride_ym, stride_ps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
    QBLOCK: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    GROUP: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = program_tile(M, N, BLOCK_M, BLOCK_N, GROUP)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < M
    col_ok = cols < N
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    offs_k = tl.arange(0, SUB_K)
    x_ptrs = x_ptr + rows[None, :] * stride_xm + (k_lo + offs_k)[:, None] * stride_xk
    w_ptrs = w_ptr + cols[:, None] * stride_wn + (k_lo + offs_k)[None, :] * stride_wk
    s_ptrs = s_ptr + (cols // QBLOCK) * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # y.T's tile
    for k0 in range(k_lo, k_hi, BLOCK_K):
        for j in tl.static_range(BLOCK_K // SUB_K):
            k_sub = k0 + j * SUB_K
            k_ok = k_sub + offs_k < K
            x_t = tl.load(x_ptrs + j * SUB_K * stride_xk, mask=k_ok[:, None] & row_ok[None, :],
                          other=0.0)  # fmt: skip
            w8 = tl.load(w_ptrs + j * SUB_K * stride_wk, mask=col_ok[:, None] & k_ok[None, :],
                         other=0.0)  # fmt: skip
            scale = tl.load(s_ptrs + (k_sub // QBLOCK) * stride_sk, mask=col_ok & (k_sub < K),
                            other=0.0)  # fmt: skip
            w = (w8.to(tl.float32) * scale[:, None]).to(x_t.dtype)  # exact, both steps
            if UPCAST:
                x_t = x_t.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(w, x_t, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    store_tile(y_ptr, part_ptr, locks_ptr, rows, cols, tl.trans(acc), M, N, stride_ym, stride_ps,
               SPLIT)  # fmt: skip


def linear_w8a16(x: Tensor, weights: DenseWeights, **options: int | None) -> Tensor:
    """x @ W.T for x (M, K) in bf16 or fp32 and FP8 `weights` (N, K); (M, N) in x's dtype.

    `options` override the tiles (block_m, block_n, block_k, num_warps, num_stages, split_k);
    by default they follow M (see `default_tiles`) and split_k fills the GPU.
    """
    check_linear_inputs(x, weights, "fp8")
    (m, k), n = x.shape, weights.out_features
    tiles = default_tiles(m).override(**options)
    tiles.check()
    splits, k_per_split = split_plan(tiles, m, n, k, x.device)
    tiles_mn = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    y, part, locks = outputs(m, n, tiles_mn, splits, x.dtype, x.device)
    precision, upcast = dot_options(x.dtype)
    grid = (tiles_mn, splits)
    with recording():
        launch(
            _w8a16_kernel, grid, x, weights.values, weights.scales, y, part, locks, m, n, k,
            k_per_split, *x.stride(), *weights.values.stride(), *weights.scales.stride(),
            y.stride(0), part.stride(0), BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
            BLOCK_K=tiles.block_k, SUB_K=tiles.sub_k(weights.block), QBLOCK=weights.block,
            SPLIT=splits > 1, PRECISION=precision, UPCAST=upcast, GROUP=GROUP_M,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )  # fmt: skip
    return y
