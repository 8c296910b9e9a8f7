"""W8A16 dense GEMM for middle sizes in Gluon: the weights go from shared memory through the
registers into bf16 wgmma, the activations by TMA.

The Triton W8A16 kernel (`w8a16.py`) stays below cuBLAS bf16 from 64 to 256 rows: Nsight
Compute found its swapped 128-row tile latency-bound at about ten instructions a weight value
(cp.async predicates recomputed for every copy, the FP8 values converted through fp16 and fp32,
two blocks an SM). This kernel computes the same y.T = W @ x.T tile by tile, with:
- TMA copies of the FP8 weight tile and the bf16 activation tile into a ring of slots, so the
  warps do no address arithmetic for them;
- the weights as wgmma's first operand, read from registers: each warpgroup loads its 64 rows
  of the slot from shared memory, turns them into bf16 by bit manipulation (`kernels.dequant`)
  and multiplies them by the block's power-of-two scale (exact), so one accumulator runs
  through every wgmma and the next step's conversion overlaps this step's wgmma. The weights
  lie in the K order of `k_order` (a copy made on first use), in which a thread's 64 bytes of
  a step are four 16-byte shared loads; in nn.Linear's order they were 32 two-byte loads;
- the activations as the second operand, straight from their slot (the K-major transposed
  view wgmma reads for 16-bit types).

As in `w8a8_wgmma`, the two warpgroups are two partitions (`gl.warp_specialize`) that share only
the ring's barriers: each releases a slot once its wgmma has read it, and warpgroup 0 refills
the slot `LAG` steps behind. Narrow projections split K (grid axis 2, with the group's member)
as the Triton kernels do: each split adds its fp32 partial tile into sums kept at zero (L2
atomics), counts its arrival (a count a warpgroup tile), and the last to arrive writes the tile
from the sums and zeroes them. The additions' order is the order the splits arrive in, so a
split GEMM's output can differ in its last bits from one run to the next (the Triton kernels'
partials are summed in split order). A tile's result leaves through a staging buffer by TMA,
which clips rows and columns past the output's edge.

It takes DeepSeek's 128 x 128 weight blocks only: a tile's 128 weight rows then lie in one
block, so a K step of 128 has one scale. Gluon has no interpreter: the CPU tests check the
compiled SASS and the host checks, the GPU tests compare it with the dequantised product.

The W8A16 kernel from `w8a16.WGMMA_MIN_M` rows. On the H200 a layer took 0.095 ms at 48 rows
against the Triton kernel's 0.110, 0.159 against 0.262 at 256 and 1.36 against 2.13 at 4096
(raw/logs/h200-dense-w8a16-gluon-times-de08917-*.csv). With 64-deep K steps (64-byte weight
rows a TMA box) it had lost below 128 rows; Nsight Compute on q_up at 64 rows then had DRAM
23% busy and the warps waiting mostly for a slot's copy (raw/logs/h200-ncu-w8a16-gluon-qup-
m64-*). Where it still trails cuBLAS bf16 is the projections whose K it splits.

A program's weight scales sit in shared memory, loaded once (`_staged_scales`): loaded a few
steps ahead from global memory, they had held 16-17% of the warps' samples at 64 rows, and the
layer took 4-5% less time at 48-64 rows and 1-3% at 96-256 without them
(raw/logs/h200-dense-w8a16-staged-scales-ab-*.csv). A stream plan for GEMMs with more tiles
than SMs (whole tiles back to back, then shares of the tiles left over) did not pay: the kernel
rebuilt for it was 5-11% slower on the split plan, and a program's K steps, not idle SMs, set
the pace (raw/logs/h200-dense-w8a16-stream-plan-ab-*.csv, commit 8bde645).

With `pdl` (off by default) it launches with programmatic dependent launch (`kernels.pdl`):
a program copies its first ring slot's weights and loads its scales, waits for the grid
before, then copies the rest. On the H200 the layer's GEMMs back to back took 9-12% less
time at 48-128 rows and 4% at 256, but a served decode step at 64 rows 1.7% more
(raw/logs/h200-dense-w8a16-gluon-pdl-early-ab-*.csv, raw/ab-profile-20261204T212709).
Without PDL its first copies come in the same order (the scales asked for before the ring's
copies): in that run each GEMM alone, where PDL overlaps nothing, took 2.6-3.5% less time
summed over a layer at 48-128 rows in that order. Timed as the default against the kernels
before it, in turns (raw/ab-dense-20261205T020049), a layer's GEMMs took 0.959x, 0.963x and
0.984x the time at 48, 64 and 128 rows (docs/design.md).
"""

from collections.abc import Sequence

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

from kernels.compiled import launch
from kernels.dense.formats import DenseWeights, check_group_inputs, check_linear_inputs
from kernels.dense.k_order import SLICE, has_reordered, reordered
from kernels.dense.tiles import arrival_counters, kept_sums
from kernels.dense.w8a8_wgmma import (
    FLAT_SHARED,
    SHARED_MEMORY,
    WARPGROUP_VECTOR,
    allocate_ring,
    allocate_staging,
    descriptor,
    released_slot,
    staged_scale,
    supported,
    threads_barrier,
)
from kernels.dequant import E4M3_BITS_SCALE, E4M3_TO_BF16_PTX
from kernels.moe.routing import planned_sms
from kernels.pdl import check_option as check_pdl_option
from kernels.pdl import launches_with_pdl, let_next_grid_launch, wait_for_grid_before

ROWS = 128  # weight rows a tile: two warpgroups of wgmma's 64
WG_ROWS = 64
BLOCK = 128  # the weight block this kernel takes
BLOCK_K = 128  # a K step: one scale block; 128-byte weight rows (the activations in two TMA boxes)
BLOCK_TS = (64, 128)  # token columns a tile (wgmma's N); at 256, ptxas serialises (C7512)
MAX_STAGES = 8
SPLIT_FILL = 1.0  # programs an SM the automatic splits of K aim for, by default (`tile_plan`)
MIN_SPLIT_STEPS = 8  # K steps a split takes at least, by default
# Both were chosen when splits stored partial tiles; with the splits' L2 atomic sums they still
# won (raw/logs/h200-dense-w8a16-split-settings-atomic-sums-*.csv: 0.0860 ms a layer at 64 rows
# against 0.0877-0.0880 with splits of 2 or 4 steps, 0.1053 against 0.1072-0.1139 at 128).
# Ring slots whose weights are copied before the scales are loaded and the other copies start
# (with PDL, before the wait for the grid before): see the kernel's first lines.
EARLY_SLOTS = 1
MAX_SCALE_STEPS = 256  # K steps a split may have: its scales are kept in shared memory
_SCALE_BLOCK = gl.constexpr(BLOCK)  # the kernel's view of BLOCK
# A warpgroup's 64 x 128 weights of a K step as they lie in the slot (`k_order`): a thread's
# first 16 registers are one row's 16 contiguous bytes (one 16-byte load), lanes c = 0-3 take
# the row's four 16-byte pieces of each 64-wide slice, lanes 4-31 and the warps the rows.
_STORED = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [8, 0], [0, 64]],
    lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[WG_ROWS, BLOCK_K]))  # fmt: skip


@gluon.jit
def _e4m3_as_bf16(w8):
    """`kernels.dequant.e4m3_as_bf16` for Gluon tensors: the value times 2**-120 in bf16, four
    values from each 32-bit register the 16-byte loads fill."""
    return gl.inline_asm_elementwise(
        E4M3_TO_BF16_PTX,
        "=r,=r,r",
        [w8.to(gl.uint8, bitcast=True)],
        dtype=gl.bfloat16,
        is_pure=True,
        pack=4,
    )


@gluon.jit
def _load_step(x_desc, w_desc, x_ring, w_ring, ready, step, steps, t_row, w_row, x_col, k_lo):
    """Start the TMA copies of K step `step` of this program's range (if it has one) into its
    ring slot: activations from column x_col, weights from row w_row."""
    _expect_step(x_desc, w_desc, ready, step, steps)
    _load_activations(x_desc, x_ring, ready, step, steps, t_row, x_col, k_lo)
    _load_weights(w_desc, w_ring, ready, step, steps, w_row, k_lo)


@gluon.jit
def _expect_step(x_desc, w_desc, ready, step, steps):
    """Tell the slot's barrier to expect the bytes of both copies of K step `step`."""
    SLOTS: gl.constexpr = ready.type.shape[0]
    mbarrier.expect(ready.index(step % SLOTS), x_desc.block_type.nbytes + w_desc.block_type.nbytes,
                    pred=step < steps)  # fmt: skip


@gluon.jit
def _load_activations(x_desc, x_ring, ready, step, steps, t_row, x_col, k_lo):
    """The activations' copy of K step `step` (`_load_step`)."""
    SLOTS: gl.constexpr = x_ring.type.shape[0]
    slot = step % SLOTS
    k = (k_lo + step) * x_desc.block_type.shape[1]
    tma.async_copy_global_to_shared(x_desc, [t_row, x_col + k], ready.index(slot),
                                    x_ring.index(slot), pred=step < steps)  # fmt: skip


@gluon.jit
def _load_weights(w_desc, w_ring, ready, step, steps, w_row, k_lo):
    """The weights' copy of K step `step` (`_load_step`)."""
    SLOTS: gl.constexpr = w_ring.type.shape[0]
    slot = step % SLOTS
    k = (k_lo + step) * w_desc.block_type.shape[1]
    tma.async_copy_global_to_shared(w_desc, [w_row, k], ready.index(slot), w_ring.index(slot),
                                    pred=step < steps)  # fmt: skip


@gluon.jit
def _in_k_order(w, a_layout: gl.constexpr):
    """The weights `w` (64, 128), loaded in the stored order of `k_order`, relabelled in K's
    order as wgmma's register operand. Each thread keeps its values: the reshapes and the
    permute only rename its registers, and the layout they leave is `a_layout` up to the order
    of a thread's register pairs, which `convert_layout` renames too: no data moves (compiled
    for sm_90 by Triton 3.6, the kernel's shared stores stayed the output's staging ones)."""
    gl.static_assert(w.shape[1] == 2 * 64, "two 64-wide slices of K a step")
    # stored column (q, c, j, h, b) -> K index (q, j, h, c, b); see k_order
    w = w.reshape([w.shape[0], 2, 4, 4, 2, 2]).permute((0, 1, 3, 4, 2, 5))
    return gl.convert_layout(w.reshape([w.shape[0], 128]), a_layout)


@gluon.jit
def _tile_range(K, steps_per_split, splits, BLOCK_K: gl.constexpr):
    """(first K step, K steps) of this program's split of K."""
    k_lo = (gl.program_id(2) % splits) * steps_per_split
    return k_lo, gl.minimum(steps_per_split, gl.cdiv(K, BLOCK_K) - k_lo)


@gluon.jit
def _step(x_desc, w_desc, x_ring, w_ring, acc, w_before, i, ready, empty, scale_buf, steps,
          k_lo, t_row, w_row, x_col, LAG: gl.constexpr, WARPGROUP: gl.constexpr,
          FIRST: gl.constexpr):  # fmt: skip
    """K step i of a warpgroup: (the accumulator with its wgmma in flight, the weights in
    registers that wgmma reads).

    Wait for the slot's copy, load this warpgroup's weight rows from it in wgmma's register
    layout, convert and scale them, issue the wgmma and wait for the step before's (one stays
    in flight, so the next step's conversion overlaps it); release that step's slot and
    (warpgroup 0) refill the slot used LAG steps before once both have released it. The
    step's scale comes from shared memory (`_staged_scales`). The FIRST step starts the
    accumulator (use_acc=False), so no instruction but a wgmma writes it while one is in
    flight (else ptxas serialises them, C7515).

    A wgmma in flight reads its register operand until it is waited for, and nothing tells
    the compiler: the step before's weights (`w_before`) go into this step's wait as a
    dependency, so their registers stay theirs until that wgmma is done (the caller unrolls
    the loop so that no copy moves them)."""
    WG_ROWS: gl.constexpr = w_desc.block_type.shape[0] // 2
    SLOTS: gl.constexpr = x_ring.type.shape[0]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout,
                                                 k_width=2)  # fmt: skip
    slot = i % SLOTS
    mbarrier.wait(ready.index(slot), (i // SLOTS) & 1)
    w8 = w_ring.index(slot).slice(WARPGROUP * WG_ROWS, WG_ROWS, dim=0).load(_STORED)
    sw = staged_scale(scale_buf, i)
    w = _in_k_order(_e4m3_as_bf16(w8) * (sw * E4M3_BITS_SCALE).to(gl.bfloat16), a_layout)
    acc = warpgroup_mma(w, x_ring.index(slot).permute((1, 0)), acc, use_acc=not FIRST,
                        is_async=True)  # fmt: skip
    if FIRST:
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    else:
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w_before))[0]
        # the step before's wgmma is done: its slot may be refilled
        mbarrier.arrive(empty.index((i - 1) % SLOTS), count=1)
    if WARPGROUP == 0 and i >= LAG:
        _load_step(x_desc, w_desc, x_ring, w_ring, ready, released_slot(empty, i, LAG), steps,
                   t_row, w_row, x_col, k_lo)  # fmt: skip
    return acc, w


@gluon.jit
def _program_scales(s_ptr, group, k_lo, steps, stride_sn, stride_sk, stride_sg,
                    SCALE_STEPS: gl.constexpr):  # fmt: skip
    """The loads of this program's weight scales, one a K step of its split (a K step is one
    scale block wide, a tile's rows one block high), for `_staged_scales`."""
    scales = s_ptr + group * stride_sg + gl.program_id(0) * stride_sn  # a tile's rows: one block
    step = gl.arange(0, SCALE_STEPS, layout=WARPGROUP_VECTOR)
    return gl.load(scales + (k_lo + step) * stride_sk, mask=step < steps, other=0.0)


@gluon.jit
def _staged_scales(values):
    """The program's scales (`_program_scales`) in shared memory, where each K step reads its
    own with one broadcast load. The store waits for the loads, so the kernel issues it after
    its first copies.

    Why: loaded a few steps ahead from global memory, a step's scale still held it up, 16-17%
    of the warps' samples (Nsight Compute on q_up and o_b at 64 rows,
    `ncu/dense-w8a16-T64-projection*`): the loop's queue of scales moved each load's register
    two steps after it was issued, which waited for the load."""
    buf = gl.allocate_shared_memory(gl.float32, values.shape, FLAT_SHARED)
    buf.store(values)
    return buf  # a step's scale: `staged_scale`


@gluon.jit
def _consumer(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf,
              sums_ptr, locks_ptr, M, N, K, steps_per_split, splits, LAG: gl.constexpr,
              SPLIT: gl.constexpr, WARPGROUP: gl.constexpr):  # fmt: skip
    """Weight rows 64 WARPGROUP + [0, 64) of this program's tile, over its split of K (at
    least one step: the host plans no empty split)."""
    BLOCK_T: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    ROWS: gl.constexpr = w_desc.block_type.shape[0]
    WG_ROWS: gl.constexpr = ROWS // 2
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16]
    )
    group = gl.program_id(2) // splits
    k_lo, steps = _tile_range(K, steps_per_split, splits, BLOCK_K)
    t_row = gl.program_id(1) * BLOCK_T
    w_row = group * N + gl.program_id(0) * ROWS
    gl.static_assert(BLOCK_K == _SCALE_BLOCK, "a K step is one scale block")
    gl.static_assert(ROWS == _SCALE_BLOCK, "a tile's rows are one scale block")
    acc = gl.zeros((WG_ROWS, BLOCK_T), gl.float32, layout)
    step_args = (ready, empty, scale_buf, steps, k_lo, t_row, w_row, group * K)
    acc, w_b = _step(x_desc, w_desc, x_ring, w_ring, acc, None, 0, *step_args, LAG, WARPGROUP,
                     True)  # fmt: skip
    # Two steps an iteration, so each step's weights keep their registers through the loop:
    # with one, the loop-carried weights were copied at the back edge and the next step's
    # conversion wrote the registers the wgmma in flight was reading.
    for i in range(1, steps - 1, 2):
        acc, w_a = _step(x_desc, w_desc, x_ring, w_ring, acc, w_b, i, *step_args, LAG,
                         WARPGROUP, False)  # fmt: skip
        acc, w_b = _step(x_desc, w_desc, x_ring, w_ring, acc, w_a, i + 1, *step_args, LAG,
                         WARPGROUP, False)  # fmt: skip
    if steps % 2 == 0:  # one step left
        acc, w_a = _step(x_desc, w_desc, x_ring, w_ring, acc, w_b, steps - 1, *step_args, LAG,
                         WARPGROUP, False)  # fmt: skip
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w_a))[0]
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w_b))[0]
    y_buf = y_bufs.index(WARPGROUP)
    rows = gl.program_id(0) * ROWS + WARPGROUP * WG_ROWS  # the first weight row, in its member
    if SPLIT:
        # The sums (G, N, M), zero between GEMMs: a thread's two neighbouring tokens are 8 bytes
        n = rows + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, layout))
        t = t_row + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, layout))
        inside = (n < N)[:, None] & (t < M)[None, :]
        sums = sums_ptr + group.to(gl.int64) * N * M + n.to(gl.int64)[:, None] * M + t[None, :]
        gl.atomic_add(sums, acc, mask=inside, sem="relaxed")  # added in L2; no value comes back
        threads_barrier()  # every thread's sums before the count (acq_rel releases them)
        tile = (group * gl.num_programs(0) + gl.program_id(0)) * gl.num_programs(1)
        lock = locks_ptr + (tile + gl.program_id(1)) * 2 + WARPGROUP
        if gl.atomic_add(lock, 1, sem="acq_rel") == splits - 1:
            total = gl.load(sums, mask=inside, other=0.0, cache_modifier=".cg")
            gl.store(sums, gl.zeros_like(acc), mask=inside)  # zero for the next split GEMM
            _store(y_desc, y_buf, total, t_row, group * N + rows)
            gl.atomic_xchg(lock, 0)
    else:
        _store(y_desc, y_buf, acc, t_row, group * N + rows)


@gluon.jit
def _store(y_desc, y_buf, acc, t_row, column):
    """y[t_row + t, column + n] = acc[n, t] in y's dtype, through the staging buffer by TMA."""
    y_buf.store(gl.permute(acc.to(y_desc.dtype), (1, 0)))
    fence_async_shared()
    tma.async_copy_shared_to_global(y_desc, [t_row, column], y_buf)
    tma.store_wait(pendings=0)


@gluon.jit
def _w8a16_wgmma_kernel(
    x_desc, w_desc, y_desc, s_ptr, sums_ptr, locks_ptr, M, N, K, steps_per_split, splits,
    stride_sn, stride_sk, stride_sg, STAGES: gl.constexpr, LAG: gl.constexpr,
    SPLIT: gl.constexpr, CONSUMER_REGS: gl.constexpr, SCALE_STEPS: gl.constexpr,
    PDL: gl.constexpr, EARLY: gl.constexpr,
):  # fmt: skip
    BLOCK_T: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    ROWS: gl.constexpr = w_desc.block_type.shape[0]
    x_ring, w_ring, ready, empty = allocate_ring(x_desc, w_desc, STAGES)
    y_bufs = allocate_staging(y_desc)
    group = gl.program_id(2) // splits
    k_lo, steps = _tile_range(K, steps_per_split, splits, BLOCK_K)
    t_row = gl.program_id(1) * BLOCK_T
    w_row = group * N + gl.program_id(0) * ROWS
    # The first EARLY slots' weights, then the scales, then the rest: with PDL the first two do
    # not depend on the grid before and are issued before the wait for it (the activations may
    # depend on it). Without PDL the order is the same (compiled for sm_90, ptxas puts the
    # scales' load ahead of the first copy in both). With the scales' loads behind every
    # slot's copies, the warps waited for them at the start (16% of q_up's samples at 64 rows,
    # ncu/dense-w8a16-staged-scales-T64-projectionq_up), and in one run on the H200 the PDL
    # kernel, alone (nothing to overlap), took 2.6%, 3.5% and 3.2% less time than this path
    # did then, summed over a layer at 48, 64 and 128 rows, and no less at 256
    # (raw/logs/h200-dense-w8a16-gluon-pdl-early-ab-*, round 0, timed one after the other, not
    # in turns); as the default, in turns against that code, a layer's GEMMs took 0.959x,
    # 0.963x and 0.984x the time at 48, 64 and 128 rows (raw/ab-dense-20261205T020049).
    # With every slot's weights first, a GEMM alone took 0.1-1.9 us longer
    # (raw/logs/h200-dense-w8a16-gluon-pdl-ab-*): its activations queued behind them.
    for first in gl.static_range(EARLY):
        _expect_step(x_desc, w_desc, ready, first, steps)
        _load_weights(w_desc, w_ring, ready, first, steps, w_row, k_lo)
    scales = _program_scales(s_ptr, group, k_lo, steps, stride_sn, stride_sk, stride_sg,
                             SCALE_STEPS)  # fmt: skip
    if PDL:
        wait_for_grid_before()
    for first in gl.static_range(EARLY):
        _load_activations(x_desc, x_ring, ready, first, steps, t_row, group * K, k_lo)
    for first in gl.static_range(EARLY, STAGES):
        _load_step(x_desc, w_desc, x_ring, w_ring, ready, first, steps, t_row, w_row, group * K,
                   k_lo)  # fmt: skip
    if PDL:
        let_next_grid_launch()  # all programs resident: the next grid may take the SMs left
    scale_buf = _staged_scales(scales)
    threads_barrier()  # the scales in shared memory before either warpgroup reads them
    args = (
        x_desc,
        w_desc,
        y_desc,
        x_ring,
        w_ring,
        y_bufs,
        ready,
        empty,
        scale_buf,
        sums_ptr,
        locks_ptr,
        M,
        N,
        K,
        steps_per_split,
        splits,
        LAG,
    )
    if SPLIT:
        gl.warp_specialize([(_top_rows_split, args), (_bottom_rows_split, args)], [4],
                           [CONSUMER_REGS])  # fmt: skip
    else:
        gl.warp_specialize([(_top_rows, args), (_bottom_rows, args)], [4], [CONSUMER_REGS])


@gluon.jit
def _top_rows(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf, sums_ptr,
              locks_ptr, M, N, K, steps_per_split, splits, LAG: gl.constexpr):  # fmt: skip
    """Warpgroup 0 (the default partition): the tile's first 64 weight rows, and the refills."""
    _consumer(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf, sums_ptr,
              locks_ptr, M, N, K, steps_per_split, splits, LAG, False, 0)  # fmt: skip


@gluon.jit
def _bottom_rows(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf, sums_ptr,
                 locks_ptr, M, N, K, steps_per_split, splits, LAG: gl.constexpr):  # fmt: skip
    """Warpgroup 1 (the worker partition): the tile's last 64 weight rows."""
    _consumer(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf, sums_ptr,
              locks_ptr, M, N, K, steps_per_split, splits, LAG, False, 1)  # fmt: skip


@gluon.jit
def _top_rows_split(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf,
                    sums_ptr, locks_ptr, M, N, K, steps_per_split, splits,
                    LAG: gl.constexpr):  # fmt: skip
    """`_top_rows` of a split K (partition arguments lose constexpr-ness, hence four)."""
    _consumer(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf, sums_ptr,
              locks_ptr, M, N, K, steps_per_split, splits, LAG, True, 0)  # fmt: skip


@gluon.jit
def _bottom_rows_split(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf,
                       sums_ptr, locks_ptr, M, N, K, steps_per_split, splits,
                       LAG: gl.constexpr):  # fmt: skip
    """`_bottom_rows` of a split K."""
    _consumer(x_desc, w_desc, y_desc, x_ring, w_ring, y_bufs, ready, empty, scale_buf, sums_ptr,
              locks_ptr, M, N, K, steps_per_split, splits, LAG, True, 1)  # fmt: skip


def default_stages(block_t: int) -> int:
    """As many ring slots as shared memory holds beside the staging buffers, up to MAX_STAGES."""
    return min(MAX_STAGES, (SHARED_MEMORY - _beside_ring_bytes(block_t)) // _slot_bytes(block_t))


def split_count(tiles: int, k_steps: int, sms: int, fill: float = SPLIT_FILL,
                min_steps: int = MIN_SPLIT_STEPS) -> int:  # fmt: skip
    """Splits of K for about `fill` programs an SM, in one round at most (programs past the
    SMs would wait for a second), each split at least `min_steps` K steps. Fixed splits of 4
    and 8 (raw/logs/h200-dense-w8a16-gluon-times-*.csv) took two rounds where they were
    slower, and splits of fewer steps cost more than they gave: at M=128 a layer took 0.134
    ms with splits of 4 steps or more against 0.124 with 8."""
    want = min(round(fill * sms / tiles), sms // tiles)
    return max(1, min(want, k_steps // min_steps))


def tile_plan(m: int, row_tiles: int, k_steps: int, sms: int, fill: float = SPLIT_FILL,
              min_steps: int = MIN_SPLIT_STEPS) -> tuple[int, int]:  # fmt: skip
    """(token columns a tile, splits of K) for M tokens over `row_tiles` tiles of weight rows
    (the group's members included) and `k_steps` K steps: one 64-token tile up to 64 rows;
    above, the width of 64 or 128 whose tiles, split by `split_count`, take the fewest rounds
    of the SMs, then give the most programs, then the narrower.

    Why: the GEMMs of a layer at 65-256 rows have few tiles of 128 weight rows (shared_down's
    40, qkv_a's 16), so one 128-token tile per row tile leaves SMs idle, and splitting K fills
    them at the price of partial sums. On the H200, in one run of
    raw/logs/h200-dense-w8a16-split-fill-7eb570a-20261202T1750.csv, 64-token tiles took o_a,
    qkv_a, shared_down and shared_gate_up at M=128 from 0.0244, 0.0239, 0.0131 and 0.0245 ms
    to 0.0205, 0.0184, 0.0115 and 0.0197, while q_up (192 row tiles, two rounds at 128 tokens)
    took 0.0310 against 0.0255; aiming the splits at one program an SM rather than half took a
    layer from 0.0961 to 0.0943 ms at M=64 and 0.1560 to 0.1488 at 256 (0.1238 and 0.1243 at
    128). With the plan, bench dense had the layer at 0.86x, 0.80x and 0.79x cuBLAS bf16 at
    64, 128 and 256 rows (raw/bench-dense-dsv4-flash-tp2-20261202T181217; 0.85x, 0.71x and
    0.70x in ...T150805 before it)."""
    if m <= BLOCK_TS[0]:
        return BLOCK_TS[0], split_count(row_tiles, k_steps, sms, fill, min_steps)

    def plan(block_t: int) -> tuple[int, int, int]:
        tiles = row_tiles * triton.cdiv(m, block_t)
        programs = tiles * split_count(tiles, k_steps, sms, fill, min_steps)
        return triton.cdiv(programs, sms), -programs, block_t

    block_t = min(BLOCK_TS, key=plan)
    tiles = row_tiles * triton.cdiv(m, block_t)
    return block_t, split_count(tiles, k_steps, sms, fill, min_steps)


def scale_steps(steps_per_split: int) -> int:
    """The shared-memory slots for a split's scales (`_staged_scales`): a power of two, at
    least 16, so that splits of 1 to 16 K steps share one compiled kernel."""
    return max(16, triton.next_power_of_2(steps_per_split))


def _slot_bytes(block_t: int) -> int:
    return block_t * BLOCK_K * 2 + ROWS * BLOCK_K  # bf16 activations, FP8 weights


def _beside_ring_bytes(block_t: int) -> int:
    """A bf16 output tile a warpgroup, and the split's scales (`_staged_scales`)."""
    return 2 * block_t * WG_ROWS * 2 + MAX_SCALE_STEPS * 4


def check_wgmma_inputs(x: Tensor, weights: DenseWeights, groups: int) -> str | None:
    """Why this kernel cannot take x (M, G, K) and `weights`, or None if it can."""
    (_, _, k), n = x.shape, weights.out_features
    if weights.block != BLOCK:
        return f"it takes 128 x 128 weight blocks, not {weights.block}"
    if x.dtype != torch.bfloat16:
        return f"it takes bf16 activations, not {x.dtype}"
    if x.stride(2) != 1 or (groups > 1 and x.stride(1) != k):
        return "the activations' members must be contiguous in each row"
    if k % SLICE:
        return f"its weights' K order (kernels.dense.k_order) needs K a multiple of {SLICE}"
    if x.stride(0) % 8 or x.data_ptr() % 16 or (groups * n) % 8:
        return "TMA needs 16-byte aligned rows (N a multiple of 8)"
    if groups > 1 and (n % ROWS or k % BLOCK_K):
        return f"a group needs N a multiple of {ROWS} and K of {BLOCK_K}"
    if k > MAX_SCALE_STEPS * BLOCK_K:
        return f"it keeps a program's scales in shared memory, K up to {MAX_SCALE_STEPS * BLOCK_K}"
    if not supported(x.device):
        return f"it needs an sm_90 (Hopper) GPU, got {x.device}"
    return None


def gemm_w8a16_wgmma(
    x: Tensor,
    weights: DenseWeights,
    group_strides: tuple[int, int] = (0, 0),
    block_t: int | None = None,
    num_stages: int | None = None,
    split_k: int | None = None,
    refill_lag: int | None = None,
    consumer_regs: int = 232,
    split_fill: float = SPLIT_FILL,
    min_split_steps: int = MIN_SPLIT_STEPS,
    pdl: bool | None = False,
) -> Tensor:
    """cat_g(x[:, g] @ W_g.T) for bf16 x (M, G, K) and G FP8 weights from `weights` on, member g
    `group_strides` (values, scales elements) after the first; (M, G * N) in bf16.

    `block_t` is a tile's token columns and `split_k` the splits of K (None: `tile_plan`'s,
    which aims at `split_fill` programs an SM with splits of `min_split_steps` K steps or more),
    `num_stages` the ring's slots (None: `default_stages`), `refill_lag` the K steps between a
    slot's use and its refill (None: 2 with six slots or more, else 1), `consumer_regs` the
    registers Triton asks for each warpgroup (setmaxnreg), `pdl` whether it launches with
    programmatic dependent launch (`kernels.pdl`; None: where the GPU has it): its programs
    then start copying their first EARLY_SLOTS ring slots' weights and load their scales
    while the grid before finishes, and let the next grid launch once all of them are resident
    (not on a weight's first call, whose K-ordered copy the grid before makes)."""
    (m, groups, k), n = x.shape, weights.out_features
    if not (split_fill > 0 and isinstance(min_split_steps, int) and min_split_steps >= 1):
        raise ValueError(f"split_fill={split_fill!r} must be above 0 and min_split_steps="
                         f"{min_split_steps!r} an integer >= 1.")  # fmt: skip
    row_tiles = triton.cdiv(n, ROWS) * groups
    k_steps = triton.cdiv(k, BLOCK_K)
    sms = planned_sms(x.device)
    if block_t is None:
        block_t = tile_plan(m, row_tiles, k_steps, sms, split_fill, min_split_steps)[0]
    if block_t not in BLOCK_TS:
        raise ValueError(f"block_t must be one of {BLOCK_TS} (wgmma's N), got {block_t}.")
    num_stages = default_stages(block_t) if num_stages is None else num_stages
    used = num_stages * _slot_bytes(block_t) + _beside_ring_bytes(block_t)
    if used > SHARED_MEMORY:
        raise ValueError(f"num_stages={num_stages} with {block_t}-token tiles needs {used // 1024} "
                         f"KB of shared memory, more than sm_90's {SHARED_MEMORY // 1024} KB; use "
                         f"num_stages <= {default_stages(block_t)}.")  # fmt: skip
    refill_lag = (2 if num_stages >= 6 else 1) if refill_lag is None else refill_lag
    if not 1 <= refill_lag < num_stages:
        raise ValueError(f"refill_lag must be at least 1 and below num_stages={num_stages}, got "
                         f"{refill_lag}.")  # fmt: skip
    check_pdl_option(pdl)
    if split_k is not None and (not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"split_k={split_k!r} must be an integer >= 1; 1 means no split.")
    why = check_wgmma_inputs(x, weights, groups)
    if why is not None:
        raise ValueError(f"the wgmma W8A16 kernel cannot run this GEMM: {why}; call "
                         "linear_w8a16, which takes the Triton kernel then.")  # fmt: skip
    tiles = row_tiles * triton.cdiv(m, block_t)
    splits = (split_count(tiles, k_steps, sms, split_fill, min_split_steps) if split_k is None
              else split_k)  # fmt: skip
    per_split = triton.cdiv(k_steps, min(splits, k_steps))
    splits = triton.cdiv(k_steps, per_split)
    y = torch.empty(m, groups * n, dtype=x.dtype, device=x.device)
    sums, locks = y, y
    if splits > 1:
        sums, locks = kept_sums(groups * n * m, x.device), arrival_counters(2 * tiles, x.device)
    x_2d = x.as_strided((m, groups * k), (x.stride(0), 1))
    if groups > 1 and group_strides[0] != n * k:
        raise ValueError("a group's FP8 values must lie one after another (torch.stack); build "
                         "them with DenseWeights.quantize_group.")  # fmt: skip
    # With PDL the weights are read before the wait for the grid before, so they must not be
    # that grid's output, as the K-ordered copy made on a weight's first use is.
    with_pdl = launches_with_pdl(pdl, x.device) and has_reordered(weights.values, groups * n)
    w_2d = reordered(weights.values, groups * n)  # after the check: a copy of what it reads
    grid = (triton.cdiv(n, ROWS), triton.cdiv(m, block_t), splits * groups)
    launch(
        _w8a16_wgmma_kernel, grid, descriptor(x_2d, [block_t, BLOCK_K]),
        descriptor(w_2d, [ROWS, BLOCK_K]), descriptor(y, [block_t, WG_ROWS]), weights.scales,
        sums, locks, m, n, k, per_split, splits, *weights.scales.stride(), group_strides[1],
        STAGES=num_stages, LAG=refill_lag, SPLIT=splits > 1, CONSUMER_REGS=consumer_regs,
        SCALE_STEPS=scale_steps(per_split), PDL=with_pdl, EARLY=min(EARLY_SLOTS, num_stages),
        num_warps=4, launch_pdl=with_pdl,
    )  # fmt: skip
    return y


def linear_w8a16_wgmma(x: Tensor, weights: DenseWeights, **options: int | None) -> Tensor:
    """x @ W.T for bf16 x (M, K) and FP8 `weights` (N, K) by this kernel; `options` as
    `gemm_w8a16_wgmma` takes them."""
    check_linear_inputs(x, weights, "fp8")
    return gemm_w8a16_wgmma(x[:, None], weights, **options)


def linear_w8a16_wgmma_group(x: Tensor, group: Sequence[DenseWeights],
                             **options: int | None) -> Tensor:  # fmt: skip
    """cat_g(x[:, g] @ W_g.T) in one launch for x (M, G, K) and G FP8 weights of one shape at
    one stride (`formats.stacked_stride`)."""
    strides = check_group_inputs(x, group, "fp8")
    return gemm_w8a16_wgmma(x, group[0], strides, **options)
