"""The routed experts' W8A8 down projection on Hopper's wgmma, in Gluon.

The Triton down kernel (`w8a8._w8a8_down_kernel`) took 43% of `moe_w8a8`'s time at
T=33,863 for a third of its FLOPs: its K loop is I / 128 = 9 steps, and Triton pipelines the
loads inside one work item only, so every 128 x 128 item fills its pipeline from DRAM again
and drains it before its store. Here, as in the dense Gluon kernel (`kernels.dense.
w8a8_wgmma`, whose ring and load this kernel shares), programs are persistent and their TMA
ring runs across items, so the next item's loads overlap this one's last steps and its store.

TMA needs each tile's rows contiguous: gate/up writes h in sorted order (an expert's rows
together, `FlatLayout`), so an item, one expert row tile of 128 rows and one 128-column
tile of H, reads rows offsets[e] + 128 r ... of h as one box (rows past the expert's count
belong to the next expert or lie past the end, where TMA reads zeros; their results are not
stored) and rows e * H + 128 c ... of the experts' down weights viewed as (E * H, I).
Each warpgroup rescales its 64 rows' fp32 products by the rows' activation scales (stored
K block by K block, rows fastest) and the tile's weight scale, as the dense kernel does,
and stores each row, times its routing weight, at its slot of y for `combine`.

Gluon has no interpreter: the CPU tests compile it for sm_90 and read its SASS
(scripts/dense_wgmma_sass.py --kernel moe-down); the GPU tests compare `moe_w8a8` with and
without it.
"""

from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernels.compiled import launch
from kernels.dense.w8a8_wgmma import SHARED_MEMORY, allocate_ring, descriptor, issue_load

BLOCK = 128  # the weight block: an item's width and a K step
ROWS = 128  # an item's rows: one expert row tile, two warpgroups of wgmma's 64
WG_ROWS = 64
_BLOCK = gl.constexpr(BLOCK)
_ROWS = gl.constexpr(ROWS)
_WG_ROWS = gl.constexpr(WG_ROWS)
# Ring slots: 32 KB each, as many as shared memory holds with room to spare.
DEFAULT_STAGES = 6
LOAD_AHEAD = 3  # K steps the ring loads ahead (the dense kernel's measured choice)


@gluon.jit
def _find_expert(tile_offsets_ptr, tile, num_experts, steps):
    """The expert owning global row tile `tile`: the largest e with tile_offsets[e] <= tile,
    by a binary search of `steps` = ceil(log2(E)) halvings, as `tiles.find_expert` finds it
    (a runtime loop: a constexpr passed through `warp_specialize`'s arguments arrives as a
    runtime value)."""
    lo = tile * 0
    hi = lo + num_experts
    for _ in range(steps):
        mid = (lo + hi) // 2
        go_right = gl.load(tile_offsets_ptr + mid) <= tile
        lo = gl.where(go_right, mid, lo)
        hi = gl.where(go_right, hi, mid)
    return lo


@gluon.jit
def _item(item, col_tiles, hidden, tile_offsets_ptr, offsets_ptr, counts_ptr, num_experts,
          STEPS: gl.constexpr):  # fmt: skip
    """(expert, first sorted row, rows the expert owns from it, first weight row, column
    tile) of work item `item`: row tile item // col_tiles, column tile item % col_tiles."""
    tile = item // col_tiles
    col_tile = item % col_tiles
    expert = _find_expert(tile_offsets_ptr, tile, num_experts, STEPS)
    within = (tile - gl.load(tile_offsets_ptr + expert)) * _ROWS
    first_row = gl.load(offsets_ptr + expert) + within
    owned = gl.load(counts_ptr + expert) - within
    return expert, first_row, owned, expert * hidden + col_tile * _BLOCK, col_tile


@gluon.jit
def _consumer(h_desc, w_desc, a_ring, w_ring, ready, empty, hs_ptr, ws_ptr, y_ptr,
              sorted_slots_ptr, slot_weights_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
              num_experts, hidden, k_steps, my_items, stride_hsk, stride_wse, stride_wsn,
              stride_wsk, stride_yr, STEPS: gl.constexpr, LAG: gl.constexpr,
              WARPGROUP: gl.constexpr):  # fmt: skip
    """Rows 64 WARPGROUP + [0, 64) of every item this program owns.

    Per K step: wait for the slot's copy, issue the wgmma, load the next step's scales while
    it runs, wait for it, release the slot, and fold the product into the accumulator with
    the scales loaded a step before. Warpgroup 0 also refills the slot used LAG steps before
    (once both warpgroups have released it) with the step SLOTS ahead, whose item and K
    step advance as a cursor.
    """
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BLOCK, 32]
    )
    offsets = WARPGROUP * _WG_ROWS + gl.arange(0, _WG_ROWS, layout=gl.SliceLayout(1, layout))
    columns = gl.arange(0, _BLOCK, layout=gl.SliceLayout(0, layout))
    col_tiles = hidden // _BLOCK
    programs = gl.num_programs(0)
    product = gl.zeros((_WG_ROWS, _BLOCK), gl.float32, layout)
    total = my_items * k_steps
    step = 0
    # The refill cursor: step SLOTS (the prologue loaded 0 .. SLOTS - 1), as an item and K step.
    load_item = SLOTS // k_steps
    load_k = SLOTS % k_steps
    _, load_row, _, load_w_row, _ = _item(gl.program_id(0) + load_item * programs, col_tiles,
                                          hidden, tile_offsets_ptr, offsets_ptr, counts_ptr,
                                          num_experts, STEPS)  # fmt: skip
    for i in range(my_items):
        expert, first_row, owned, _, col_tile = _item(
            gl.program_id(0) + i * programs, col_tiles, hidden, tile_offsets_ptr, offsets_ptr,
            counts_ptr, num_experts, STEPS,
        )  # fmt: skip
        rows = first_row + offsets
        mine = offsets < owned
        w_scales = ws_ptr + expert * stride_wse + col_tile * stride_wsn
        sa = gl.load(hs_ptr + rows, mask=mine, other=0.0)
        sw = gl.load(w_scales)
        acc = gl.zeros((_WG_ROWS, _BLOCK), gl.float32, layout)
        for k_step in range(k_steps):
            slot = step % SLOTS
            more = k_step + 1 < k_steps
            mbarrier.wait(ready.index(slot), (step // SLOTS) & 1)
            a_rows = a_ring.index(slot).slice(WARPGROUP * _WG_ROWS, _WG_ROWS, dim=0)
            running = warpgroup_mma(a_rows, w_ring.index(slot).permute((1, 0)), product,
                                    use_acc=False, is_async=True)  # fmt: skip
            next_sa = gl.load(hs_ptr + (k_step + 1) * stride_hsk + rows, mask=mine & more,
                              other=0.0)  # fmt: skip
            next_sw = gl.load(w_scales + (k_step + 1) * stride_wsk, mask=more, other=0.0)
            product = warpgroup_mma_wait(num_outstanding=0, deps=(running,))
            mbarrier.arrive(empty.index(slot), count=1)
            if WARPGROUP == 0 and step >= LAG:
                used = step - LAG
                mbarrier.wait(empty.index(used % SLOTS), (used // SLOTS) & 1)
                issue_load(h_desc, w_desc, a_ring, w_ring, ready, used + SLOTS, total,
                           load_row, load_w_row, load_k)  # fmt: skip
                load_k += 1
                if load_k == k_steps:
                    load_k = 0
                    load_item += 1
                    _, load_row, _, load_w_row, _ = _item(
                        gl.program_id(0) + load_item * programs, col_tiles, hidden,
                        tile_offsets_ptr, offsets_ptr, counts_ptr, num_experts, STEPS,
                    )  # fmt: skip
            acc += product * (sa * sw)[:, None]
            sa, sw = next_sa, next_sw
            step += 1
        slots = gl.load(sorted_slots_ptr + rows, mask=mine, other=0).to(gl.int64)
        weights = gl.load(slot_weights_ptr + slots, mask=mine, other=0.0)
        out = (acc * weights[:, None]).to(y_ptr.dtype.element_ty)
        cols = col_tile * _BLOCK + columns
        y_ptrs = y_ptr + slots[:, None] * stride_yr + cols[None, :]
        gl.store(y_ptrs, out, mask=mine[:, None] & (cols < hidden)[None, :])


@gluon.jit
def _w8a8_down_wgmma_kernel(
    h_desc, w_desc, hs_ptr, ws_ptr, y_ptr, sorted_slots_ptr, slot_weights_ptr, counts_ptr,
    offsets_ptr, tile_offsets_ptr, num_experts, hidden, inter, stride_hsk, stride_wse,
    stride_wsn, stride_wsk, stride_yr, STEPS: gl.constexpr, STAGES: gl.constexpr,
    LAG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):  # fmt: skip
    a_ring, w_ring, ready, empty = allocate_ring(h_desc, w_desc, STAGES)
    col_tiles = hidden // _BLOCK
    k_steps = inter // _BLOCK
    items = gl.load(tile_offsets_ptr + num_experts) * col_tiles
    my_items = gl.cdiv(items - gl.program_id(0), gl.num_programs(0))
    for first in gl.static_range(STAGES):
        _, first_row, _, w_row, _ = _item(
            gl.program_id(0) + (first // k_steps) * gl.num_programs(0), col_tiles, hidden,
            tile_offsets_ptr, offsets_ptr, counts_ptr, num_experts, STEPS,
        )  # fmt: skip
        issue_load(h_desc, w_desc, a_ring, w_ring, ready, first, my_items * k_steps, first_row,
                   w_row, first % k_steps)  # fmt: skip
    args = (h_desc, w_desc, a_ring, w_ring, ready, empty, hs_ptr, ws_ptr, y_ptr,
            sorted_slots_ptr, slot_weights_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
            num_experts, hidden, k_steps, my_items, stride_hsk, stride_wse, stride_wsn,
            stride_wsk, stride_yr, STEPS, LAG)  # fmt: skip
    gl.warp_specialize([(_top_rows, args), (_bottom_rows, args)], [4], [CONSUMER_REGS])


@gluon.jit
def _top_rows(h_desc, w_desc, a_ring, w_ring, ready, empty, hs_ptr, ws_ptr, y_ptr,
              sorted_slots_ptr, slot_weights_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
              num_experts, hidden, k_steps, my_items, stride_hsk, stride_wse, stride_wsn,
              stride_wsk, stride_yr, STEPS: gl.constexpr, LAG: gl.constexpr):  # fmt: skip
    """Warpgroup 0 (the default partition): each item's first 64 rows, and the refills."""
    _consumer(h_desc, w_desc, a_ring, w_ring, ready, empty, hs_ptr, ws_ptr, y_ptr,
              sorted_slots_ptr, slot_weights_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
              num_experts, hidden, k_steps, my_items, stride_hsk, stride_wse, stride_wsn,
              stride_wsk, stride_yr, STEPS, LAG, 0)  # fmt: skip


@gluon.jit
def _bottom_rows(h_desc, w_desc, a_ring, w_ring, ready, empty, hs_ptr, ws_ptr, y_ptr,
                 sorted_slots_ptr, slot_weights_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
                 num_experts, hidden, k_steps, my_items, stride_hsk, stride_wse, stride_wsn,
                 stride_wsk, stride_yr, STEPS: gl.constexpr, LAG: gl.constexpr):  # fmt: skip
    """Warpgroup 1 (the worker partition): each item's last 64 rows."""
    _consumer(h_desc, w_desc, a_ring, w_ring, ready, empty, hs_ptr, ws_ptr, y_ptr,
              sorted_slots_ptr, slot_weights_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
              num_experts, hidden, k_steps, my_items, stride_hsk, stride_wse, stride_wsn,
              stride_wsk, stride_yr, STEPS, LAG, 1)  # fmt: skip


def down_descriptors(h8: Tensor, down: Tensor):
    """(h_desc, w_desc): TMA descriptors of the sorted FP8 rows h8 (slots, I) and of the
    experts' FP8 down weights (E, H, I) viewed as (E * H, I), both in 128 x 128 boxes."""
    return descriptor(h8, [ROWS, BLOCK]), descriptor(down.reshape(-1, down.shape[-1]),
                                                     [BLOCK, BLOCK])  # fmt: skip


def down_wgmma(
    h8: Tensor,
    hs: Tensor,
    y: Tensor,
    down: Tensor,
    down_scale: Tensor,
    layout: tuple,
    programs: int,
    num_stages: int = DEFAULT_STAGES,
    consumer_regs: int = 232,
) -> None:
    """y[slot] = routing weight * (h8 * hs)[sorted row] @ down[expert].T for every routed
    slot, in y's dtype: h8 (slots, I) FP8 in sorted order, hs (I / 128, slots) its scales,
    down (E, H, I) FP8 in 128 x 128 blocks with down_scale (E, H / 128, I / 128); `layout`
    a `flat.FlatLayout` built with 128-row tiles, `programs` persistent programs."""
    counts, offsets, tile_offsets, sorted_slots, slot_weights, row_tiles = layout
    experts, hidden, inter = down.shape
    if hidden % BLOCK or inter % BLOCK or not down.is_contiguous() or not h8.is_contiguous():
        raise ValueError(
            f"the wgmma down kernel takes contiguous h8 and down weights with H "
            f"and I in whole {BLOCK}-wide blocks; got down {tuple(down.shape)}."
        )
    stages_fit = (SHARED_MEMORY - 4096) // ((ROWS + BLOCK) * BLOCK)
    if not LOAD_AHEAD < num_stages <= stages_fit:
        raise ValueError(
            f"num_stages must be from {LOAD_AHEAD + 1} to {stages_fit} (ring "
            f"slots of {(ROWS + BLOCK) * BLOCK // 1024} KB), got {num_stages}."
        )
    h_desc, w_desc = down_descriptors(h8, down)
    launch(
        _w8a8_down_wgmma_kernel, (max(1, min(programs, row_tiles * (hidden // BLOCK))),),
        h_desc, w_desc, hs, down_scale, y, sorted_slots, slot_weights, counts, offsets,
        tile_offsets, experts, hidden, inter, hs.stride(0), *down_scale.stride(),
        y.stride(0), STEPS=max(experts - 1, 0).bit_length(), STAGES=num_stages,
        LAG=num_stages - LOAD_AHEAD, CONSUMER_REGS=consumer_regs, num_warps=4,
    )  # fmt: skip
