"""W8A16 dense GEMM, y = x @ W.T: FP8 weights dequantised in the kernel, activations as they
come (what Marlin W8A16 does), fp32 accumulation.

Two orientations, chosen by the tiles' `swap_ab`:
- swapped (prefill, from 129 rows): the kernel computes y.T = W @ x.T, as Marlin and Machete do. The
  weight tile is the MMA's first operand, which Hopper's wgmma reads from registers, so the
  dequantised weights go from the load into the tensor cores without a trip through shared
  memory, and one accumulator runs through every MMA: the FP8 values and their power-of-two
  scale multiply exactly in fp32 and convert to the activation dtype exactly. On the H200 this
  took a 4096-token layer from 4.7 to 3.0 ms (scripts/tune_dense.py).
- direct (up to 128 rows): x @ W.T with each sub-tile's fp32 product scaled before it joins
  the accumulator: 16 or 32 token rows make that rescaling cheap. On the H200 a layer at M=4
  took 0.132 ms this way and 0.158 ms swapped at its best tiles (two runs, not one:
  raw/bench-dense-*T154120 and raw/logs/h200-tune-dense.csv; tune_dense.py now times both),
  and with the bit conversion 0.080 against 0.091 at M=32 and 0.111 against 0.134 at M=64.
Each K tile is cut into sub-tiles of one scale block; decode sizes split K so that the
busiest SM runs the fewest K steps (`tiles.balanced_splits`: o_a in four splits, not five,
shared_gate_up in seven, not eight); on the H200 that took a layer from
0.0596-0.0631 to 0.0585-0.0613 ms at M=1-16 and 0.0750-0.0770 to 0.0732-0.0737 at 24-32 in
one A/B run (raw/logs/h200-dense-w8a16-balanced-splits-ab-*.csv), and the bench after has the
layer at 1.27x cuBLAS bf16 at 1 row and 1.30-1.31x at 4-16 (raw/bench-dense-*T192855). Up to
32 token rows a tile, the weights
become bf16 by bit manipulation (`kernels.dequant`), with 2**120 folded into the scale: on the
H200 that took a layer at M=1-16 from 0.072-0.080 ms to 0.059-0.064, 1.21-1.23x cuBLAS bf16
(raw/bench-dense-*T043838). At one token row `linear_w8a16` takes the CUDA-core kernel
(`w8a16_gemv`, whose programs load their whole K before the first multiply) instead: on the
H200 a layer took 0.0449 against 0.0550 ms with this kernel (raw/ab-dense-20261205T182555).

Five ways past this decode kernel did not pay on the H200:
- More programs an SM: split plans for 3 and 4 made a layer 6-10% slower at M=1-16 (commit
  1a4167c).
- A CUDA-core kernel for up to 8 rows (fp32 FMAs a token row, x read in the weight tile's
  shape for 16-byte loads, no padding of M): 0.061 ms a layer at M=1 at best against 0.058
  for this kernel in the same run, and 1.7-3x slower at M=4-8, where its FMAs and reductions,
  not bytes, set the pace (raw/logs/h200-tune-dense-cores-*.csv, commit 1a4167c). Its K loop
  kept 16 bytes a thread in flight; `w8a16_gemv`, which asks for a program's whole K at once,
  beats this kernel at one row and still loses from two.
- No split-K, narrow tiles instead (16 or 32 weight rows, 128- or 256-deep K tiles, 1-4
  warps, up to 8 stages), so that no GEMM pays the partial sums' round trips: a layer took
  0.072-0.111 ms at M=1 against 0.058 for the defaults, and every projection but
  shared_down lost (raw/logs/h200-w8a16-decode-narrow-unsplit-*.csv, commit 4d9005c).
- Each sub-tile's weight scales loaded one sub-tile ahead, as the MoE decode tiles do: compiled
  for sm_90 the scale load (an `ld.global`, not one of the pipelined copies) is waited for right
  after the step's MMAs, but the layer took 59.2 against 59.8 us at M=1, the same at 4 and 6,
  and 2% longer at 16 and 24; five stages in place of four were slower at 1 to 24 rows
  (raw/logs/h200-dense-w8a16-scales-ahead-ab-*.csv, commit daf3b80).
- The weights in a tiled copy, each program's 64 x 128 K-step tile in one 8 KB piece (DRAM
  pages read whole, as a plain read kernel reads them): the layer took 1.6-3.8% longer up to 16
  rows and the same at 24-32 (raw/logs/h200-dense-w8a16-tiled-weights-ab-*.csv, commit
  33cba16), so page locality is not what holds these GEMMs back.
Timed alone, every projection's best tile setting summed to 2 to 3% under these defaults at M=1
and 6 (raw/logs/h200-w8a16-decode-per-projection-*.csv). Each GEMM there took 7-8 us more
than its bytes at the copy bandwidth (launch, ramp, tail, split-K arrival); cuBLAS bf16 paid
5-8 us more than its own, so at a layer of six GEMMs half the bytes stop near 1.27x by that
arithmetic (1.22-1.25x measured in that run's bench; 1.24-1.31x in raw/bench-dense-*T234818,
where cuBLAS bf16 took 0.077 ms a layer at M=1 against 0.071 before).

With `pdl=None` (or True) the kernel launches with PDL (`kernels.pdl`): each program asks L2
for its first two K tiles of weights, waits for the grid before, and lets the next grid launch
once its main loop is done. Letting it launch right after the wait, or prefetching a program's
whole K range, made a layer slower on the H200 (blocks of the next grid waiting on SMs, L2
filled ahead of use), and so did PDL at M=64 (raw/logs/h200-pdl-probe-*.csv). It is off by
default: back-to-back GEMMs gain up to 5%, but the served decode step lost 0.30 ms.

From 17 to 32 rows the kernel about ties cuBLAS bf16 (1.02-1.03x), from 64 to 256 it stayed
below (0.79x to 0.42x, raw/bench-dense-*T234818), so from WGMMA_MIN_M rows the Gluon kernel
(`w8a16_wgmma`) takes bf16 GEMMs with 128-wide blocks on sm_90 (0.90x to 0.69x in
raw/bench-dense-*T030543). Why the Triton kernel stays below: on the H200 (ncu, the
swapped 128x64 tile, a 128-row q_up) a program issues about ten instructions a weight value
(the FP8 values come out of shared memory two bytes a load, go through fp16 and
fp32 to bf16, and every cp.async recomputes its predicates), at 1.42 instructions a cycle with
two blocks an SM (shared memory): latency-bound, neither the tensor pipe nor HBM busy
(raw/logs/h200-ncu-w8a16-swapped-qup-m128-*.txt, raw/logs/h200-w8a16-swapped-tiles-*.csv).
Triton can in fact give those weights 16-byte loads: handing both operands K in the order of
the MMA's register slots (a reshape and permute of each tile, Marlin's reordering done in the
kernel) made Triton 3.6 carry the register layout back to the shared-memory load
(`ld.shared.v4` for `ld.shared.v2.b8`). On the H200 (one run, commit 3745280,
raw/logs/h200-tune-dense-slot-order-*.csv) 16- and 32-row swapped tiles took 5-16% less time,
still more than the direct tiles (which the MMAv2 path already loads eight bytes a thread),
and 64- and 128-row tiles 4-23% more, so it was taken out: load width is not what holds the
middle sizes back. The direct middle tiles' small grid (ncu/dense-w8a16-T6-128-4096: 15% of
warps resident at M=128 where 25% fit) was not it either: splitting their K 2 to 4 ways made a
layer 8-23% slower at M=64 and 128 (raw/logs/h200-tune-dense-middle-splits-*.csv).
"""

from collections.abc import Sequence

import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.compiled import launch, recording
from kernels.dense.formats import DenseWeights, check_group_inputs, check_linear_inputs
from kernels.dense.tiles import (
    GROUP_M,
    GemmTiles,
    TilesByM,
    k_in_range,
    outputs,
    program_tile,
    split_plan,
    store_tile,
)
from kernels.dense.w8a16_gemv import GEMV_MAX_M, check_gemv, gemm_w8a16_gemv
from kernels.dense.w8a16_wgmma import check_wgmma_inputs, gemm_w8a16_wgmma
from kernels.dequant import E4M3_BITS_SCALE, e4m3_as_bf16
from kernels.moe.routing import dot_options
from kernels.pdl import prefetch_rows_to_l2, prefetchable

# From here the Gluon kernel (`w8a16_wgmma`) takes bf16 GEMMs with 128-wide blocks on sm_90: on
# the H200 (raw/logs/h200-dense-w8a16-gluon-times-*.csv) a layer took 0.095 ms at 48 rows
# against the Triton kernel's 0.110, 0.099 against 0.111 at 64, 0.159 against 0.262 at 256 and
# 1.36 against 2.13 at 4096; at 32 rows it took 0.104 against 0.081, and from 33 to 47 it was
# within 6% either way in another run (0.105 against 0.110 at 33, 0.114 against 0.110 at 47).
WGMMA_MIN_M = 48
# Of each weight row, prefetched before the PDL wait: the pipeline's first two 128-wide K tiles.
PREFETCH_BYTES = tl.constexpr(256)
# block_m: tokens per tile, block_n: weight rows per tile (the MMA's N and M sides when swapped).
default_tiles = TilesByM(
    # PDL stays off by default (pdl=None turns it on): in bench dense it took a layer at
    # M=16 from 0.0626 to 0.0596 ms (raw/logs/h200-tune-dense-pdl-b49276a-*.csv), but in the
    # served profile, where the kernel before a W8A16 GEMM is a norm or a torch op, it made a
    # decode step 0.30 ms slower (its dense GEMMs 2.47 -> 2.66 ms) against the last profile
    # without it (raw/logs/h200-profile-pdl-on-*: its per-step summary; the run's tar was
    # removed on 2026-12-02 for room; the one-run A/B in docs/design.md ran both arms without
    # PDL, it turned out, so it measured nothing).
    decode=GemmTiles(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4),
    # 17-128 rows, direct: on the H200 (raw/logs/h200-tune-dense-20261201T0600.csv) a layer
    # took 0.080 ms at M=32 against 0.091 swapped, and 0.111 against 0.134 at M=64.
    middle=GemmTiles(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=3),
    prefill=GemmTiles(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3,
                      swap_ab=True),
    # On the H200 (raw/logs/h200-tune-dense-graphs.csv) 32-row tiles (swapped, then) took
    # 0.220 ms a layer at M=128 against 0.248 for the prefill tiles, but 0.554 against 0.349
    # at M=256.
    middle_up_to=128,
)  # fmt: skip


@triton.jit
def _swapped_mainloop(
    x_ptr, w_ptr, s_ptr, rows, cols, M, N, K, k_lo, k_hi, stride_xm, stride_xk, stride_wn,
    stride_wk, stride_sn, stride_sk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, QBLOCK: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """The (BLOCK_M, BLOCK_N) tile of y, computed as y.T = dequantised W @ x.T.

    The bit conversion (`kernels.dequant`) only for tiles of up to 32 token rows: on the H200
    it took M=128 from 0.242 to 0.219 ms a layer with the 32-row middle tiles, but M=4096 from
    2.10 to 2.40 with the 128-row prefill tiles, for about as many instructions
    (raw/bench-dense-*T043838 against *T022817)."""
    BITS: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16 and not UPCAST and BLOCK_M <= 32
    row_ok, col_ok = rows < M, cols < N
    offs_k = tl.arange(0, SUB_K)
    x_ptrs = x_ptr + rows[None, :] * stride_xm + (k_lo + offs_k)[:, None] * stride_xk
    w_ptrs = w_ptr + cols[:, None] * stride_wn + (k_lo + offs_k)[None, :] * stride_wk
    s_ptrs = s_ptr + (cols // QBLOCK) * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        for j in tl.static_range(BLOCK_K // SUB_K):
            k_sub = k0 + j * SUB_K
            k_ok = k_in_range(k_sub, offs_k, K, EVEN_K)
            x_t = tl.load(x_ptrs + j * SUB_K * stride_xk, mask=k_ok[:, None] & row_ok[None, :],
                          other=0.0)  # fmt: skip
            w8 = tl.load(w_ptrs + j * SUB_K * stride_wk, mask=col_ok[:, None] & k_ok[None, :],
                         other=0.0)  # fmt: skip
            scale = tl.load(s_ptrs + (k_sub // QBLOCK) * stride_sk, mask=col_ok & (k_sub < K),
                            other=0.0)  # past K: no scale block there to read  # fmt: skip
            if BITS:  # bf16 times a power of two: exact
                w = e4m3_as_bf16(w8) * (scale * E4M3_BITS_SCALE).to(tl.bfloat16)[:, None]
            else:
                w = (w8.to(tl.float32) * scale[:, None]).to(x_t.dtype)  # exact, both steps
            if UPCAST:
                x_t = x_t.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(w, x_t, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    return tl.trans(acc)


@triton.jit
def _direct_mainloop(
    x_ptr, w_ptr, s_ptr, rows, cols, M, N, K, k_lo, k_hi, stride_xm, stride_xk, stride_wn,
    stride_wk, stride_sn, stride_sk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SUB_K: tl.constexpr, QBLOCK: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """The (BLOCK_M, BLOCK_N) tile of y = x @ W.T, each sub-tile's product scaled in fp32."""
    BITS: tl.constexpr = x_ptr.dtype.element_ty == tl.bfloat16 and not UPCAST
    row_ok, col_ok = rows < M, cols < N
    offs_k = tl.arange(0, SUB_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + (k_lo + offs_k)[None, :] * stride_xk
    w_ptrs = w_ptr + cols[None, :] * stride_wn + (k_lo + offs_k)[:, None] * stride_wk
    s_ptrs = s_ptr + (cols // QBLOCK) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        for j in tl.static_range(BLOCK_K // SUB_K):
            k_sub = k0 + j * SUB_K
            k_ok = k_in_range(k_sub, offs_k, K, EVEN_K)
            x = tl.load(x_ptrs + j * SUB_K * stride_xk, mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)  # fmt: skip
            w8 = tl.load(w_ptrs + j * SUB_K * stride_wk, mask=k_ok[:, None] & col_ok[None, :],
                         other=0.0)  # fmt: skip
            scale = tl.load(s_ptrs + (k_sub // QBLOCK) * stride_sk, mask=col_ok & (k_sub < K),
                            other=0.0)  # past K: no scale block there to read  # fmt: skip
            if BITS:
                w = e4m3_as_bf16(w8)
                scale *= E4M3_BITS_SCALE
            else:
                w = w8.to(x.dtype)  # exact: every E4M3 value is a bf16 value
            if UPCAST:
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(x, w, input_precision=PRECISION) * scale[None, :]
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def _w8a16_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, part_ptr, locks_ptr, M, N, K, k_per_split,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_sn, stride_sk, stride_ym, stride_ps,
    stride_xg, stride_wg, stride_sg,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
    QBLOCK: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    GROUP: tl.constexpr, SWAP: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    # Grid axis 2 is the projection of a group (kernels.dense.grouped): its input columns,
    # weight, scales, output columns, partial sums and arrival counters.
    g = tl.program_id(2).to(tl.int64)
    x_ptr += g * stride_xg
    w_ptr += g * stride_wg
    s_ptr += g * stride_sg
    y_ptr += g * N
    part_ptr += g * M * N
    locks_ptr += g * tl.num_programs(0)
    pid_m, pid_n = program_tile(M, N, BLOCK_M, BLOCK_N, GROUP)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    if PDL:  # the first K tiles of this program's weights into L2 while the grid before runs
        if PREFETCH:
            nbytes = tl.minimum(k_hi - k_lo, PREFETCH_BYTES)  # one byte a value
            prefetch_rows_to_l2(w_ptr + cols * stride_wn + k_lo, tl.where(cols < N, nbytes, 0))
        gdc_wait()  # then x, which the grid before may have written
    if SWAP:
        acc = _swapped_mainloop(
            x_ptr, w_ptr, s_ptr, rows, cols, M, N, K, k_lo, k_hi, stride_xm, stride_xk,
            stride_wn, stride_wk, stride_sn, stride_sk, BLOCK_M, BLOCK_N, BLOCK_K, SUB_K,
            QBLOCK, PRECISION, UPCAST, EVEN_K,
        )  # fmt: skip
    else:
        acc = _direct_mainloop(
            x_ptr, w_ptr, s_ptr, rows, cols, M, N, K, k_lo, k_hi, stride_xm, stride_xk,
            stride_wn, stride_wk, stride_sn, stride_sk, BLOCK_M, BLOCK_N, BLOCK_K, SUB_K,
            QBLOCK, PRECISION, UPCAST, EVEN_K,
        )  # fmt: skip
    if PDL:  # the next grid may launch and prefetch while this one stores
        gdc_launch_dependents()
    store_tile(y_ptr, part_ptr, locks_ptr, rows, cols, acc, M, N, stride_ym, stride_ps, SPLIT)


def linear_w8a16(
    x: Tensor,
    weights: DenseWeights,
    wgmma: bool | None = None,
    gemv: bool | None = None,
    **options: int | None,
) -> Tensor:
    """x @ W.T for x (M, K) in bf16 or fp32 and FP8 `weights` (N, K); (M, N) in x's dtype.

    `options` override the Triton kernel's tiles (block_m, block_n, block_k, num_warps,
    num_stages, split_k, swap_ab); by default they follow M (see `default_tiles`) and split_k
    fills the GPU. `wgmma` picks the Gluon kernel (`w8a16_wgmma`; sm_90, bf16 activations,
    128-wide blocks); None: from WGMMA_MIN_M rows where it can run and no Triton option is
    given. `gemv` picks the CUDA-core kernel (`w8a16_gemv`: block_n, num_warps, tile_bytes);
    None: up to GEMV_MAX_M rows where no other option is given and K is whole scale blocks.
    `pdl` (off by default; None: where the GPU has it) applies to the Triton and Gluon kernels.
    """
    check_linear_inputs(x, weights, "fp8")
    return _dispatch(x[:, None], weights, (0, 0), wgmma, gemv, options)


def linear_w8a16_group(
    x: Tensor,
    group: Sequence[DenseWeights],
    wgmma: bool | None = None,
    gemv: bool | None = None,
    **options: int | None,
) -> Tensor:
    """cat_g(x[:, g] @ W_g.T) in one launch, for x (M, G, K) and G FP8 weights of one shape
    laid out at one stride (`formats.stacked_stride`); (M, G * N) in x's dtype. `wgmma`, `gemv`
    and `options` as `linear_w8a16` takes them."""
    strides = check_group_inputs(x, group, "fp8")
    return _dispatch(x, group[0], strides, wgmma, gemv, options)


def _dispatch(
    x: Tensor,
    weights: DenseWeights,
    strides: tuple[int, int],
    wgmma: bool | None,
    gemv: bool | None,
    options: dict,
) -> Tensor:
    """x (M, G, K) through the kernel `wgmma`, `gemv` and `options` pick."""
    if wgmma and gemv:
        raise ValueError("wgmma=True and gemv=True pick two kernels: pass one of them.")
    if not gemv and options.get("tile_bytes") is not None:
        raise ValueError("tile_bytes is an option of the gemv kernel: pass gemv=True with it.")
    if not wgmma and _takes_gemv(x, weights, gemv, options):
        return _launch_gemv(x, weights, strides, options)
    if _takes_wgmma(x, weights, wgmma, options):
        with recording():
            return gemm_w8a16_wgmma(x, weights, strides, pdl=options.get("pdl", False))
    return _launch(x, weights, strides, options)


def _takes_gemv(x: Tensor, weights: DenseWeights, gemv: bool | None, options: dict) -> bool:
    """Whether x (M, G, K) goes to the CUDA-core kernel: `gemv`, or (None) up to GEMV_MAX_M rows
    where no option is given and K is a whole number of scale blocks."""
    # pdl=None asks for PDL where the GPU has it, which this kernel does not launch with.
    given = sorted(key for key, value in options.items()
                   if (value is not False if key == "pdl" else value is not None))  # fmt: skip
    if gemv is None:
        return not given and x.shape[0] <= GEMV_MAX_M and x.shape[2] % weights.block == 0
    if gemv:
        others = sorted(set(given) - {"block_n", "num_warps", "tile_bytes"})
        if others:
            raise ValueError(f"the gemv W8A16 kernel takes block_n, num_warps and tile_bytes "
                             f"only, and launches without PDL; leave out {others} or pass "
                             f"gemv=False.")  # fmt: skip
        check_gemv(x.shape[0], x.shape[2], weights.block, options.get("block_n"),
                   options.get("num_warps"), options.get("tile_bytes"))  # fmt: skip
    return gemv


def _launch_gemv(
    x: Tensor, weights: DenseWeights, group_strides: tuple[int, int], options: dict
) -> Tensor:
    """The CUDA-core kernel over x (M, G, K) (`w8a16_gemv`)."""
    (m, groups, _), n = x.shape, weights.out_features
    y = x.new_empty(m, groups * n)
    with recording():
        gemm_w8a16_gemv(x, weights.values, weights.scales, weights.block, y, group_strides,
                        options.get("block_n"), options.get("num_warps"),
                        options.get("tile_bytes"))  # fmt: skip
    return y


def _takes_wgmma(x: Tensor, weights: DenseWeights, wgmma: bool | None, options: dict) -> bool:
    """Whether x (M, G, K) goes to the Gluon kernel: `wgmma`, or (None) from WGMMA_MIN_M rows
    where it can run. The Triton kernel's tile options do not apply to it; `pdl` does."""
    given = sorted(key for key, value in options.items() if value is not None and key != "pdl")
    if wgmma is None:
        return (not given and x.shape[0] >= WGMMA_MIN_M
                and check_wgmma_inputs(x, weights, x.shape[1]) is None)  # fmt: skip
    if wgmma and given:
        raise ValueError(f"the wgmma W8A16 kernel takes none of the Triton kernel's options; "
                         f"leave out {given} or pass wgmma=False.")  # fmt: skip
    return wgmma


def _launch(
    x: Tensor, weights: DenseWeights, group_strides: tuple[int, int], options: dict
) -> Tensor:
    """The kernel over x (M, G, K): group g multiplies by the weight `group_strides` (values,
    scales elements) after `weights`."""
    (m, groups, k), n = x.shape, weights.out_features
    tiles = default_tiles(m).override(**options)
    tiles.check()
    splits, k_per_split = split_plan(tiles, m, groups * n, k, x.device)
    tiles_mn = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    y, part, locks = outputs(m, n, tiles_mn, splits, x.dtype, x.device, groups)
    precision, upcast = dot_options(x.dtype)
    grid = (tiles_mn, splits, groups)
    pdl = tiles.launch_pdl(x.device)
    values = weights.values
    prefetch = pdl and prefetchable(values.data_ptr(), values.stride(0), group_strides[0])
    with recording():
        launch(
            _w8a16_kernel, grid, x, weights.values, weights.scales, y, part, locks, m, n, k,
            k_per_split, x.stride(0), x.stride(2), *weights.values.stride(),
            *weights.scales.stride(), y.stride(0), part.stride(0), x.stride(1), *group_strides,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
            SUB_K=tiles.sub_k(weights.block), QBLOCK=weights.block, SPLIT=splits > 1,
            PRECISION=precision, UPCAST=upcast, GROUP=GROUP_M, SWAP=tiles.swap_ab,
            EVEN_K=k % tiles.block_k == 0, PDL=pdl, PREFETCH=prefetch,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=pdl,
        )  # fmt: skip
    return y
