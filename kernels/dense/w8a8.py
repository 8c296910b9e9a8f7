"""W8A8 dense GEMM, y = x @ W.T: activations quantised to FP8 by one Triton kernel, then an FP8
tensor-core GEMM that applies both block scales (what FlashInfer's W8A8 does, in Triton).

Activations get one power-of-two scale per token and K block (the weights' block edge), so
every MMA over one K block has one activation scale per row and one weight scale per column:
the fp32 product of a sub-tile is scaled by their outer product and added to the accumulator.
torch._scaled_mm is not used: on Hopper its block-wise scaling takes 128-wide blocks only, and
the default block here is 32.

With 32-wide blocks the scaling costs two multiplies and an add per accumulator element for
every 32 of K, CUDA-core work the tensor cores wait on, since each product must leave the MMA
before it is scaled; `block=128` quarters it (DeepSeek's 128-wide blocks exist for this reason).
"""

import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch, recording
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
from kernels.dense.w8a8_tma import BLOCK as TMA_BLOCK
from kernels.dense.w8a8_tma import gemm_w8a8_tma
from kernels.dense.w8a8_wgmma import BLOCK_MS as WGMMA_BLOCK_MS
from kernels.dense.w8a8_wgmma import gemm_w8a8_wgmma, supported
from kernels.dense.w8a8_wide import gemm_w8a8_wide, prefers_wide
from kernels.fp8_quant import quantize_activations
from kernels.moe.routing import planned_sms

default_tiles = TilesByM(
    decode=GemmTiles(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4),
    # M=64-256 on the H200 (raw/logs/h200-tune-dense-graphs.csv): 0.135-0.173 ms a layer at
    # 64 x 64 (split-K), 0.230-0.291 at 64 x 128; cuBLAS bf16 0.10-0.125.
    middle=GemmTiles(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=4),
    # 128-wide blocks at M=4096 on the H200 (TMA; raw/logs/h200-tune-dense-graphs.csv): 1.03
    # ms a layer at 128 x 128, 8 warps, 3 stages, two K steps an iteration (paired_k), 1.09
    # one step an iteration, 1.34 at 64 x 128; 128 x 256 and 256 x 128 spill; cuBLAS bf16
    # 1.01-1.04. 32-wide blocks (split-K kernel): 3.2-3.9 ms.
    prefill=GemmTiles(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3),
    middle_up_to=256,
)
# From here 128-block weights take the persistent TMA kernel: on the H200 at M=256 its 128 x 128
# tiles took 0.211 ms a layer against 0.291 for the split-K kernel's (raw/logs/
# h200-tune-dense-graphs.csv); below, the middle tiles split K to fill the SMs. With today's
# middle tiles the split-K kernel ties the TMA kernel's best at 64 rows and leads at 128 and
# 256: 0.139, 0.149 and 0.179 ms a layer, against 0.137, 0.155 and 0.191, and 0.172-0.206 for
# the Gluon kernel's (one run, raw/logs/h200-tune-dense-middle-*.csv); cuBLAS bf16 took
# 0.084-0.108.
TMA_MIN_M = 257
# What the Gluon kernel's tiles are, whatever is asked: waves of 128 rows in two warpgroups of
# 4 warps, one weight block a K step; and it never splits K. Options asking otherwise pick the
# Triton kernels instead (the tile grids of scripts/tune_dense.py keep their meaning).
WGMMA_FIXED = {"block_k": 128, "num_warps": 8, "split_k": None}


@triton.jit
def _w8a8_kernel(
    a_ptr, sa_ptr, w_ptr, sw_ptr, y_ptr, part_ptr, locks_ptr, M, N, K, k_per_split,
    stride_am, stride_sam, stride_wn, stride_wk, stride_swn, stride_swk, stride_ym, stride_ps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_K: tl.constexpr,
    QBLOCK: tl.constexpr, SPLIT: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = program_tile(M, N, BLOCK_M, BLOCK_N, GROUP)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < M
    col_ok = cols < N
    k_lo = tl.program_id(1) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    offs_k = tl.arange(0, SUB_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + (k_lo + offs_k)[None, :]
    w_ptrs = w_ptr + cols[None, :] * stride_wn + (k_lo + offs_k)[:, None] * stride_wk
    sa_ptrs = sa_ptr + rows * stride_sam
    sw_ptrs = sw_ptr + (cols // QBLOCK) * stride_swn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # One scale block per iteration, not a static unroll of the K tile: every product must be
    # rescaled before it joins the accumulator, so unrolled products were all live at once
    # (255 registers and 116 spilled at 128 x 128 tiles on the H200); num_stages prefetches.
    for k_sub in range(k_lo, k_hi, SUB_K):
        k_ok = k_sub + offs_k < K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        block = k_sub // QBLOCK
        sa = tl.load(sa_ptrs + block, mask=row_ok, other=0.0)
        if BLOCK_N <= QBLOCK:  # the tile lies in one weight block: one scale per K block
            sw = tl.load(sw_ptr + (pid_n * BLOCK_N // QBLOCK) * stride_swn + block * stride_swk)
            acc += tl.dot(a, w) * (sa * sw)[:, None]
        else:
            sw = tl.load(sw_ptrs + block * stride_swk, mask=col_ok, other=0.0)
            acc += tl.dot(a, w) * sa[:, None] * sw[None, :]
        a_ptrs += SUB_K
        w_ptrs += SUB_K * stride_wk
    store_tile(y_ptr, part_ptr, locks_ptr, rows, cols, acc, M, N, stride_ym, stride_ps, SPLIT)


def linear_w8a8(
    x: Tensor,
    weights: DenseWeights,
    tma: bool | None = None,
    warp_specialize: bool = False,
    paired_k: bool | None = None,
    wgmma: bool | None = None,
    ring_scales: bool | None = None,
    wide_tiles: bool | None = None,
    staged_weight_scales: bool | None = None,
    **options: int | None,
) -> Tensor:
    """x @ W.T for x (M, K) in bf16 or fp32 and FP8 `weights` (N, K); (M, N) in x's dtype.

    `options` override the GEMM's tiles (block_m, block_n, block_k, num_warps, num_stages,
    split_k); by default they follow M (see `default_tiles`) and split_k fills the GPU. The
    split-K kernel steps through K one scale block at a time, so block_k sets only how K is
    split. `tma` picks the persistent TMA kernel (`w8a8_tma`; None: for 128-wide blocks from
    TMA_MIN_M rows), where `warp_specialize` splits its loop into producer and consumers and
    `paired_k` takes two K steps an iteration (None: where the tile is one weight block wide).
    `wgmma` picks the Gluon kernel (`w8a8_wgmma`: two warpgroups, each rescaling while the
    other's wgmma runs; sm_90 GPUs only, 128-wide blocks; block_m (128 or 256 rows), block_n
    and num_stages apply, block_m and num_stages by default the kernel's own). None: on an
    sm_90 GPU where the TMA kernel would run, unless the options ask for what it fixes
    (WGMMA_FIXED) or for the TMA kernel's own, as it ran 4-8% faster there (raw/logs/
    h200-tune-dense-wgmma-*.csv). `ring_scales` is the Gluon kernel's (`gemm_w8a8_wgmma`: the
    row scales by TMA with each ring slot): asked for where that kernel does not run, it is
    refused, not ignored. `wide_tiles` lets it take 128 x 192 tiles (`w8a8_wide`) where they
    fill the SMs' rounds better than its own (`prefers_wide`), ring_scales then applying to the
    GEMMs left on the kernel's own tiles; not with block_m or block_n, and refused where the
    Gluon kernel does not run. None (the default) turns each on wherever the Gluon kernel runs
    and it can: the row scales where TMA can copy them (M a multiple of 4, or one K block) and
    num_stages is left to the kernel, the wide tiles unless block_m or block_n is set. Both
    together took the layer 4-6% less time at 1,024, 4,096 and 16,384 rows in one A/B run
    (raw/ab-dense-20261205T102702, an H100). `staged_weight_scales` is the Gluon kernel's too
    (`gemm_w8a8_wgmma`: a tile's weight scales in shared memory, loaded a tile ahead; the wide
    tiles' GEMMs load theirs a step ahead still), refused where it does not run, and on
    (None) wherever it runs: 0.98x the layer's time at 4,096 rows and 0.93x at 16,384 in one
    A/B run on the H200 (raw/ab-dense-20261205T125636); the bench with the peers at that
    default has the layer at 0.90x DeepGEMM's speed at both
    (raw/bench-dense-dsv4-flash-tp2-20261205T161823).
    """
    check_linear_inputs(x, weights, "fp8")
    (m, k), n = x.shape, weights.out_features
    tiles = default_tiles(m).override(**options)
    tiles.check()
    if tiles.pdl:
        raise ValueError("pdl=True is a W8A16 option: the W8A8 kernels launch without PDL.")
    if tiles.swap_ab:
        raise ValueError("swap_ab is a W8A16 option; W8A8 multiplies x @ W.T as it is.")
    # a prefill size the persistent kernels take: 128-wide blocks, enough rows, K not split,
    # rows TMA can address (16-byte rows of values and of outputs: the tiny preset's N=82
    # takes the split-K kernel)
    prefill = (weights.block == TMA_BLOCK and m >= TMA_MIN_M and options.get("split_k") is None
               and k % 16 == 0 and n % 8 == 0)  # fmt: skip
    tma_options = tma is not None or warp_specialize or paired_k is not None
    foreign = {key: value for key, value in options.items()
               if value is not None and WGMMA_FIXED.get(key, value) != value}  # fmt: skip
    if options.get("block_m") not in (None, *WGMMA_BLOCK_MS):
        foreign["block_m"] = options["block_m"]
    if wgmma is None:
        wgmma = prefill and not tma_options and not foreign and supported(x.device)
    if ring_scales is None:  # a ring of the stages asked for may leave no room for the scales
        ring_scales = (wgmma and (m % 4 == 0 or k <= weights.block)
                       and options.get("num_stages") is None)  # fmt: skip
    if staged_weight_scales is None:
        staged_weight_scales = wgmma
    tiles_chosen = bool(options.get("block_m") or options.get("block_n"))  # not for wide_tiles
    if wide_tiles is None:
        wide_tiles = wgmma and not tiles_chosen
    gluon_options = (("ring_scales", ring_scales), ("wide_tiles", wide_tiles),
                     ("staged_weight_scales", staged_weight_scales))  # fmt: skip
    for name, asked in gluon_options:
        if asked and not wgmma:  # asked for, it would be ignored: say so
            raise ValueError(
                f"{name}=True is an option of the wgmma kernel, which does not run here: it "
                f"takes {TMA_BLOCK}-wide blocks (got {weights.block}) from {TMA_MIN_M} rows (got "
                f"{m}) on an sm_90 GPU (got {x.device}), without split_k, the TMA kernel's "
                f"options or {sorted(WGMMA_FIXED)} changed; leave {name} out there."
            )
    if wide_tiles and tiles_chosen:
        raise ValueError("wide_tiles=True picks the tiles: leave block_m and block_n out with "
                         "it.")  # fmt: skip
    if wgmma:
        if tma_options or foreign:
            raise ValueError(
                f"the wgmma kernel takes block_m ({WGMMA_BLOCK_MS}), block_n and num_stages "
                f"only ({WGMMA_FIXED} are fixed; "
                f"no tma, warp_specialize, paired_k): leave out {sorted(foreign)} and the TMA "
                "kernel's options, or pass wgmma=False."
            )
        with recording():
            values, scales = quantize_activations(x, weights.block, outer_major=True)
            if wide_tiles and prefers_wide(m, n, planned_sms(x.device)):
                return gemm_w8a8_wide(values, scales, weights, x.dtype,
                                      options.get("num_stages"))  # fmt: skip
            return gemm_w8a8_wgmma(values, scales, weights, x.dtype, tiles.block_n,
                                   options.get("num_stages"), block_m=options.get("block_m"),
                                   ring_scales=ring_scales,
                                   staged_weight_scales=staged_weight_scales)  # fmt: skip
    if tma is None:
        tma = prefill
    if paired_k is None:
        paired_k = tma and tiles.block_n <= TMA_BLOCK
    if (warp_specialize or paired_k) and not tma:
        raise ValueError("warp_specialize and paired_k are options of the TMA kernel: pass "
                         "tma=True (128-wide blocks) or leave them out.")  # fmt: skip
    if tma:
        if weights.block != TMA_BLOCK:  # before any launch, so the error is the block's
            raise ValueError(
                f"the TMA W8A8 kernel takes {TMA_BLOCK}-wide blocks, got {weights.block}; "
                f"quantise with DenseWeights.quantize(w, 'fp8', {TMA_BLOCK}) or pass tma=False."
            )
        with recording():
            values, scales = quantize_activations(x, weights.block, outer_major=True)
            return gemm_w8a8_tma(
                values, scales, weights, x.dtype, tiles.block_m, tiles.block_n,
                tiles.num_warps, tiles.num_stages, GROUP_M, warp_specialize, paired_k,
            )  # fmt: skip
    splits, k_per_split = split_plan(tiles, m, n, k, x.device)
    tiles_mn = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
    y, part, locks = outputs(m, n, tiles_mn, splits, x.dtype, x.device)
    grid = (tiles_mn, splits)
    with recording():
        values, scales = quantize_activations(x, weights.block)
        launch(
            _w8a8_kernel, grid, values, scales, weights.values, weights.scales, y, part, locks,
            m, n, k, k_per_split, values.stride(0), scales.stride(0), *weights.values.stride(),
            *weights.scales.stride(), y.stride(0), part.stride(0), BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n, SUB_K=tiles.sub_k(weights.block),
            QBLOCK=weights.block, SPLIT=splits > 1, GROUP=GROUP_M, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages,
        )  # fmt: skip
    return y
