"""W8A16 at a few token rows on the CUDA cores: y = x @ W.T as a matrix-vector product per row.

At one to eight rows the tensor-core kernel (`kernels.dense.w8a16`) pads its tile to 16 rows
and spends most of its time waiting: on the H200 (ncu, `ncu/dense-w8a16-T6-4096`) a 21 MB
projection at M=6 ran at 35% of DRAM bandwidth, with two programs an SM (the split-K plan),
4 warps each, and the bit conversion and MMA issue between its loads. A layer there took
0.058-0.062 ms at M=1-6, 1.22-1.25x cuBLAS bf16, where half the bytes allow up to 2x.

Here each program streams BLOCK_N weight rows through its K range and multiplies them in fp32
FMAs, one pass per token row: M FMAs and about 2.5 integer instructions of conversion per
weight byte, and nothing pads M. x's row is read in the weight tile's shape, every weight row
at the same addresses, so each thread loads its own 16 columns 16 bytes at a time (L1
broadcasts them). The loop is not pipelined through shared memory, which would copy those rows
BLOCK_N times: the loads in flight come from the BLOCK_K // SUB_K sub-tiles a step issues
together and from many programs an SM (`programs_per_sm` in the split-K plan, whose
partial-sum store the tensor-core kernels share, `kernels.dense.tiles`).

A program's rows lie in one scale block (BLOCK_N divides the weight's block), so each K
sub-tile has one scale, applied to the row sums: the FP8 bits become bf16 by bit moves
(`kernels.dequant`, 2**120 folded into the scale) and fp32 by a shift, both exact.
"""

import triton
import triton.language as tl

from kernels.dense.tiles import group_operands, k_in_range, store_tile
from kernels.dequant import E4M3_BITS_SCALE, e4m3_as_bf16

MAX_ROWS = 8  # most token rows the kernel unrolls its passes for (one pass a row)


@triton.jit
def _w8a16_cores_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, locks_ptr, M, N, K, k_per_split,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sk, stride_ym, stride_ps,
    stride_xg, stride_wg, stride_sg,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
    QBLOCK: tl.constexpr, SPLIT: tl.constexpr, BITS: tl.constexpr, EVEN_K: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, locks_ptr = group_operands(
        x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, locks_ptr, M, N, stride_xg, stride_wg, stride_sg
    )
    pid_n = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    col_ok = cols < N
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    offs_k = tl.arange(0, SUB_K)
    w_ptrs = w_ptr + cols[:, None] * stride_wn + (k_lo + offs_k)[None, :] * stride_wk
    # x's row m is read in w's (BLOCK_N, SUB_K) shape, every weight row at the same addresses:
    # each thread then loads its own 16 columns of x, 16 bytes at a time (L1 broadcasts them).
    x_ptrs = x_ptr + (cols * 0)[:, None] + (k_lo + offs_k)[None, :] * stride_xk
    s_ptrs = s_ptr + (pid_n * BLOCK_N // QBLOCK) * stride_sn  # the program's one scale row
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):  # not pipelined through shared memory: see above
        for j in tl.static_range(BLOCK_K // SUB_K):
            k_sub = k0 + j * SUB_K
            k_ok = k_in_range(k_sub, offs_k, K, EVEN_K)
            w8 = tl.load(w_ptrs + j * SUB_K * stride_wk, mask=col_ok[:, None] & k_ok[None, :],
                         other=0.0)  # fmt: skip
            scale = tl.load(s_ptrs + (k_sub // QBLOCK) * stride_sk, mask=k_sub < K, other=0.0)
            if BITS:
                w = e4m3_as_bf16(w8).to(tl.float32)
                scale *= E4M3_BITS_SCALE
            else:
                w = w8.to(tl.float32)
            for m in tl.static_range(ROWS):  # M itself: no pass for padding rows
                x = tl.load(x_ptrs + m * stride_xm + j * SUB_K * stride_xk, mask=k_ok[None, :],
                            other=0.0).to(tl.float32)  # fmt: skip
                row_sum = tl.sum(w * x, axis=1) * scale
                # Column m of acc: a constant per register, so the select folds away.
                acc = tl.where(rows[None, :] == m, acc + row_sum[:, None], acc)
        w_ptrs += BLOCK_K * stride_wk
        x_ptrs += BLOCK_K * stride_xk
    store_tile(
        y_ptr, part_ptr, locks_ptr, rows, cols, tl.trans(acc), M, N, stride_ym, stride_ps, SPLIT
    )
