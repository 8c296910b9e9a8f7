"""W8A8 dense GEMM tiles 192 columns wide, for GEMMs whose 128-wide tiles leave the SMs' last
round mostly idle (`w8a8_wgmma`'s kernel otherwise: the same load warp, ring and warpgroups).

At 4,096 rows the shared experts' gate/up projection (N = 2,304) cuts into 288 two-wave tiles
of 256 x 128: 2.2 rounds of the H200's 132 SMs, the third round 18% full. It took 111 us
against DeepGEMM's 70 (ncu/dense-{w8a8-T4096-block128,deepgemm-T4096}-projectionshared_gate_up),
about half the layer's gap to DeepGEMM. DeepGEMM's launch there is a 128 x 192 tile with 4
stages (its kernel's template arguments in that report): 384 tiles, 2.9 rounds.

Tile j (columns 192 j to 192 j + 191) holds one whole 128-wide weight block and half of
another: for even j the whole block, then the next block's first half; for odd j the block
before's second half, then a whole block (`wide_columns`). So a K step is two wgmmas a
warpgroup, 64 x 128 and 64 x 64, each with its own weight scale, and the rescale stays one
FFMA an accumulator element, as in the 128-wide tiles. A single 64 x 192 wgmma with a scale
a column would read the activations once, not twice, but Triton's tensors and shared-memory
allocations take power-of-two sides only (Triton 3.6: "Shape element 1 must be a power of 2").
The load warp (`ring_loads` with `_issue_wide`) copies each step's activations, whole block
and half block into three rings, and each warpgroup stores its two parts through staging
buffers of 64 x 128 and 64 x 64. A slot is 40 KB (16 of activations, 24 of weights) and the
staging 48 KB, so 4 slots fit in sm_90's 227 KB.

A tile is one wave of 128 rows: two waves would need 384 accumulator registers a thread.

Compiled for sm_90 (`scripts/dense_wgmma_sass.py --kernel w8a8-wide`): 168 registers, no
spills, no ptxas notes; a warpgroup's K step is 197 instructions: its 8 wgmmas, one wait, 96
FFMAs and 4 FMULs a thread, 4 scale loads (the kernel's own tiles: 140 for a one-wave 128-wide
tile's 64 x 128, 228 for a two-wave tile's two; 1.6, 1.7 and 1.4 per 100 elements of the
product; the script's "instructions in each innermost MMA loop"). Timed on an H100 (no H200
was lent; raw/logs/h100-dense-w8a8-ring-gemm-times-*.csv): shared_gate_up at 4,096 rows took
0.104 ms against 0.116 in the kernel's own tiles (DeepGEMM 0.086), every other GEMM of the
layer 5-32% longer, which set WIDE_GAIN; `linear_w8a8` takes it by default where
`prefers_wide` says so.
Gluon has no interpreter: the CPU tests check the compiled SASS and the host's checks, the GPU
tests compare results with `w8a8_reference` and with the kernel's own tiles.
"""

import torch
import triton
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.compiled import launch
from kernels.dense.formats import DenseWeights
from kernels.dense.w8a8_tma import BLOCK, check_tma_inputs
from kernels.dense.w8a8_wgmma import (
    MAX_CONSUMER_REGS,
    ROWS,
    TMA_LOAD_REGS,
    _row_scales,
    _tile_of,
    allocate_ring,
    allocate_staging,
    check_device,
    default_block_m,
    descriptor,
    multiply_slot,
    ring_loads,
    ring_stages,
    staging_bytes,
)
from kernels.moe.routing import planned_sms

WIDTH = 192  # a tile's columns: one weight block and half of another
HALF = BLOCK // 2  # the half block's columns
DEFAULT_STAGES = 4  # as many 40 KB slots as fit beside the 48 KB of staging
# How much less rounds-times-area the wide tiles must take to be chosen (`prefers_wide`): a
# one-wave tile does less work a byte of ring than the two-wave tile it replaces. Timed alone
# on an H100 (raw/logs/h100-dense-w8a8-ring-gemm-times-*.csv), each of the layer's GEMMs took
# 1.05 to 1.2 times longer in wide tiles than this area ratio says (shared_gate_up at 4,096
# rows: ratio 0.75, time 0.90; o_b: 1.05 and 1.12), so they pay below about 0.83.
WIDE_GAIN = 0.8
_WIDTH = gl.constexpr(WIDTH)
_BLOCK = gl.constexpr(BLOCK)
_HALF = gl.constexpr(HALF)
_ROWS = gl.constexpr(ROWS)


@gluon.jit
def wide_columns(pid_n):
    """(first column of tile `pid_n`'s whole weight block, first column of its half block): an
    even tile starts at a block and ends half way into the next, an odd one starts half way
    into a block and ends at the end of the next."""
    first = pid_n * _WIDTH
    odd = pid_n % 2
    return first + _HALF * odd, first + _BLOCK * (1 - odd)


@gluon.jit
def _weight_scale(sw_ptr, column, k_step, ok, N, stride_swn, stride_swk):
    """The weight scale of the block holding `column` at K step `k_step` (zero past N, where
    the half block of a last tile may lie)."""
    return gl.load(sw_ptr + (column // _BLOCK) * stride_swn + k_step * stride_swk,
                   mask=ok & (column < N), other=0.0)  # fmt: skip


@gluon.jit
def _issue_wide(a_desc, w_descs, a_ring, w_rings, ready, step, total, a_row, whole, k_step, half,
                scales):  # fmt: skip
    """`ring_loads`' `issue`: start the TMA copies of this program's `step` (if it has one),
    K step `k_step` of the tile whose activation rows start at a_row and whose whole and half
    weight blocks start at rows `whole` and `half`, into its slot of each ring (the row scales
    come from global memory: `scales` is None)."""
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    w_desc, half_desc = w_descs
    w_ring, half_ring = w_rings
    slot = step % SLOTS
    inside = step < total
    bar = ready.index(slot)
    nbytes: gl.constexpr = (a_desc.block_type.nbytes + w_desc.block_type.nbytes
                            + half_desc.block_type.nbytes)  # fmt: skip
    mbarrier.expect(bar, nbytes, pred=inside)
    off_k = k_step * a_desc.block_type.shape[1]
    tma.async_copy_global_to_shared(a_desc, [a_row, off_k], bar, a_ring.index(slot),
                                    pred=inside)  # fmt: skip
    tma.async_copy_global_to_shared(w_desc, [whole, off_k], bar, w_ring.index(slot),
                                    pred=inside)  # fmt: skip
    tma.async_copy_global_to_shared(half_desc, [half, off_k], bar, half_ring.index(slot),
                                    pred=inside)  # fmt: skip


@gluon.jit
def _wide_consumer(a_ring, w_ring, half_ring, y_desc, y_half_desc, y_bufs, y_half_bufs, ready,
                   empty, sa_ptr, sw_ptr, M, N, k_steps, my_tiles, tiles_m, tiles_n, stride_sak,
                   stride_swn, stride_swk, WARPGROUP: gl.constexpr):  # fmt: skip
    """Rows 64 WARPGROUP + [0, 64) of every tile this program owns: per K step, wait for the
    slot's copy, issue the whole block's wgmma and the half block's as one group, load the next
    step's scales while they run, wait for both, release the slot and fold each product into
    its accumulator with its own weight scale (the scales loaded a step before)."""
    WG_ROWS: gl.constexpr = 64
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    whole_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BLOCK, 32]
    )
    half_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _HALF, 32]
    )
    # a wgmma's rows lie in the same threads and registers whatever its width, so the row
    # scales loaded for one product serve the other as they are
    half_rows: gl.constexpr = gl.SliceLayout(1, half_layout)
    whole_rows: gl.constexpr = gl.SliceLayout(1, whole_layout)
    row_offsets = WARPGROUP * WG_ROWS + gl.arange(0, WG_ROWS, layout=whole_rows)
    y_buf = y_bufs.index(WARPGROUP)
    y_half_buf = y_half_bufs.index(WARPGROUP)
    product = gl.zeros((WG_ROWS, _BLOCK), gl.float32, whole_layout)
    half_product = gl.zeros((WG_ROWS, _HALF), gl.float32, half_layout)
    step = 0
    for t in range(my_tiles):
        pid_m, pid_n = _tile_of(gl.program_id(0) + t * gl.num_programs(0), tiles_m, tiles_n)
        whole, half = wide_columns(pid_n)
        rows = pid_m * _ROWS + row_offsets
        sa = _row_scales(sa_ptr, rows, 0, True, M, stride_sak)
        sw = _weight_scale(sw_ptr, whole, 0, True, N, stride_swn, stride_swk)
        h_sw = _weight_scale(sw_ptr, half, 0, True, N, stride_swn, stride_swk)
        acc = gl.zeros((WG_ROWS, _BLOCK), gl.float32, whole_layout)
        h_acc = gl.zeros((WG_ROWS, _HALF), gl.float32, half_layout)
        for k_step in range(k_steps):
            slot = step % SLOTS
            more = k_step + 1 < k_steps
            running = multiply_slot(a_ring, w_ring, ready, slot, step, product, WARPGROUP)
            a_rows = a_ring.index(slot).slice(WARPGROUP * WG_ROWS, WG_ROWS, dim=0)
            h_running = warpgroup_mma(a_rows, half_ring.index(slot).permute((1, 0)),
                                      half_product, use_acc=False, is_async=True)  # fmt: skip
            next_sa = _row_scales(sa_ptr, rows, k_step + 1, more, M, stride_sak)
            next_sw = _weight_scale(sw_ptr, whole, k_step + 1, more, N, stride_swn, stride_swk)
            next_h_sw = _weight_scale(sw_ptr, half, k_step + 1, more, N, stride_swn,
                                      stride_swk)  # fmt: skip
            product, half_product = warpgroup_mma_wait(num_outstanding=0,
                                                       deps=(running, h_running))  # fmt: skip
            mbarrier.arrive(empty.index(slot), count=1)
            acc += product * (sa * sw)[:, None]
            h_sa = gl.convert_layout(sa, half_rows, assert_trivial=True)
            h_acc += half_product * (h_sa * h_sw)[:, None]
            sa, sw, h_sw = next_sa, next_sw, next_h_sw
            step += 1
        first_row = pid_m * _ROWS + WARPGROUP * WG_ROWS
        _store_parts(y_desc, y_half_desc, y_buf, y_half_buf, acc, h_acc, first_row, whole,
                     half)  # fmt: skip
    tma.store_wait(pendings=0)


@gluon.jit
def _store_parts(y_desc, y_half_desc, y_buf, y_half_buf, acc, h_acc, row, whole, half):
    """Store a warpgroup's rows of a tile, the whole block's columns at `whole` and the half
    block's at `half`, by TMA through its two staging buffers, once their previous stores have
    read them: one wait for both (a wait a part would hold the half block's part until the
    whole block's store, just issued, had read its own buffer)."""
    tma.store_wait(pendings=0)
    y_buf.store(acc.to(y_desc.dtype))
    y_half_buf.store(h_acc.to(y_half_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(y_desc, [row, whole], y_buf)
    tma.async_copy_shared_to_global(y_half_desc, [row, half], y_half_buf)


@gluon.jit
def _w8a8_wide_kernel(a_desc, w_desc, half_desc, y_desc, y_half_desc, sa_ptr, sw_ptr, M, N, K,
                      stride_sak, stride_swn, stride_swk, STAGES: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr):  # fmt: skip
    gl.static_assert(a_desc.block_type.shape == [_ROWS, _BLOCK], "a K step of 128 rows a tile")
    gl.static_assert(w_desc.block_type.shape == [_BLOCK, _BLOCK], "the whole block's box")
    gl.static_assert(half_desc.block_type.shape == [_HALF, _BLOCK], "the half block's box")
    gl.static_assert(y_desc.block_type.shape == [_ROWS // 2, _BLOCK], "a warpgroup's whole part")
    gl.static_assert(y_half_desc.block_type.shape == [_ROWS // 2, _HALF],
                     "a warpgroup's half part")  # fmt: skip
    a_ring, w_ring, ready, empty = allocate_ring(a_desc, w_desc, STAGES)
    half_ring = gl.allocate_shared_memory(half_desc.dtype, [STAGES] + half_desc.block_type.shape,
                                          half_desc.layout)  # fmt: skip
    y_bufs = allocate_staging(y_desc)
    y_half_bufs = allocate_staging(y_half_desc)
    tiles_m = gl.cdiv(M, _ROWS)
    tiles_n = gl.cdiv(N, _WIDTH)
    k_steps = gl.cdiv(K, a_desc.block_type.shape[1])
    my_tiles = gl.cdiv(tiles_m * tiles_n - gl.program_id(0), gl.num_programs(0))
    args = (a_ring, w_ring, half_ring, y_desc, y_half_desc, y_bufs, y_half_bufs, ready, empty,
            sa_ptr, sw_ptr, M, N, k_steps, my_tiles, tiles_m, tiles_n, stride_sak, stride_swn,
            stride_swk)  # fmt: skip
    loads = (a_desc, w_desc, half_desc, a_ring, w_ring, half_ring, ready, empty, k_steps,
             my_tiles, tiles_m, tiles_n)  # fmt: skip
    gl.warp_specialize([(_wide_top, args), (_wide_bottom, args), (_wide_loads, loads)], [4, 1],
                       [CONSUMER_REGS, TMA_LOAD_REGS])  # fmt: skip


@gluon.jit
def _wide_top(a_ring, w_ring, half_ring, y_desc, y_half_desc, y_bufs, y_half_bufs, ready, empty,
              sa_ptr, sw_ptr, M, N, k_steps, my_tiles, tiles_m, tiles_n, stride_sak, stride_swn,
              stride_swk):  # fmt: skip
    """Warpgroup 0 (the default partition): each tile's first 64 rows."""
    _wide_consumer(a_ring, w_ring, half_ring, y_desc, y_half_desc, y_bufs, y_half_bufs, ready,
                   empty, sa_ptr, sw_ptr, M, N, k_steps, my_tiles, tiles_m, tiles_n, stride_sak,
                   stride_swn, stride_swk, 0)  # fmt: skip


@gluon.jit
def _wide_bottom(a_ring, w_ring, half_ring, y_desc, y_half_desc, y_bufs, y_half_bufs, ready,
                 empty, sa_ptr, sw_ptr, M, N, k_steps, my_tiles, tiles_m, tiles_n, stride_sak,
                 stride_swn, stride_swk):  # fmt: skip
    """Warpgroup 1 (a worker partition): each tile's last 64 rows."""
    _wide_consumer(a_ring, w_ring, half_ring, y_desc, y_half_desc, y_bufs, y_half_bufs, ready,
                   empty, sa_ptr, sw_ptr, M, N, k_steps, my_tiles, tiles_m, tiles_n, stride_sak,
                   stride_swn, stride_swk, 1)  # fmt: skip


@gluon.jit
def _wide_loads(a_desc, w_desc, half_desc, a_ring, w_ring, half_ring, ready, empty, k_steps,
                my_tiles, tiles_m, tiles_n):  # fmt: skip
    """The load warp over this program's tiles (`ring_loads` with `_issue_wide`)."""
    ring_loads(a_desc, (w_desc, half_desc), a_ring, (w_ring, half_ring), ready, empty, k_steps,
               my_tiles, _wide_rows, (tiles_m, tiles_n, tiles_m * tiles_n - 1),
               _issue_wide)  # fmt: skip


@gluon.jit
def _wide_rows(tile, where):
    """(first activation row, first weight row of the whole block, first weight row of the half
    block) of tile `tile`; past the last tile the cursor stays in bounds."""
    tiles_m, tiles_n, last_tile = where
    pid_m, pid_n = _tile_of(gl.minimum(tile, last_tile), tiles_m, tiles_n)
    whole, half = wide_columns(pid_n)
    return pid_m * _ROWS, whole, half


def prefers_wide(m: int, n: int, sms: int) -> bool:
    """Whether 128 x 192 tiles would take the SMs less time than `w8a8_wgmma`'s own tiles
    (`default_block_m` rows by 128), by rounds of tiles times a tile's area, with a margin
    (WIDE_GAIN) for a one-wave tile's lower rate. Where both fill their last round alike
    (q_up at 4,096 rows, shared_gate_up at 16,384) the rounds tie and the kernel's own stay;
    shared_gate_up at 4,096 (288 two-wave tiles: 3 rounds of 132 SMs, the last 18% full,
    against 384 wide tiles in 3 rounds of 3/4 the area) takes the wide ones."""
    block_m = default_block_m(m, n, BLOCK, sms)
    own = triton.cdiv(triton.cdiv(m, block_m) * triton.cdiv(n, BLOCK), sms) * block_m * BLOCK
    wide = triton.cdiv(triton.cdiv(m, ROWS) * triton.cdiv(n, WIDTH), sms) * ROWS * WIDTH
    return wide <= WIDE_GAIN * own


def wide_descriptors(values: Tensor, weights: Tensor, y: Tensor) -> tuple[TensorDescriptor, ...]:
    """The kernel's five TMA descriptors, in its arguments' order: the activations (M, K) in
    128-row K steps, the FP8 weights (N, K) in whole-block and half-block boxes, and y (M, N)
    in a warpgroup's whole and half parts."""
    return (descriptor(values, [ROWS, BLOCK]), descriptor(weights, [BLOCK, BLOCK]),
            descriptor(weights, [HALF, BLOCK]), descriptor(y, [ROWS // 2, BLOCK]),
            descriptor(y, [ROWS // 2, HALF]))  # fmt: skip


def gemm_w8a8_wide(
    values: Tensor,
    scales: Tensor,
    weights: DenseWeights,
    out_dtype: torch.dtype,
    num_stages: int | None = None,
) -> Tensor:
    """y = (values * scales) @ W.T as `gemm_w8a8_wgmma` computes it (quantised activations
    (M, K) with token-fastest scales, FP8 `weights` in 128x128 blocks), in 128 x 192 tiles;
    `num_stages` the ring's slots (None: DEFAULT_STAGES). Each consumer warpgroup takes the
    most registers setmaxnreg gives beside the load warp (MAX_CONSUMER_REGS): compiled for
    sm_90, 208 spill."""
    check_tma_inputs("wgmma", scales, weights)
    (m, k), n = values.shape, weights.out_features
    slot = (ROWS + WIDTH) * BLOCK  # FP8: a byte each
    num_stages = ring_stages(num_stages, DEFAULT_STAGES, slot, staging_bytes(WIDTH, out_dtype),
                             f"{ROWS} x {WIDTH} tiles")  # fmt: skip
    check_device(values.device)
    y = torch.empty(m, n, dtype=out_dtype, device=values.device)
    tiles = triton.cdiv(m, ROWS) * triton.cdiv(n, WIDTH)
    launch(
        _w8a8_wide_kernel, (min(tiles, planned_sms(values.device)),),
        *wide_descriptors(values, weights.values, y), scales, weights.scales, m, n, k,
        scales.stride(1), *weights.scales.stride(), STAGES=num_stages,
        CONSUMER_REGS=MAX_CONSUMER_REGS, num_warps=4,
    )  # fmt: skip
    return y
