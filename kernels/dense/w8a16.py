"""W8A16 dense GEMM, y = x @ W.T: FP8 weights dequantised in the kernel, activations as they
come (what Marlin W8A16 does), fp32 accumulation.

At decode sizes the GEMM is a stream of the weight through the SMs, and reading one byte per
weight instead of bf16's two is the whole of its advantage, so the small-M tiles are shaped for
bandwidth: 16-row MMA tiles (the fewest an MMA takes), 64 columns, 128-byte K rows per load,
deep pipelining, and split-K until about two programs sit on every SM.

Each K tile is cut into sub-tiles of one scale block. The FP8 values convert to the activation
dtype exactly, and the power-of-two scale multiplies the sub-tile's fp32 product, exactly too:
one multiply-add per accumulator element per sub-tile, which at 16 rows is half the work of
scaling every weight before the MMA (and keeps bf16 arithmetic, which the interpreter gets
wrong, out of the kernel). Large-M tiles pay more for it; W8A8 serves large M.
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

default_tiles = TilesByM(
    decode=GemmTiles(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4),
    middle=GemmTiles(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4),
    prefill=GemmTiles(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3),
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
    x_ptrs = x_ptr + rows[:, None] * stride_xm + (k_lo + offs_k)[None, :] * stride_xk
    w_ptrs = w_ptr + cols[None, :] * stride_wn + (k_lo + offs_k)[:, None] * stride_wk
    s_ptrs = s_ptr + (cols // QBLOCK) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        for j in tl.static_range(BLOCK_K // SUB_K):
            k_sub = k0 + j * SUB_K
            k_ok = k_sub + offs_k < K
            x = tl.load(x_ptrs + j * SUB_K * stride_xk, mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)  # fmt: skip
            w8 = tl.load(w_ptrs + j * SUB_K * stride_wk, mask=k_ok[:, None] & col_ok[None, :],
                         other=0.0)  # fmt: skip
            scale = tl.load(s_ptrs + (k_sub // QBLOCK) * stride_sk, mask=col_ok & (k_sub < K),
                            other=0.0)  # fmt: skip
            w = w8.to(x.dtype)  # exact: every E4M3 value is a bf16 value
            if UPCAST:
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(x, w, input_precision=PRECISION) * scale[None, :]
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    store_tile(y_ptr, part_ptr, locks_ptr, rows, cols, acc, M, N, stride_ym, stride_ps, SPLIT)


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
