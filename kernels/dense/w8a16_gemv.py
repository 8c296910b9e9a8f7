"""W8A16 at a few token rows as a streamed matrix-vector product on the CUDA cores.

A decode layer's W8A16 GEMMs are six reads of 6 to 32 MB of FP8 weights, and on the H200 the
tensor-core kernel (`kernels.dense.w8a16`) took 1.71 times as long as plain reads of the same
bytes (scripts/dense_decode_read_floor.py: 60.4 against 35.4 us a layer at one row), where
cuBLAS bf16 takes 1.30 times its own reads. Its programs walk K in steps of a few KB, four
warps on a chain of dependent steps, so few bytes are in flight an SM; a read kernel that asks
for its whole chunk at once (8 to 32 KB a program, every load issued before any is used) runs
near the copy bandwidth.

This kernel is that read with the arithmetic added. A program owns BLOCK_N weight rows (lying
in one row of scale blocks) across the whole of K, which it loads in at most two pieces of a
power-of-two number of K blocks (K = 5120 is 32 + 8 blocks of 128), both issued before the
first multiply (compiled by Triton 3.6 for sm_90, at most one 16-byte load a program comes
after the first FFMA: scripts/dense_gemv_sass.py): there is no K loop, no split of K and no
partial sums. Each FP8 value becomes fp32 by bit moves (`kernels.dequant.e4m3_as_f32`: ten
integer instructions for four values, 2**120 folded into the scale) and takes one fp32 FMA a
token row against x; each K block's sum is scaled, and the blocks' sums end in one reduction
a row. At M token rows that is about 2.5 + M instructions a weight byte, so the kernel is for
the row where bytes, not FMAs, set the pace.

On the H200, in one A/B run of the code before it against this (`workbench ab dense
--tokens 1`, raw/ab-dense-20261205T182555), a dsv4-flash-tp2 layer's W8A16 GEMMs took 0.0449
ms at one row against 0.0550 (ratio 0.816, 95% interval 0.811-0.823); in the dense bench of
record, with every peer (raw/bench-dense-dsv4-flash-tp2-20261205T195201), 0.0466 ms against
0.0723 for cuBLAS bf16 (1.55x, 95% interval 1.54-1.56, from 1.27x) and 0.0966 for humming's
W8A16. Its defaults, 8 KB of weights and four warps a
program, came from a grid on an H100 (raw/logs/h100-dense-w8a16-gemv-tune-*.csv: 0.050 ms a
layer at one row against 0.061 for the tensor-core decode tiles; 16 and 32 KB 0.053-0.055, 64
KB 0.057-0.059). At K = 5120 that is one weight row a program, each reading x's 10 KB from L2
for 5 KB of weights: traced on the H100 (raw/logs/h100-dense-w8a16-gemv-read-floor-*.csv),
those two projections took 1.44-1.50x as long as plain reads of their bytes where the four
others took 1.11-1.36x (49.7 against 39.5 us a layer). A grid of fixed rows and warps a program
per projection (raw/logs/h100-dense-w8a16-gemv-rows-*.csv) found each projection's best within
4-5% of these defaults (qkv_a 0.0092 ms at four rows and eight warps against 0.0096), so one
plan serves all six. At two to four rows it lost on the H100 (0.073 to 0.113 ms at
best against 0.063-0.064: the FMAs and reductions grow with the rows), so it is the default at
one row (`GEMV_MAX_M`) and takes up to MAX_ROWS when asked (`gemv=True`).

An earlier CUDA-core kernel (commit 1a4167c, reverted) had a K loop of 128 to 512-wide steps
with K split over the SMs and its partial sums: 16 bytes in flight a thread a step. It took
0.061 ms a layer at one row against 0.058 for the tensor-core kernel on the H200
(raw/logs/h200-tune-dense-cores-*.csv).
"""

import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import interpreting, launch
from kernels.dense.tiles import WARPS
from kernels.dequant import E4M3_BITS_SCALE, e4m3_as_f32

GEMV_MAX_M = 1  # token rows up to which linear_w8a16 takes this kernel by default
MAX_ROWS = 4  # most token rows the kernel takes (one FMA pass a row)
TILE_BYTES = 8 * 1024  # FP8 bytes a program loads at most, when block_n is not given
NUM_WARPS = 4


def gemv_block_n(k: int, qblock: int, tile_bytes: int = TILE_BYTES) -> int:
    """Weight rows a program: the most (a power of two, at most one scale block) whose K
    values fit in `tile_bytes`, at least one."""
    rows = 1
    while rows * 2 <= qblock and rows * 2 * k <= tile_bytes:
        rows *= 2
    return rows


def k_pieces(k_blocks: int) -> tuple[int, int, int]:
    """(main, rest, rest padded): K's scale blocks as a power-of-two main piece and the rest,
    which the kernel loads padded to a power of two (masked)."""
    main = 1 << (k_blocks.bit_length() - 1)
    rest = k_blocks - main
    return main, rest, triton.next_power_of_2(rest) if rest else 0


def check_gemv(
    m: int, k: int, qblock: int, block_n: int | None, num_warps: int | None,
    tile_bytes: int | None,
) -> None:  # fmt: skip
    """Refuse shapes and options the kernel cannot run, naming the fix."""
    if m > MAX_ROWS:
        raise ValueError(f"gemv=True takes up to {MAX_ROWS} token rows; x has {m}. Pass "
                         f"gemv=None to pick the kernel by rows.")  # fmt: skip
    if k % qblock:
        raise ValueError(f"gemv=True needs K ({k}) to be a whole number of {qblock}-wide scale "
                         f"blocks; pass gemv=False for the tensor-core kernel.")  # fmt: skip
    if block_n is not None and (block_n < 1 or block_n > qblock or block_n & (block_n - 1)):
        raise ValueError(f"block_n={block_n} must be a power of two of at most the weight's "
                         f"block ({qblock}): a program's rows share their scales.")  # fmt: skip
    if num_warps is not None and num_warps not in WARPS:
        raise ValueError(f"num_warps={num_warps!r} must be one of {WARPS}.")
    if tile_bytes is not None and (block_n is not None or tile_bytes < 1):
        raise ValueError(f"tile_bytes={tile_bytes!r} sets block_n by K: pass one of the two, "
                         f"tile_bytes a positive number of bytes.")  # fmt: skip


@triton.jit
def _piece_weights(w_ptr, cols, col_ok, stride_wn, stride_wk, K0: tl.constexpr,
                   KB: tl.constexpr, KB_P2: tl.constexpr, QBLOCK: tl.constexpr):  # fmt: skip
    """The program's FP8 weights over K blocks K0 // QBLOCK onwards: (KB_P2, BLOCK_N, QBLOCK),
    zeros past the KB blocks that exist. K blocks lead, so that Triton spreads a warp's lanes
    over K and keeps a thread's weight rows in its registers, where one x value serves them
    all (rows leading put the rows on lanes, and every thread converted x for itself)."""
    kb = tl.arange(0, KB_P2)
    ks = K0 + kb[:, None, None] * QBLOCK + tl.arange(0, QBLOCK)[None, None, :]
    mask = (kb < KB)[:, None, None] & col_ok[None, :, None]
    return tl.load(w_ptr + cols[None, :, None] * stride_wn + ks * stride_wk, mask=mask,
                   other=0.0)  # fmt: skip


@triton.jit
def _piece_sums(w8, x_ptr, s_ptr, stride_xm, stride_xk, stride_sk, K0: tl.constexpr,
                KB: tl.constexpr, KB_P2: tl.constexpr, QBLOCK: tl.constexpr,
                ROWS: tl.constexpr, ROWS_P2: tl.constexpr, BITS: tl.constexpr):  # fmt: skip
    """(BLOCK_N, ROWS_P2): each weight row of `w8` times each token row of x over the piece,
    each K block's sum scaled before the blocks add up."""
    kb = tl.arange(0, KB_P2)
    k_ok = kb < KB
    ks = K0 + kb[:, None] * QBLOCK + tl.arange(0, QBLOCK)[None, :]
    scale = tl.load(s_ptr + (K0 // QBLOCK + kb) * stride_sk, mask=k_ok, other=0.0)
    if BITS:
        w = e4m3_as_f32(w8)
        scale *= E4M3_BITS_SCALE
    else:
        w = w8.to(tl.float32)
    token = tl.arange(0, ROWS_P2)
    sums = tl.zeros((w8.shape[1], ROWS_P2), tl.float32)
    for m in tl.static_range(ROWS):
        x = tl.load(x_ptr + m * stride_xm + ks * stride_xk, mask=k_ok[:, None], other=0.0)
        blocks = tl.sum(w * x.to(tl.float32)[:, None, :], axis=2)  # (KB_P2, BLOCK_N)
        row = tl.sum(blocks * scale[:, None], axis=0)
        sums = tl.where(token[None, :] == m, sums + row[:, None], sums)  # folds: m is constant
    return sums


@triton.jit
def _w8a16_gemv_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, N, stride_xm, stride_xk, stride_wn, stride_wk, stride_sn,
    stride_sk, stride_ym, stride_xg, stride_wg, stride_sg,
    ROWS: tl.constexpr, ROWS_P2: tl.constexpr, BLOCK_N: tl.constexpr, QBLOCK: tl.constexpr,
    KB_MAIN: tl.constexpr, KB_REST: tl.constexpr, KB_REST_P2: tl.constexpr, BITS: tl.constexpr,
):  # fmt: skip
    # Grid axis 1 is the projection of a group (kernels.dense.grouped).
    g = tl.program_id(1).to(tl.int64)
    x_ptr += g * stride_xg
    w_ptr += g * stride_wg
    s_ptr += g * stride_sg + (tl.program_id(0) * BLOCK_N // QBLOCK) * stride_sn
    y_ptr += g * N
    cols = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    col_ok = cols < N
    K_REST0: tl.constexpr = KB_MAIN * QBLOCK
    # Every weight load is issued before the first multiply: the bytes in flight are the point.
    w_main = _piece_weights(w_ptr, cols, col_ok, stride_wn, stride_wk, 0, KB_MAIN, KB_MAIN,
                            QBLOCK)  # fmt: skip
    if KB_REST > 0:
        w_rest = _piece_weights(w_ptr, cols, col_ok, stride_wn, stride_wk, K_REST0, KB_REST,
                                KB_REST_P2, QBLOCK)  # fmt: skip
    sums = _piece_sums(w_main, x_ptr, s_ptr, stride_xm, stride_xk, stride_sk, 0, KB_MAIN,
                       KB_MAIN, QBLOCK, ROWS, ROWS_P2, BITS)  # fmt: skip
    if KB_REST > 0:
        sums += _piece_sums(w_rest, x_ptr, s_ptr, stride_xm, stride_xk, stride_sk, K_REST0,
                            KB_REST, KB_REST_P2, QBLOCK, ROWS, ROWS_P2, BITS)  # fmt: skip
    token = tl.arange(0, ROWS_P2)
    y_ptrs = y_ptr + token[:, None] * stride_ym + cols[None, :]
    mask = (token < ROWS)[:, None] & col_ok[None, :]
    tl.store(y_ptrs, tl.trans(sums).to(y_ptr.dtype.element_ty), mask=mask)


def gemm_w8a16_gemv(
    x: Tensor, values: Tensor, scales: Tensor, qblock: int, y: Tensor,
    group_strides: tuple[int, int], block_n: int | None = None, num_warps: int | None = None,
    tile_bytes: int | None = None,
) -> None:  # fmt: skip
    """y (M, G * N) = cat_g(x[:, g] @ dequantised W_g.T) for x (M, G, K), W_g the FP8 `values`
    (N, K) with their fp32 block `scales` at `group_strides` (values, scales elements) from
    member to member. The caller has checked the inputs (`formats`) and `check_gemv`."""
    (m, groups, k), n = x.shape, values.shape[0]
    block_n = block_n or gemv_block_n(k, qblock, tile_bytes or TILE_BYTES)
    main, rest, rest_p2 = k_pieces(k // qblock)
    grid = (triton.cdiv(n, block_n), groups)
    launch(
        _w8a16_gemv_kernel, grid, x, values, scales, y, n, x.stride(0), x.stride(2),
        *values.stride(), *scales.stride(), y.stride(0), x.stride(1), *group_strides,
        ROWS=m, ROWS_P2=triton.next_power_of_2(m), BLOCK_N=block_n, QBLOCK=qblock,
        KB_MAIN=main, KB_REST=rest, KB_REST_P2=rest_p2,
        # Under the interpreter the PTX conversion cannot run; Triton's gives the same values.
        BITS=not interpreting(), num_warps=num_warps or NUM_WARPS, num_stages=1,
    )  # fmt: skip
