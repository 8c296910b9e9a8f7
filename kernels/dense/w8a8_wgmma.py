"""W8A8 dense GEMM for prefill sizes in Gluon: one warpgroup rescales while the other multiplies.

DeepSeek's 128x128 weight blocks and 1x128 activation blocks give every 128-wide K step its own
scales, so the step's FP8 product must leave the tensor cores in fp32, be multiplied by its
row and weight scales and be added to the accumulator ("promote and rescale"). The Triton
kernel (`w8a8_tma.py`) compiles (Triton 3.6, sm_90) to `wgmma.wait_group 0` before each
rescale with both warpgroups in step, so the tensor cores idle while the CUDA cores rescale.

What was tried, compiled for sm_90 and read off the SASS (scripts/dense_wgmma_sass.py):
- One warpgroup keeping step k's wgmma in flight while it rescales step k-1
  (`warpgroup_mma_wait(1)`): ptxas then serialises every wgmma (info C7514: an accumulator
  register read while a wgmma is in flight), whichever registers are read. CUTLASS's and
  DeepGEMM's FP8 mainloops also wait for 0 before promoting; their overlap is between
  warpgroups.
- So here, as there, two consumer warpgroups of 64 rows each (`gl.warp_specialize`), which
  share nothing but the TMA ring's mbarriers: while one rescales, the other's wgmma holds the
  tensor cores. The ring is refilled by one load warp (`_loads`). Triton launches its
  partition as a whole warpgroup (12 warps, 168 registers a thread) and setmaxnreg moves the
  registers to the consumers: 232 each, the load warpgroup 40, no spills. A producer was
  once ruled out for the 168 registers alone, so warpgroup 0 refilled the ring one or two
  steps after a slot's use; with the load warp a layer's GEMMs took 6.6% less time at
  M=4096 and 9.2% less at 16,384, q_up 12-14% less, results identical
  (raw/logs/h200-dense-w8a8-load-warp-ab-3d94cb7-*.txt).
- Warpgroup 1 waiting for warpgroup 0's wgmma of each K step (an mbarrier a slot), so that
  the two could not fall into step and rescale at once: on the H200 a layer's GEMMs took
  1% less time at M=4096 and 0.5% more at 16384, and 3% more with one-wave tiles
  (raw/logs/h200-dense-w8a8-ordered-warpgroups-ab-*.csv). They do not fall into step; it
  was taken out.
- The next step's scales loaded at the top of the step and multiplied into each element
  after the wgmma (an FMUL and an FFMA an element, not one FFMA by sa * sw), so that ptxas
  could not copy the just-loaded scales into the loop's registers before the wgmma wait (the
  7% of q_up's samples below): on the H200 a layer's W8A8 GEMMs took 10-12% longer at M=4096
  and 16384, the kernel itself 12-16% (raw/ab-dense-20261205T041544). The rescale's
  CUDA-core instructions lie on the critical path; a fix for the scales' wait must not add
  any. Storing a two-wave tile's first wave under the second wave's last wgmma, so the
  second's store finds the staging buffer read, measured nothing either way
  (raw/ab-dense-20261205T041918; both in raw/logs/h200-dense-w8a8-scales-store-ab-*.txt).

Loads are TMA copies into a ring of slots, each with a `ready` barrier the copy completes
and an `empty` barrier both warpgroups arrive at once their wgmma has read it. Programs are
persistent, one per SM, walk their output tiles in grouped order, and the ring runs across
tile boundaries, so the next tile's loads overlap this tile's last steps and its store
(through a staging buffer per warpgroup, by TMA). It is the GPU's W8A8 kernel from
`w8a8.TMA_MIN_M` rows: with one-wave tiles it ran a layer's projections 4-8% faster than the
Triton kernel (raw/logs/h200-tune-dense-wgmma-a68971d-*.csv).

Tiles of 128 x 128 read 32 KB of ring a K step for 4 MFLOP, at the FP8 peak more than the L2
serves an SM, it seemed; Nsight Compute had the tensor pipe 54% busy on o_b at M=4096
(183.6 us, at 8607ab0). DeepGEMM halves one operand's L2 reads by multicasting it across a
2-CTA cluster, which Triton 3.6's Gluon cannot express for TMA loads, and takes 256-row tiles
as two waves of 128 (its WAVE_BLOCK_M). So does this kernel (`default_block_m`): the second
wave reuses the step's weight tile, 48 KB of ring for 8 MFLOP. On the H200 that took o_b to
153.7 us with the tensor pipe 68% busy, the warps now waiting mostly on their own wgmma
(ncu/dense-w8a8-T4096: there the L2 served 40% of its sector peak, so its bandwidth was not
the limit, and the SM clock was 1,644 MHz of the card's 1,980: the power cap; docs/design.md),
and the layer from 0.983 to 0.880 ms at M=4096 and 4.04 to 3.38 at
16384 (raw/logs/h200-tune-dense-wgmma-waves-*.csv). Before the load warp, DeepGEMM's GEMMs
alone were 1.2x faster (raw/logs/h200-dense-w8a8-gemm-times-*.csv): o_b 0.125 against
0.152 ms, q_up 0.205 against 0.246; shared_gate_up's 18 column tiles leave a third round of
SMs mostly idle at either tile height (0.070 against 0.114), where DeepGEMM picks a tile
width of its own.

With the load warp, Nsight Compute of both on the same weights at M=4096 (2026-12-05,
ncu/dense-{w8a8-T4096-block128,deepgemm-T4096}-projection*) had DeepGEMM's GEMM at a lower
SM clock than this one (1,521-1,591 against 1,615-1,700 MHz) and still faster (o_b 127
against 147 us, q_up 207 against 227, shared_gate_up 70 against 111), its tensor pipe
76-87% busy against 66-71%: not the clock; L2 bytes at most in part (DeepGEMM moved 9% and
19% fewer sectors on o_b and q_up, 29% more on shared_gate_up). By SASS instruction (q_up), a
quarter of this kernel's samples are the load warpgroup's three parked warps (NOP at a
barrier; no cost). Of the rest, 7% wait for the next step's scales at register moves ptxas
puts before the wgmma wait (hidden where the wgmma outlasts the global load; DeepGEMM brings
its activation scales in by TMA with each stage), and 7.5% at the tile's store, mostly the
second wave's `store_wait` for the first wave's TMA store to release the warpgroup's one
staging buffer (docs/design.md).

`ring_scales` (`linear_w8a8` turns it on where it can) brings a K step's row scales into the
ring with the step's operands: one more TMA box a step (a row of block_m fp32 scales of the
token-fastest layout, which needs M a multiple of 4), under the slot's `ready` barrier, read by
each warpgroup from shared memory while its wgmma runs. That adds no CUDA-core instruction to
the rescale (the reverted attempt above added 64 an element-wave), and what ptxas copies before
the wgmma wait is then a shared load's result. It needs 1 KB a two-wave slot, so it fits
beside 3 slots, not 4, and without num_stages it takes as many as fit (compiled for sm_90:
168 registers, no spills, the wgmmas grouped as without, every scale read between the slot's
wait and its release; the weight scale, one a step, is still loaded a step ahead from global
memory, where a line holds 32 steps' scales). Timed on an H100 (no H200 was lent), each of
the layer's GEMMs alone: 3 slots with the row scales beat the 4 without in 16 of 24 cases, the
GEMMs summed 2.2% less at 4,096 rows and 0.7% at 16,384 (raw/logs/h100-dense-w8a8-ring-gemm-
times-*.csv); with the wide tiles, the layer 4-6% less (raw/ab-dense-20261205T102702).

`staged_weight_scales` (on by default in `linear_w8a8`) takes the last global load out of the K
loop: the weight scale, one a step, which ptxas copies into the rescale's register before the
wgmma wait (5.7% of q_up's samples waited there, ncu/dense-w8a8-T4096-q_up-ring-scales, an
H100). Each warpgroup loads the next tile's scales a tile ahead, a register a thread, and
stores them in a buffer of its own in shared memory as that tile starts, between two barriers
of its warps, as DeepGEMM's math warps stage theirs; a step reads its scale with one shared
load. On the H200 the layer took 0.98x the time at 4,096 rows and 0.93x at 16,384 with it, both
significant (raw/ab-dense-20261205T125636), each GEMM alone 2-3% less at 16,384
(raw/logs/h200-dense-w8a8-staged-gemm-times-*.csv).

Gluon has no interpreter: the CPU tests check the compiled SASS and the host-side checks, and
the GPU tests (WORKBENCH_GPU_TESTS=1) compare results with `w8a8_reference`."""

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
from kernels.moe.routing import planned_sms

ROWS = 128  # a wave's rows: two warpgroups of wgmma's 64; a tile is one wave or two
BLOCK_MS = (ROWS, 2 * ROWS)  # a tile's rows: one wave or two
GROUP = gl.constexpr(8)  # row tiles walked together (grouped order)
# Ring slots by tile rows, beside the staging buffers (2 x 16 KB). On the H200, one-wave tiles
# ran 1.7x slower at 3 stages than at 6 (raw/logs/h200-tune-dense-wgmma-2678c54-*.csv), and as
# fast at 5 as at 6 at M=4096 and 4% faster at 16384 (h200-tune-dense-wgmma-a68971d-*.csv): 5
# x 32 KB of ring. Two-wave tiles take 48 KB a slot: 4 ran 1.5x faster than 3 when warpgroup 0
# refilled the ring (h200-tune-dense-wgmma-waves-*.csv). With the load warp, 3 ran each
# projection's GEMM alone up to 5% faster than 4 in 23 of 24 cases, a layer's 2.6% faster at
# M=4096 and 1.3% at 16384 (h200-dense-w8a8-three-slots-*.csv), and would free 48 KB of shared
# memory (51 KB of the 227 left); it becomes the default once a layer A/B and a bench run
# with the peers agree.
DEFAULT_STAGES = {128: 5, 256: 4}
# The ring is refilled by a load warp of its own (`_loads`), each slot as soon as both
# warpgroups have released it. Before, warpgroup 0 refilled a slot one or two steps after its
# use, which kept the ring three steps ahead at best and stopped that warpgroup's MMAs for the
# copies and the wait for the other's release.
TMA_LOAD_REGS = gl.constexpr(40)  # the load warp's registers: TMA copies and a cursor
# A warpgroup's registers beside it: the launch's 168 a thread for 12 warps (64,512 a block),
# less the load partition's warpgroup at 40, shared by the two consumer warpgroups. Asked for
# more, Triton gives warpgroup 0 less than asked, so more is refused. The MoE down kernel
# shares both.
MAX_CONSUMER_REGS = 232
SHARED_MEMORY = 232448  # bytes a block may take on sm_90 (227 KB, opted in)
# What the ring and staging buffers leave for the rest: the mbarriers and the partitions' own
# state (280 bytes more than ring and staging at 6 slots of 128 x 128 with the row scales,
# compiled for sm_90, which the estimate without this let through at exactly 227 KB)
RESERVED_SHARED = 1024


@gluon.jit
def allocate_ring(a_desc, w_desc, STAGES: gl.constexpr, W_BOXES: gl.constexpr = 1,
                  READY_ARRIVALS: gl.constexpr = 1):  # fmt: skip
    """(a_ring, w_ring, ready, empty): STAGES slots of the activations' TMA tile and W_BOXES
    of the weights' (stacked), and each slot's `ready` barrier (the copies complete it) and
    `empty` barrier (both warpgroups arrive once done with the slot), initialised; `ready`
    expects READY_ARRIVALS arrivals (one: the TMA copies' expect; more for threads' cp.async).
    The Gluon W8A8, W8A16 and MoE kernels share it."""
    a_ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape,
                                       a_desc.layout)  # fmt: skip
    w_rows: gl.constexpr = W_BOXES * w_desc.block_type.shape[0]
    w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, w_rows, w_desc.block_type.shape[1]],
                                       w_desc.layout)  # fmt: skip
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for first in gl.static_range(STAGES):
        mbarrier.init(ready.index(first), count=READY_ARRIVALS)
        mbarrier.init(empty.index(first), count=2)  # one arrival a warpgroup
    fence_async_shared()  # the initialised barriers, visible to TMA (the async proxy)
    return a_ring, w_ring, ready, empty


@gluon.jit
def allocate_staging(y_desc):
    """A staging buffer of y's TMA tile for each of the two warpgroups' stores."""
    return gl.allocate_shared_memory(y_desc.dtype, [2] + y_desc.block_type.shape, y_desc.layout)


# The row scales' ring (`ring_scales`): a K step's fp32 scales of a tile's rows are one TMA box
# of one row, stored as it comes (no swizzle) and read back by each warpgroup as a vector.
SCALE_BOX_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
_SCALE_ROW_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))
_STAND_IN_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))  # no scale ring


@gluon.jit
def allocate_scale_ring(sa_desc, STAGES: gl.constexpr):
    """STAGES slots of the row scales' TMA box (1 x a tile's rows), beside `allocate_ring`'s:
    a slot's scales come with its operands, under its `ready` barrier."""
    return gl.allocate_shared_memory(gl.float32, [STAGES] + sa_desc.block_type.shape,
                                     sa_desc.layout)  # fmt: skip


@gluon.jit
def _ring_row_scales(sa_ring, slot, first: gl.constexpr, layout: gl.constexpr):
    """The row scales of a slot's tile rows first ... first + 64, from the scale ring, in
    `layout` (the accumulator's rows)."""
    BLOCK_M: gl.constexpr = sa_ring.type.shape[2]
    row = sa_ring.index(slot)._reinterpret(gl.float32, [BLOCK_M], _SCALE_ROW_LAYOUT)
    return row.slice(first, 64).load(layout)


@gluon.jit
def released_slot(empty, step, LAG):
    """Wait until both warpgroups have released the slot used LAG steps before `step`; return
    the step it is refilled for (SLOTS steps after that use). The Gluon kernels share it."""
    SLOTS: gl.constexpr = empty.type.shape[0]
    used = step - LAG
    mbarrier.wait(empty.index(used % SLOTS), (used // SLOTS) & 1)
    return used + SLOTS


@gluon.jit
def _tile_of(tile, tiles_m, tiles_n):
    """(pid_m, pid_n) of a tile index walked in groups of GROUP row tiles, so programs running
    at the same time share weight columns in L2."""
    per_group = GROUP * tiles_n
    first_m = (tile // per_group) * GROUP
    rows_in_group = gl.minimum(tiles_m - first_m, GROUP)
    return first_m + (tile % per_group) % rows_in_group, (tile % per_group) // rows_in_group


@gluon.jit
def issue_load(a_desc, w_desc, a_ring, w_ring, ready, step, total, a_row, w_row, k_step,
               w_row_2=0, scales=None):  # fmt: skip
    """Start the TMA copies of this program's `step` (if it has one: step < total), K step
    `k_step` of the tiles whose first rows are a_row (activations) and w_row (weights; with
    two boxes a slot, `allocate_ring`'s W_BOXES, the second's are w_row_2), into its slot;
    with `scales` (sa_desc, sa_ring: `allocate_scale_ring`), the step's row scales too."""
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    BOX: gl.constexpr = w_desc.block_type.shape[0]
    W_BOXES: gl.constexpr = w_ring.type.shape[1] // BOX
    slot = step % SLOTS
    inside = step < total
    bar = ready.index(slot)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + W_BOXES * w_desc.block_type.nbytes
    if scales is None:
        mbarrier.expect(bar, nbytes, pred=inside)
    else:
        sa_desc, sa_ring = scales
        mbarrier.expect(bar, nbytes + sa_desc.block_type.nbytes, pred=inside)
        tma.async_copy_global_to_shared(sa_desc, [k_step, a_row], bar, sa_ring.index(slot),
                                        pred=inside)  # fmt: skip
    off_k = k_step * a_desc.block_type.shape[1]
    tma.async_copy_global_to_shared(a_desc, [a_row, off_k], bar, a_ring.index(slot),
                                    pred=inside)  # fmt: skip
    if W_BOXES == 1:
        tma.async_copy_global_to_shared(w_desc, [w_row, off_k], bar, w_ring.index(slot),
                                        pred=inside)  # fmt: skip
    else:
        gl.static_assert(W_BOXES == 2, "one or two weight boxes a slot")
        w_slot = w_ring.index(slot)
        tma.async_copy_global_to_shared(w_desc, [w_row, off_k], bar, w_slot.slice(0, BOX),
                                        pred=inside)  # fmt: skip
        tma.async_copy_global_to_shared(w_desc, [w_row_2, off_k], bar, w_slot.slice(BOX, BOX),
                                        pred=inside)  # fmt: skip


@gluon.jit
def _row_scales(sa_ptr, rows, k_step, ok, M, stride_sak):
    """The row scales of a K step, loaded, not yet used: multiplying them in where they are
    issued would wait for the load there (16% of the kernel's stall samples in the capture of
    ncu/dense-w8a8-T4096 at 8607ab0), where the caller means to wait a step."""
    return gl.load(sa_ptr + k_step * stride_sak + rows, mask=(rows < M) & ok, other=0.0)


@gluon.jit
def _weight_scale(sw_ptr, block_n, k_step, ok, stride_swn, stride_swk):
    """The weight scale of a K step: a tile lies in one weight block (its width divides the
    block's), so one scale covers it."""
    return gl.load(sw_ptr + block_n * stride_swn + k_step * stride_swk, mask=ok, other=0.0)


# The threads' barrier (a partition's own inside one): Triton 3.6's Gluon (the H200 image's)
# calls it thread_barrier, 3.7's barrier. The Gluon W8A16 and MoE INT4 kernels share it.
threads_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# A vector over a warpgroup's 128 threads, and a plain 1-D shared buffer: the staged scales'
WARPGROUP_VECTOR: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
FLAT_SHARED: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])


@gluon.jit
def _tile_weight_scales(sw_ptr, tile, tiles_m, tiles_n, k_steps, ok, stride_swn, stride_swk,
                        SCALE_STEPS: gl.constexpr, BLOCK_N: gl.constexpr,
                        BLOCK_K: gl.constexpr):  # fmt: skip
    """The loads of tile `tile`'s weight scales, one a K step (a tile lies in one weight block),
    a register a thread: issued a tile ahead, they arrive while the tile before runs."""
    _, pid_n = _tile_of(tile, tiles_m, tiles_n)
    step = gl.arange(0, SCALE_STEPS, layout=WARPGROUP_VECTOR)
    block = pid_n * BLOCK_N // BLOCK_K
    return gl.load(sw_ptr + block * stride_swn + step * stride_swk, mask=(step < k_steps) & ok,
                   other=0.0)  # fmt: skip


@gluon.jit
def _staged_weight_scales(sw_buf, values):
    """A tile's weight scales (`_tile_weight_scales`) in the warpgroup's shared buffer, once
    its reads of the tile before are done: each K step then reads its own with one broadcast
    shared load (`staged_scale`), not a global load a step ahead."""
    threads_barrier()  # the warpgroup's reads of the tile before
    sw_buf.store(values)
    threads_barrier()


@gluon.jit
def staged_scale(buf, step):
    """Step `step`'s scale from a shared buffer of one fp32 scale a K step, with one broadcast
    shared load. This kernel's staged weight scales and the W8A16 kernel's share it."""
    STEPS: gl.constexpr = buf.type.shape[0]
    steps = buf._reinterpret(gl.float32, [STEPS, 1], FLAT_SHARED)
    return gl.sum(steps.index(step).load(WARPGROUP_VECTOR), axis=0)


@gluon.jit
def multiply_slot(a_ring, w_ring, ready, slot, step, product, WARPGROUP: gl.constexpr):
    """The wgmma in flight: wait for the copy of this program's ring step `step` into `slot`,
    then start the product of the warpgroup's 64 rows of the slot's activations and its
    weights, into `product`'s registers (not added to them). The Gluon W8A8 kernels share it."""
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    mbarrier.wait(ready.index(slot), (step // SLOTS) & 1)
    a_rows = a_ring.index(slot).slice(WARPGROUP * 64, 64, dim=0)
    return warpgroup_mma(a_rows, w_ring.index(slot).permute((1, 0)), product, use_acc=False,
                         is_async=True)  # fmt: skip


@gluon.jit
def _consumer(a_desc, w_desc, y_desc, a_ring, w_ring, y_bufs, ready, empty, sa_ring, sw_bufs,
              sa_ptr, sw_ptr, M, k_steps, my_tiles, tiles_m, tiles_n, stride_sak, stride_swn,
              stride_swk, WARPGROUP: gl.constexpr):  # fmt: skip
    """Rows 64 WARPGROUP + [0, 64) of every 128-row wave of every tile this program owns.

    A tile is one wave of 128 rows or two (BLOCK_M 256, as DeepGEMM's 256-row tiles are): the
    second wave shares the step's weight tile, so a K step reads 48 KB of ring for 8 MFLOP
    where one wave reads 32 KB for 4, and the L2 serves a quarter fewer bytes per FLOP. Each
    wave has its own accumulator; the wgmma's product, one 64 x BLOCK_N fp32 tile, is reused.

    Per K step and wave: wait for the slot's copy (first wave), issue the wgmma, load the next
    step's scales while it runs, wait for it, release the slot (last wave), and fold the
    product into the wave's accumulator with the scales loaded a step before (an L2 round
    trip a step, otherwise exposed). With a scale ring (not the kernel's stand-in), the
    step's row scales came with its slot and are read from shared memory while the wgmma
    runs. With staged weight scales (`sw_bufs` two buffers, not a stand-in of one), a tile's
    weight scales are loaded a tile ahead into registers and stored in the warpgroup's shared
    buffer as the tile starts, as DeepGEMM's math warps do; else each is loaded a step ahead from
    global memory. The load warp (`_loads`) refills the ring. The two warpgroups share no
    barrier besides the ring's, so one rescales while the other's wgmma holds the tensor
    cores: the overlap a single warpgroup cannot get, because ptxas serialises its wgmmas when
    any instruction reads an accumulator while one is in flight (ptxas info C7514). A finished
    wave leaves through this warpgroup's staging buffer by a TMA store, which clips rows and
    columns past the output's edge.
    """
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    WG_ROWS: gl.constexpr = 64  # wgmma's M: one warpgroup's rows
    WAVE: gl.constexpr = 2 * WG_ROWS  # a wave's rows: both warpgroups'
    TWO_WAVES: gl.constexpr = BLOCK_M == 2 * WAVE
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    RING: gl.constexpr = sa_ring.type.shape[2] > 1  # a scale ring, not the stand-in
    STAGED: gl.constexpr = sw_bufs.type.shape[0] > 1  # staged weight scales, not the stand-in
    SCALE_STEPS: gl.constexpr = sw_bufs.type.shape[0] // 2
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32]
    )
    row_layout: gl.constexpr = gl.SliceLayout(1, layout)
    row_offsets = WARPGROUP * WG_ROWS + gl.arange(0, WG_ROWS, layout=row_layout)
    y_buf = y_bufs.index(WARPGROUP)
    product = gl.zeros((WG_ROWS, BLOCK_N), gl.float32, layout)
    if STAGED:
        sw_buf = sw_bufs.slice(WARPGROUP * SCALE_STEPS, SCALE_STEPS)
        tile_sw = _tile_weight_scales(sw_ptr, gl.program_id(0), tiles_m, tiles_n, k_steps, True,
                                      stride_swn, stride_swk, SCALE_STEPS, BLOCK_N,
                                      BLOCK_K)  # fmt: skip
    step = 0
    for t in range(my_tiles):
        tile = gl.program_id(0) + t * gl.num_programs(0)
        pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n)
        rows = pid_m * BLOCK_M + row_offsets
        weight_block = pid_n * BLOCK_N // BLOCK_K
        if not RING:
            sa = _row_scales(sa_ptr, rows, 0, True, M, stride_sak)
            sa_2 = _row_scales(sa_ptr, rows + WAVE, 0, TWO_WAVES, M, stride_sak)
        if STAGED:
            _staged_weight_scales(sw_buf, tile_sw)
            tile_sw = _tile_weight_scales(sw_ptr, tile + gl.num_programs(0), tiles_m, tiles_n,
                                          k_steps, t + 1 < my_tiles, stride_swn, stride_swk,
                                          SCALE_STEPS, BLOCK_N, BLOCK_K)  # fmt: skip
        else:
            sw = _weight_scale(sw_ptr, weight_block, 0, True, stride_swn, stride_swk)
        acc = gl.zeros((WG_ROWS, BLOCK_N), gl.float32, layout)
        acc_2 = gl.zeros((WG_ROWS, BLOCK_N), gl.float32, layout)  # the second wave's
        for k_step in range(k_steps):
            slot = step % SLOTS
            more = k_step + 1 < k_steps
            running = multiply_slot(a_ring, w_ring, ready, slot, step, product, WARPGROUP)
            if RING:
                sa = _ring_row_scales(sa_ring, slot, WARPGROUP * WG_ROWS, row_layout)
                if TWO_WAVES:
                    sa_2 = _ring_row_scales(sa_ring, slot, WAVE + WARPGROUP * WG_ROWS,
                                            row_layout)  # fmt: skip
            else:
                next_sa = _row_scales(sa_ptr, rows, k_step + 1, more, M, stride_sak)
            if STAGED:
                sw = staged_scale(sw_buf, k_step)
            else:
                next_sw = _weight_scale(sw_ptr, weight_block, k_step + 1, more, stride_swn,
                                        stride_swk)  # fmt: skip
            product = warpgroup_mma_wait(num_outstanding=0, deps=(running,))
            if TWO_WAVES:
                acc += product * (sa * sw)[:, None]
                a_rows = a_ring.index(slot).slice(WAVE + WARPGROUP * WG_ROWS, WG_ROWS, dim=0)
                # `acc` as the (unused) input holds the rescale above before this wgmma;
                # with `product` there, it sinks below it and reads the wgmma's registers
                running = warpgroup_mma(a_rows, w_ring.index(slot).permute((1, 0)), acc,
                                        use_acc=False, is_async=True)  # fmt: skip
                if not RING:
                    next_sa_2 = _row_scales(sa_ptr, rows + WAVE, k_step + 1, more, M,
                                            stride_sak)  # fmt: skip
                product = warpgroup_mma_wait(num_outstanding=0, deps=(running,))
            mbarrier.arrive(empty.index(slot), count=1)  # after the slot's scales were read
            if TWO_WAVES:
                acc_2 += product * (sa_2 * sw)[:, None]
                if not RING:
                    sa_2 = next_sa_2
            else:
                acc += product * (sa * sw)[:, None]
            if not RING:
                sa = next_sa
            if not STAGED:
                sw = next_sw
            step += 1
        _store_wave(y_desc, y_buf, acc, pid_m * BLOCK_M + WARPGROUP * WG_ROWS, pid_n * BLOCK_N)
        if TWO_WAVES:
            _store_wave(y_desc, y_buf, acc_2, pid_m * BLOCK_M + WAVE + WARPGROUP * WG_ROWS,
                        pid_n * BLOCK_N)  # fmt: skip
    tma.store_wait(pendings=0)


@gluon.jit
def _store_wave(y_desc, y_buf, acc, row, column):
    """Store a warpgroup's finished rows of a wave at (row, column) by TMA, once the buffer's
    previous store has read it (`store_wait` waits for the reads, not the writes)."""
    tma.store_wait(pendings=0)
    y_buf.store(acc.to(y_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(y_desc, [row, column], y_buf)


@gluon.jit
def _w8a8_wgmma_kernel(
    a_desc, w_desc, y_desc, sa_desc, sa_ptr, sw_ptr, M, N, K, stride_sak, stride_swn,
    stride_swk, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, SCALE_STEPS: gl.constexpr = 0,
):  # fmt: skip
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    gl.static_assert((BLOCK_M == 128) | (BLOCK_M == 256), "one or two waves of 128 rows")
    a_ring, w_ring, ready, empty = allocate_ring(a_desc, w_desc, STAGES)
    y_bufs = allocate_staging(y_desc)
    if sa_desc is None:  # the row scales from global memory, a step ahead
        # Triton 3.6 hands a partition constexprs as runtime values, and no None: a scale ring
        # of one element tells them there is none, the activations' descriptor stands in for
        # the scales' one
        sa_ring = gl.allocate_shared_memory(gl.float32, [1, 1, 1], _STAND_IN_LAYOUT)
        sa_box = a_desc
    else:  # the row scales with each slot (`ring_scales`)
        sa_ring = allocate_scale_ring(sa_desc, STAGES)
        sa_box = sa_desc
    if SCALE_STEPS == 0:  # the weight scales from global memory, a step ahead (the stand-in)
        sw_bufs = gl.allocate_shared_memory(gl.float32, [1], FLAT_SHARED)
    else:  # a buffer of a tile's weight scales a warpgroup (`staged_weight_scales`)
        sw_bufs = gl.allocate_shared_memory(gl.float32, [2 * SCALE_STEPS], FLAT_SHARED)

    tiles_m = gl.cdiv(M, BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    my_tiles = gl.cdiv(tiles_m * tiles_n - gl.program_id(0), gl.num_programs(0))
    args = (a_desc, w_desc, y_desc, a_ring, w_ring, y_bufs, ready, empty, sa_ring, sw_bufs,
            sa_ptr, sw_ptr, M, k_steps, my_tiles, tiles_m, tiles_n, stride_sak, stride_swn,
            stride_swk)  # fmt: skip
    loads = (a_desc, w_desc, a_ring, w_ring, ready, empty, k_steps, my_tiles, tiles_m, tiles_n,
             sa_box, sa_ring)  # fmt: skip
    gl.warp_specialize([(_top_rows, args), (_bottom_rows, args), (_loads, loads)], [4, 1],
                       [CONSUMER_REGS, TMA_LOAD_REGS])  # fmt: skip


@gluon.jit
def _top_rows(a_desc, w_desc, y_desc, a_ring, w_ring, y_bufs, ready, empty, sa_ring, sw_bufs,
              sa_ptr, sw_ptr, M, k_steps, my_tiles, tiles_m, tiles_n, stride_sak, stride_swn,
              stride_swk):  # fmt: skip
    """Warpgroup 0 (the default partition): each wave's first 64 rows."""
    _consumer(a_desc, w_desc, y_desc, a_ring, w_ring, y_bufs, ready, empty, sa_ring, sw_bufs,
              sa_ptr, sw_ptr, M, k_steps, my_tiles, tiles_m, tiles_n, stride_sak, stride_swn,
              stride_swk, 0)  # fmt: skip


@gluon.jit
def _bottom_rows(a_desc, w_desc, y_desc, a_ring, w_ring, y_bufs, ready, empty, sa_ring,
                 sw_bufs, sa_ptr, sw_ptr, M, k_steps, my_tiles, tiles_m, tiles_n, stride_sak,
                 stride_swn, stride_swk):  # fmt: skip
    """Warpgroup 1 (a worker partition): each wave's last 64 rows."""
    _consumer(a_desc, w_desc, y_desc, a_ring, w_ring, y_bufs, ready, empty, sa_ring, sw_bufs,
              sa_ptr, sw_ptr, M, k_steps, my_tiles, tiles_m, tiles_n, stride_sak, stride_swn,
              stride_swk, 1)  # fmt: skip


@gluon.jit
def ring_loads(a_desc, w_desc, a_ring, w_ring, ready, empty, k_steps, my_units,
               place: gl.constexpr, where, issue: gl.constexpr, scales=None):  # fmt: skip
    """The load warp (a partition of its own): every K step of this program's work units
    (tiles, items) in order, each slot refilled as soon as both warpgroups have released it,
    so the ring runs SLOTS steps ahead of the MMAs; the unit and K step advance as a cursor (no
    division a step), `place(unit, where)` gives a unit's first activation row and two weight
    rows, and `issue` starts a step's copies (`issue_load`, whose w_row_2 is the second weight
    box's, unused with one box a slot); with `scales` (`issue_load`'s), each step's row scales
    come too. This kernel, the 192-wide one (`kernels.dense.w8a8_wide`: its own slots and
    `issue`) and the MoE down kernel (`kernels.moe.w8a8_wgmma`) share it."""
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    total = my_units * k_steps
    unit = gl.program_id(0)
    k_step = 0
    a_row, w_row, w_row_2 = place(unit, where)
    for step in range(total):
        if step >= SLOTS:
            released_slot(empty, step, SLOTS)
        issue(a_desc, w_desc, a_ring, w_ring, ready, step, total, a_row, w_row, k_step, w_row_2,
              scales)  # fmt: skip
        k_step += 1
        if k_step == k_steps:
            k_step = 0
            unit += gl.num_programs(0)
            a_row, w_row, w_row_2 = place(unit, where)


@gluon.jit
def _loads(a_desc, w_desc, a_ring, w_ring, ready, empty, k_steps, my_tiles, tiles_m, tiles_n,
           sa_desc, sa_ring):  # fmt: skip
    """The load warp over this program's tiles (`ring_loads`), with the row scales where the
    kernel has a scale ring."""
    scales = (sa_desc, sa_ring) if sa_ring.type.shape[2] > 1 else None  # not the stand-in
    ring_loads(a_desc, w_desc, a_ring, w_ring, ready, empty, k_steps, my_tiles, _tile_rows,
               (tiles_m, tiles_n, tiles_m * tiles_n - 1, a_desc, w_desc), issue_load,
               scales)  # fmt: skip


@gluon.jit
def _tile_rows(tile, where):
    """(first activation row, first weight row, and 0: one weight box a slot) of tile `tile`;
    past the last tile (after a program's last step) the cursor stays in bounds."""
    tiles_m, tiles_n, last_tile, a_desc, w_desc = where
    pid_m, pid_n = _tile_of(gl.minimum(tile, last_tile), tiles_m, tiles_n)
    return pid_m * a_desc.block_type.shape[0], pid_n * w_desc.block_type.shape[0], 0


def supported(device: torch.device) -> bool:
    """Whether this kernel runs on `device`: wgmma exists on sm_90 only (Hopper; Blackwell's
    tensor cores take tcgen05 instead, Ampere's mma.sync), and Gluon has no interpreter."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def default_block_m(m: int, n: int, block_n: int, sms: int) -> int:
    """Two waves a tile (256 rows) where one-wave tiles would take the SMs more than one round,
    else one. On the H200, two-wave tiles took 4-19% less time on each projection of a layer
    at M=4096 and 16384 (raw/logs/h200-dense-w8a8-gemm-times-2e9b9f7-*.csv), o_a's 128 tiles
    on 132 SMs among them (0.036 ms against 0.045), and the layer 9-26% more at M=512 and
    1024 (raw/logs/h200-tune-dense-wgmma-waves-*.csv), where one-wave tiles fit in one round."""
    one_wave_tiles = triton.cdiv(m, ROWS) * triton.cdiv(n, block_n)
    return 2 * ROWS if one_wave_tiles > sms else ROWS


def descriptor(tensor: Tensor, block_shape: list[int]) -> TensorDescriptor:
    """A host TMA descriptor of a 2-D row-major tensor with the swizzle wgmma reads."""
    dtype = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16,
             torch.float32: gl.float32}[tensor.dtype]  # fmt: skip
    layout = gl.NVMMASharedLayout.get_default_for(block_shape, dtype)
    return TensorDescriptor.from_tensor(tensor, block_shape, layout)


def scale_descriptor(scales: Tensor, block_m: int) -> TensorDescriptor:
    """A TMA descriptor of token-fastest row scales (M, K blocks), strides (1, S) as
    `check_tma_inputs` takes them (S = M from the quantiser), as the (K blocks, M) matrix they
    are in memory, in boxes of one K block's scales of block_m rows. TMA needs each K block's
    row of scales to start 16-byte aligned: S a multiple of 4 where K has several blocks."""
    m, blocks = scales.shape
    # with one block no second row is read: any stride TMA takes will do
    stride = scales.stride(1) if blocks > 1 else triton.cdiv(m, 4) * 4
    if stride % 4:
        raise ValueError(f"ring_scales copies each K block's {m} row scales by TMA, which needs "
                         f"each block's row 16-byte aligned: its stride (M from the quantiser) "
                         f"a multiple of 4, got M={m}, stride {stride}; pad the rows or leave "
                         "ring_scales off.")  # fmt: skip
    if scales.data_ptr() % 16:
        raise ValueError("ring_scales copies the row scales by TMA, which needs their storage "
                         "16-byte aligned; quantise into a fresh tensor or leave ring_scales "
                         "off.")  # fmt: skip
    in_memory = scales.as_strided((blocks, m), (stride, 1))
    return TensorDescriptor.from_tensor(in_memory, [1, block_m], SCALE_BOX_LAYOUT)


def weight_scale_steps(k: int) -> int:
    """The slots of a warpgroup's buffer of a tile's weight scales (`staged_weight_scales`),
    one a K step: a power of two (Gluon's shared allocations take no other sides)."""
    return triton.next_power_of_2(triton.cdiv(k, BLOCK))


def staging_bytes(block_n: int, out_dtype: torch.dtype) -> int:
    """Shared memory the two warpgroups' staging buffers take: 64 x block_n outputs each."""
    return 2 * (ROWS // 2) * block_n * torch.finfo(out_dtype).bits // 8


def ring_stages(num_stages: int | None, default: int, slot: int, staging: int, tile: str) -> int:
    """The ring's slots of `slot` bytes beside `staging` bytes of staging buffers: `num_stages`,
    checked to fit in sm_90's shared memory, or `default` (None), or fewer where fewer fit (the
    row scales' slots); `tile` names the tiles in the error."""
    fits = (SHARED_MEMORY - RESERVED_SHARED - staging) // slot
    if num_stages is None:
        num_stages = min(default, fits)
    if num_stages > fits:
        needs = num_stages * slot + staging + RESERVED_SHARED
        raise ValueError(f"num_stages={num_stages} with {tile} needs {needs // 1024} KB of shared "
                         f"memory, more than sm_90's {SHARED_MEMORY // 1024} KB; use num_stages "
                         f"<= {fits}.")  # fmt: skip
    if num_stages < 2:
        raise ValueError(f"num_stages must be at least 2 (a slot loading while one is read), "
                         f"got {num_stages}.")  # fmt: skip
    return num_stages


def check_device(device: torch.device) -> None:
    """Refuse a device the Gluon W8A8 kernels do not run on (`supported`), saying what it is."""
    if not supported(device):
        found = str(device)
        if device.type == "cuda":
            found += f" of compute capability {torch.cuda.get_device_capability(device)}"
        raise ValueError(f"the wgmma W8A8 kernel needs an sm_90 (Hopper) GPU, got {found}; "
                         "leave wgmma unset to take the Triton kernels.")  # fmt: skip


def check_consumer_regs(consumer_regs: int) -> None:
    """Refuse a consumer register budget setmaxnreg cannot give both warpgroups beside the
    load warp's (a multiple of 8, from 24 to MAX_CONSUMER_REGS)."""
    if consumer_regs % 8 or not 24 <= consumer_regs <= MAX_CONSUMER_REGS:
        raise ValueError(f"consumer_regs must be a multiple of 8 from 24 to {MAX_CONSUMER_REGS} "
                         f"(what the two warpgroups can have beside the load warp's "
                         f"{TMA_LOAD_REGS.value}), got {consumer_regs}.")  # fmt: skip


def gemm_w8a8_wgmma(
    values: Tensor,
    scales: Tensor,
    weights: DenseWeights,
    out_dtype: torch.dtype,
    block_n: int = 128,
    num_stages: int | None = None,
    consumer_regs: int = MAX_CONSUMER_REGS,
    block_m: int | None = None,
    ring_scales: bool = False,
    staged_weight_scales: bool = False,
) -> Tensor:
    """y = (values * scales) @ W.T for quantised activations (M, K) with token-fastest scales
    (the quantiser's `outer_major` layout) and FP8 `weights` in 128x128 blocks.

    Tiles are `block_m` rows (one wave of two warpgroups' 64 rows, or two waves; None:
    `default_block_m`) by `block_n` columns, inside one weight block, so a K step takes one
    weight scale; `consumer_regs` is the register budget Triton asks for each warpgroup
    (setmaxnreg); `num_stages` the ring's slots (None: DEFAULT_STAGES by block_m, or as many
    as fit beside the row scales). `ring_scales` brings each K step's row scales into its ring
    slot by TMA with the operands (`scale_descriptor`: M a multiple of 4 where K has several
    blocks), where the warpgroups read them from shared memory, instead of from global memory
    a step ahead. `staged_weight_scales` keeps a tile's weight scales in shared memory, a
    buffer a warpgroup (`weight_scale_steps`), loaded a tile ahead, instead of loading each a
    step ahead from global memory."""
    check_tma_inputs("wgmma", scales, weights)
    if block_n not in (32, 64, 128):
        raise ValueError(f"block_n must be 32, 64 or 128 (a power of two no wider than a "
                         f"weight block; wider, a warpgroup's two fp32 tiles overflow its "
                         f"registers; 128 x 192 tiles are kernels.dense.w8a8_wide's), got "
                         f"{block_n}.")  # fmt: skip
    (m, k), n = values.shape, weights.out_features
    sms = planned_sms(values.device)
    if block_m is None:
        block_m = default_block_m(m, n, block_n, sms)
    if block_m not in BLOCK_MS:
        raise ValueError(f"block_m must be {ROWS} or {2 * ROWS} (one or two waves of two "
                         f"warpgroups' 64 rows), got {block_m}.")  # fmt: skip
    slot = (block_m + block_n) * BLOCK + (4 * block_m if ring_scales else 0)  # FP8: a byte each
    scale_steps = weight_scale_steps(k) if staged_weight_scales else 0
    staging = staging_bytes(block_n, out_dtype) + 2 * 4 * scale_steps
    tile = (f"{block_m} x {block_n} tiles{' and ring_scales' if ring_scales else ''}"
            f"{' and staged_weight_scales' if staged_weight_scales else ''}")  # fmt: skip
    num_stages = ring_stages(num_stages, DEFAULT_STAGES.get(block_m, 3), slot, staging, tile)
    check_consumer_regs(consumer_regs)
    sa_desc = scale_descriptor(scales, block_m) if ring_scales else None
    check_device(values.device)
    y = torch.empty(m, n, dtype=out_dtype, device=values.device)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    programs = min(tiles, sms)
    launch(
        _w8a8_wgmma_kernel, (programs,), descriptor(values, [block_m, BLOCK]),
        descriptor(weights.values, [block_n, BLOCK]), descriptor(y, [ROWS // 2, block_n]),
        sa_desc, scales, weights.scales, m, n, k, scales.stride(1), *weights.scales.stride(),
        STAGES=num_stages, CONSUMER_REGS=consumer_regs, SCALE_STEPS=scale_steps, num_warps=4,
    )  # fmt: skip
    return y
