"""The routed experts' W8A8 down projection on Hopper's wgmma, in Gluon, and what the MoE
Gluon kernels share: the table of row tiles (`row_table`) and an item's place in it, the rows'
16-byte stores, and the load warps that gather gate/up's rows.

The Triton down kernel (`w8a8._w8a8_down_kernel`) took 43% of `moe_w8a8`'s time at
T=33,863 for a third of its FLOPs: its K loop is I / 128 = 9 steps, and Triton pipelines the
loads inside one work item only, so every 128 x 128 item fills its pipeline from DRAM again
and drains it before its store. Here, as in the dense Gluon kernel (`kernels.dense.
w8a8_wgmma`, whose ring and load this kernel shares), programs are persistent and their TMA
ring runs across items, so the next item's loads overlap this one's last steps and its store.

TMA needs each tile's rows contiguous: gate/up writes h in sorted order (an expert's rows
together, `FlatLayout`), so an item, one expert row tile of 128 rows and 256 columns of H (two
weight blocks), reads rows offsets[e] + 128 r ... of h as one box (rows past the expert's
count belong to the next expert or lie past the end, where TMA reads zeros; their results are
not stored) and rows e * H + 256 c ... of the experts' down weights viewed as (E * H, I). The
two column tiles share the step's rows of h, so a K step reads 48 KB of ring for 8 MFLOP where
one would read 32 KB for 4, as the dense kernel's two-wave tiles share the weights. Each
warpgroup rescales its 64 rows' fp32 products by the rows' activation scales (stored K block
by K block, rows fastest) and the blocks' weight scales, as the dense kernel does, and stores
each row, times its routing weight, at its slot of y for `combine`.

What each step bought on the H200 (moe_w8a8 at the TP2 rank's shape, one session a commit,
raw/logs/h200-moe-w8a8-gluon-down-probe-20261202T0430.csv and
h200-tune-moe-w8a8-8c652c9-20261202T0420.csv): with 128-column items, an expert searched for per
item and 4-byte stores from the wgmma layout it was 3% slower than the Triton kernel at
T=33,863; with a table of row tiles (then written by gate/up, now by
`row_table`) 2% slower there and 10% faster at 4,096;
with 256-column items a tie and 19% faster; with the rows stored 16 bytes a thread 11.8% and
13% faster (10.94 against 12.40 ms, 2.60 against 3.00), results identical to the Triton
kernel's. In ncu at T=33,863 (a capture at 82b2dc8, since replaced) it took 2.74 ms with
the tensor pipe 54% busy, its warpgroups waiting most on their wgmmas and, 12% of the samples,
on a ring slot's copy, which warpgroup 0 then issued a step after the slot's use. A load warp
of its own (`_down_loads`, the dense kernel's `ring_loads`) took the whole call 2.1-3.2%
faster at T=4,096 and 33,863, results identical
(raw/logs/h200-moe-w8a8-down-load-warp-ab-5de571f-20261204T1250.txt); recaptured with it (at
5156886, ncu/moe-w8a8-T33863-fmtfp8) the kernel takes 2.66 ms, the tensor pipe 59% busy, and
7% of its samples wait for a slot.

An expert's last row tile often holds few rows (at T=33,863 under uniform routing 16% of the
row tiles hold at most 64, at 4,096 55%). On such an item warpgroup 1, whose 64 rows are all
padding, releases the item's slots unread (`pass_item`) and warpgroup 0 multiplies alone.
moe_w8a8 took 0.985-0.991 of its time before at T=33,863, 0.975-0.990 at 4,096 and
0.982-0.992 at 1,024, results identical (four rounds in turns,
raw/logs/h200-moe-w8a8-gate-up-pass-l2-363a5d5-*; 0.981-0.991, 0.984-0.990 and 0.967-0.986
in three earlier rounds, h200-moe-pass-padding-rows-ab-5b51a81-*, its w8a8-down rows). Giving
each warpgroup one of such an item's two column tiles instead was a tie with it
(h200-moe-w8a8-down-split-half-items-ab-78d4936-*). gate/up does not pass
(`w8a8_gate_up_wgmma` says why), nor do the bf16 kernels: in them the same change made flat on
bf16 experts 17-19% slower at T=33,863 (the 5b51a81 log).

Gluon has no interpreter: the CPU tests compile it for sm_90 and read its SASS
(scripts/dense_wgmma_sass.py --kernel moe-down); the GPU tests compare `moe_w8a8` with and
without it.
"""

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernels.compiled import launch
from kernels.dense.w8a8_wgmma import (
    MAX_CONSUMER_REGS,
    SHARED_MEMORY,
    TMA_LOAD_REGS,
    allocate_ring,
    check_consumer_regs,
    descriptor,
    issue_load,
    released_slot,
    ring_loads,
)
from kernels.moe.routing import MoeShape
from kernels.moe.tiles import locate_rows, write_tile_info

if TYPE_CHECKING:  # flat imports the modules that import this one
    from kernels.moe.flat import FlatLayout

BLOCK = 128  # the weight block: an item's width and a K step
ROWS = 128  # an item's rows: one expert row tile, two warpgroups of wgmma's 64
WG_ROWS = 64
WIDE = 2 * BLOCK  # an item's columns: two weight blocks, which share the step's rows of h
_BLOCK = gl.constexpr(BLOCK)
_ROWS = gl.constexpr(ROWS)
_WG_ROWS = gl.constexpr(WG_ROWS)
_WIDE = gl.constexpr(WIDE)
# Ring slots: 48 KB each (h's 128 x 128 and the weights' 256 x 128), as many as fit.
DEFAULT_STAGES = 4
LOAD_WARPS = gl.constexpr(4)  # gate/up's load partition: 128 threads, 8 16-byte copies each
LOAD_REGS = gl.constexpr(64)


@triton.jit
def _row_table_kernel(
    sorted_slots_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr, slot_weights_ptr,
    row_weights_ptr, tile_info_ptr, num_experts, STEPS: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """Row tile program_id(0), if it is one: its table entry and its rows' routing weights."""
    row_tile = tl.program_id(0)
    if row_tile < tl.load(tile_offsets_ptr + num_experts):
        expert, rows, row_ok, _, _ = locate_rows(
            row_tile, 1, 1, tile_offsets_ptr, offsets_ptr, counts_ptr, num_experts, BLOCK_M, STEPS
        )
        slots = tl.load(sorted_slots_ptr + rows, mask=row_ok, other=0)
        write_tile_info(row_tile, expert, rows, row_ok, slots, slot_weights_ptr,
                        row_weights_ptr, tile_info_ptr)  # fmt: skip


@gluon.jit
def item_place(item, items, col_tiles, expert_rows, col_rows, tile_info_ptr):
    """(expert, first sorted row, rows it owns, first weight row, column tile) of work item
    `item` (row tile item // col_tiles, column tile item % col_tiles), from the table of row
    tiles (`tiles.write_tile_info`), with the experts' weights stacked expert_rows apart and an
    item's col_rows weight rows wide; an item past `items` owns no rows. Three loads side by
    side, where a binary search over the experts would chain nine. The bf16 kernels share it."""
    col_tile = item % col_tiles
    info = tile_info_ptr + 4 * (gl.maximum(gl.minimum(item, items - 1), 0) // col_tiles)
    expert = gl.load(info)
    first_row = gl.load(info + 1)
    owned = gl.where(item < items, gl.load(info + 2), 0)
    return expert, first_row, owned, expert * expert_rows + col_tile * col_rows, col_tile


@gluon.jit
def second_box(a_rows, w_tile, acc, acc_2, scale_2, empty_slot):
    """A K step's second wgmma, on the slot's second weight box: issue it, wait, release the
    slot and fold the product into acc_2; return (product, acc_2). `acc` is its (unused)
    input so that the rescale into acc before it stays above it; with `product` there, the
    rescale sank below the wgmma and read its registers. The W8A8 gate/up kernel shares it."""
    running = warpgroup_mma(a_rows, w_tile.slice(_BLOCK, _BLOCK, dim=0).permute((1, 0)), acc,
                            use_acc=False, is_async=True)  # fmt: skip
    product = warpgroup_mma_wait(num_outstanding=0, deps=(running,))
    mbarrier.arrive(empty_slot, count=1)
    return product, acc_2 + product * scale_2[:, None]


@gluon.jit
def pass_item(ready, empty, step, k_steps):
    """Release an item's k_steps ring slots unread, each once its copy has landed, and return
    the step after them. Warpgroup 1 does this on an item whose rows warpgroup 0 holds alone
    (module docstring), so the tensor cores do no work on its 64 padding rows. The wait keeps
    it in step: a slot's empty barrier counts one release from each warpgroup, so releasing a
    slot's next use before warpgroup 0 released this one would complete the barrier early."""
    SLOTS: gl.constexpr = ready.type.shape[0]
    for _ in range(k_steps):
        slot = step % SLOTS
        mbarrier.wait(ready.index(slot), (step // SLOTS) & 1)
        mbarrier.arrive(empty.index(slot), count=1)
        step += 1
    return step


@gluon.jit
def _consumer(args, WARPGROUP: gl.constexpr):
    """Rows 64 WARPGROUP + [0, 64) of every item this program owns; warpgroup 1 passes over
    an item whose rows are all padding (`pass_item`).

    Per K step: wait for the slot's copy, issue the wgmma, load the next step's scales (after
    an item's last step, the next item's first) while it runs, wait for it, release the
    slot, and fold the product into the accumulator with the scales loaded a step before.
    What an item's epilogue and the next item need (its rows' slots and routing weights, the
    next item's place) is loaded when the item starts, so no round trip to L2 stands between
    two items. The ring is refilled by the load warp (`_down_loads`).
    """
    (a_ring, w_ring, ready, empty, hs_ptr, ws_ptr, y_ptr, sorted_slots_ptr, row_weights_ptr,
     tile_info_ptr, items, hidden, k_steps, my_items, stride_hsk, stride_wse, stride_wsn,
     stride_wsk, stride_yr) = args  # fmt: skip
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BLOCK, 32]
    )
    offsets = WARPGROUP * _WG_ROWS + gl.arange(0, _WG_ROWS, layout=gl.SliceLayout(1, layout))
    col_tiles = hidden // _WIDE
    programs = gl.num_programs(0)
    product = gl.zeros((_WG_ROWS, _BLOCK), gl.float32, layout)
    step = 0
    item = gl.program_id(0)
    expert, first_row, owned, _, col_tile = item_place(item, items, col_tiles, hidden, _WIDE,
                                                       tile_info_ptr)  # fmt: skip
    w_scales = ws_ptr + expert * stride_wse + 2 * col_tile * stride_wsn
    sa = gl.load(hs_ptr + first_row + offsets, mask=offsets < owned, other=0.0)
    sw = gl.load(w_scales)
    sw_2 = gl.load(w_scales + stride_wsn)
    for _ in range(my_items):
        rows = first_row + offsets
        mine = offsets < owned
        slots = gl.load(sorted_slots_ptr + rows, mask=mine, other=0).to(gl.int64)
        weights = gl.load(row_weights_ptr + rows, mask=mine, other=0.0)
        next_expert, next_row, next_owned, _, next_col = item_place(
            item + programs, items, col_tiles, hidden, _WIDE, tile_info_ptr
        )
        next_w_scales = ws_ptr + next_expert * stride_wse + 2 * next_col * stride_wsn
        if owned > WARPGROUP * _WG_ROWS:
            acc = gl.zeros((_WG_ROWS, _BLOCK), gl.float32, layout)
            acc_2 = gl.zeros((_WG_ROWS, _BLOCK), gl.float32, layout)  # the second column tile's
            for k_step in range(k_steps):
                slot = step % SLOTS
                more = k_step + 1 < k_steps
                # This step's scales, taken before the next step's are loaded into the same
                # names: a loaded register then stays where it lands until the next step reads
                # it, where copying it across the loop's end waited for the load (ncu: 11% of
                # the samples, long scoreboard on that copy).
                scale = sa * sw
                scale_2 = sa * sw_2
                mbarrier.wait(ready.index(slot), (step // SLOTS) & 1)
                a_rows = a_ring.index(slot).slice(WARPGROUP * _WG_ROWS, _WG_ROWS, dim=0)
                w_tile = w_ring.index(slot)
                running = warpgroup_mma(a_rows, w_tile.slice(0, _BLOCK, dim=0).permute((1, 0)),
                                        product, use_acc=False, is_async=True)  # fmt: skip
                sa = gl.load(
                    hs_ptr + gl.where(more, (k_step + 1) * stride_hsk + rows, next_row + offsets),
                    mask=gl.where(more, mine, offsets < next_owned), other=0.0,
                )  # fmt: skip
                next_sw_ptr = gl.where(more, w_scales + (k_step + 1) * stride_wsk, next_w_scales)
                sw = gl.load(next_sw_ptr)
                sw_2 = gl.load(next_sw_ptr + stride_wsn)
                product = warpgroup_mma_wait(num_outstanding=0, deps=(running,))
                acc += product * scale[:, None]
                product, acc_2 = second_box(a_rows, w_tile, acc, acc_2, scale_2,
                                            empty.index(slot))  # fmt: skip
                step += 1
            store_rows(y_ptr, slots, mine, col_tile * _WIDE, acc * weights[:, None], stride_yr)
            store_rows(y_ptr, slots, mine, col_tile * _WIDE + _BLOCK, acc_2 * weights[:, None],
                        stride_yr)  # fmt: skip
        else:  # an expert's last tile of at most 64 rows: warpgroup 0 multiplies them alone
            step = pass_item(ready, empty, step, k_steps)
            sa = gl.load(hs_ptr + next_row + offsets, mask=offsets < next_owned, other=0.0)
            sw = gl.load(next_w_scales)
            sw_2 = gl.load(next_w_scales + stride_wsn)
        item += programs
        expert, first_row, owned, col_tile = next_expert, next_row, next_owned, next_col
        w_scales = next_w_scales


@gluon.jit
def gather_loads(x_ptr, stride_x, top_k, w_desc, a_ring, w_ring, ready, empty,
                  sorted_slots_ptr, tile_info_ptr, items, col_tiles, k_steps, expert_rows,
                  col_rows, second, my_items):  # fmt: skip
    """The gate/up load warps (LOAD_WARPS, a partition of their own): every step of this
    program's items in order, once both warpgroups have released the step SLOTS before: the
    two weight boxes by TMA, and the item's 128 rows of x (bf16 or FP8, 128 bytes a step),
    gathered by token, by the threads' cp.async, 16 bytes a copy; each thread arrives on the
    slot's barrier when its copies land. The MoE bf16 and W8A8 gate/up kernels share it."""
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    A_ROWS: gl.constexpr = a_ring.type.shape[1]
    A_COLS: gl.constexpr = a_ring.type.shape[2]
    gl.static_assert(A_COLS * a_ring.dtype.primitive_bitwidth == 1024, "128-byte rows a step")
    layout: gl.constexpr = gl.BlockedLayout([1, A_COLS // 8], [4, 8], [LOAD_WARPS, 1], [1, 0])
    offsets = gl.arange(0, A_ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, A_COLS, layout=gl.SliceLayout(0, layout))
    BOX: gl.constexpr = w_desc.block_type.shape[0]
    total = my_items * k_steps
    item = gl.program_id(0)
    k_step = 0
    _, first_row, owned, w_row, _ = item_place(item, items, col_tiles, expert_rows, col_rows,
                                               tile_info_ptr)  # fmt: skip
    mine = offsets < owned
    tokens = gl.load(sorted_slots_ptr + first_row + offsets, mask=mine, other=0) // top_k
    row_ptrs = x_ptr + tokens.to(gl.int64) * stride_x
    for step in range(total):
        slot = step % SLOTS
        if step >= SLOTS:
            released_slot(empty, step, SLOTS)
        bar = ready.index(slot)
        mbarrier.expect(bar, 2 * w_desc.block_type.nbytes)
        w_slot = w_ring.index(slot)
        k = k_step * A_COLS
        tma.async_copy_global_to_shared(w_desc, [w_row, k], bar, w_slot.slice(0, BOX))
        tma.async_copy_global_to_shared(w_desc, [w_row + second, k], bar,
                                        w_slot.slice(BOX, BOX))  # fmt: skip
        async_copy.async_copy_global_to_shared(a_ring.index(slot),
                                               row_ptrs[:, None] + (k + cols)[None, :],
                                               mask=mine[:, None])  # fmt: skip
        async_copy.mbarrier_arrive(bar, increment_count=False)
        k_step += 1
        if k_step == k_steps:
            k_step = 0
            item += gl.num_programs(0)
            _, first_row, owned, w_row, _ = item_place(item, items, col_tiles, expert_rows,
                                                       col_rows, tile_info_ptr)  # fmt: skip
            mine = offsets < owned
            tokens = gl.load(sorted_slots_ptr + first_row + offsets, mask=mine, other=0) // top_k
            row_ptrs = x_ptr + tokens.to(gl.int64) * stride_x


@gluon.jit
def store_rows(y_ptr, slots, mine, first_col, values, stride_yr):
    """y[slots, first_col + [0, 128)] = values (this warpgroup's rows of one column tile) in
    y's dtype, 16 bytes a thread: each warp writes two whole 256-byte rows an instruction,
    where the wgmma layout's pairs would write 4 bytes a thread, 16 bytes a row."""
    rows_layout: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[4, 1], order=[1, 0]
    )
    out = gl.convert_layout(values.to(y_ptr.dtype.element_ty), rows_layout)
    slots = gl.convert_layout(slots, gl.SliceLayout(1, rows_layout))
    mine = gl.convert_layout(mine, gl.SliceLayout(1, rows_layout))
    cols = first_col + gl.arange(0, _BLOCK, layout=gl.SliceLayout(0, rows_layout))
    gl.store(y_ptr + slots[:, None] * stride_yr + cols[None, :], out, mask=mine[:, None])


@gluon.jit
def _w8a8_down_wgmma_kernel(
    h_desc, w_desc, hs_ptr, ws_ptr, y_ptr, sorted_slots_ptr, row_weights_ptr, tile_info_ptr,
    tile_offsets_ptr, num_experts, hidden, inter, stride_hsk, stride_wse, stride_wsn,
    stride_wsk, stride_yr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):  # fmt: skip
    a_ring, w_ring, ready, empty = allocate_ring(h_desc, w_desc, STAGES)
    col_tiles = hidden // _WIDE
    k_steps = inter // _BLOCK
    items = gl.load(tile_offsets_ptr + num_experts) * col_tiles
    my_items = gl.cdiv(items - gl.program_id(0), gl.num_programs(0))
    args = (a_ring, w_ring, ready, empty, hs_ptr, ws_ptr, y_ptr, sorted_slots_ptr,
            row_weights_ptr, tile_info_ptr, items, hidden, k_steps, my_items, stride_hsk,
            stride_wse, stride_wsn, stride_wsk, stride_yr)  # fmt: skip
    loads = (h_desc, w_desc, a_ring, w_ring, ready, empty, tile_info_ptr, items, col_tiles,
             hidden, k_steps, my_items)  # fmt: skip
    gl.warp_specialize([(_consumer, (args, 0)), (_bottom_rows, (args,)), (_down_loads, loads)],
                       [4, 1], [CONSUMER_REGS, TMA_LOAD_REGS])  # fmt: skip


# Warpgroup 0, the default partition, runs _consumer with its arguments as written; warpgroup
# 1, a worker, through a wrapper that names it.
@gluon.jit
def _bottom_rows(args):
    """Warpgroup 1 (a worker partition): each item's last 64 rows."""
    _consumer(args, 1)


@gluon.jit
def _down_loads(h_desc, w_desc, a_ring, w_ring, ready, empty, tile_info_ptr, items, col_tiles,
                hidden, k_steps, my_items):  # fmt: skip
    """The load warp over this program's items (`ring_loads`, the dense kernel's)."""
    ring_loads(h_desc, w_desc, a_ring, w_ring, ready, empty, k_steps, my_items, _item_rows,
               (items, col_tiles, hidden, tile_info_ptr), issue_load)  # fmt: skip


@gluon.jit
def _item_rows(item, where):
    """(first sorted row of h, first weight row, and 0: one weight box a slot) of work item
    `item` (`item_place`)."""
    items, col_tiles, hidden, tile_info_ptr = where
    _, first_row, _, w_row, _ = item_place(item, items, col_tiles, hidden, _WIDE, tile_info_ptr)
    return first_row, w_row, 0


def runs_on(hidden: int, inter: int) -> bool:
    """Whether the kernel takes these expert shapes: H in whole items, I in whole K steps."""
    return hidden % WIDE == 0 and inter % BLOCK == 0


def expert_descriptors(rows: Tensor, weights: Tensor, weight_box: int, block_k: int):
    """(a_desc, w_desc): TMA descriptors of activation rows (slots or tokens, K) in 128-row
    boxes and of the experts' weights (E, N, K) viewed as (E * N, K) in weight_box-row boxes,
    both block_k wide. The MoE Gluon kernels share it; where rows are gathered, a_desc only
    gives the ring slots their shape and swizzle."""
    return descriptor(rows, [ROWS, block_k]), descriptor(weights.reshape(-1, weights.shape[-1]),
                                                         [weight_box, block_k])  # fmt: skip


def down_wgmma(
    h8: Tensor,
    hs: Tensor,
    y: Tensor,
    down: Tensor,
    down_scale: Tensor,
    sorted_slots: Tensor,
    row_weights: Tensor,
    tile_info: Tensor,
    tile_offsets: Tensor,
    programs: int,
    num_stages: int = DEFAULT_STAGES,
    consumer_regs: int = MAX_CONSUMER_REGS,
) -> None:
    """y[slot] = routing weight * (h8 * hs)[sorted row] @ down[expert].T for every routed
    slot, in y's dtype: h8 (slots, I) FP8 in sorted order and hs (I / 128, slots) its
    scales, down (E, H, I) FP8 in 128 x 128 blocks with down_scale (E, H / 128, I / 128);
    sorted_slots and row_weights each sorted row's slot and routing weight, tile_info the
    (expert, first row, rows owned) of each 128-row tile and tile_offsets its scan per
    expert (`row_table`, `flat.FlatLayout`); `programs` persistent programs."""
    check_consumer_regs(consumer_regs)
    experts, hidden, inter = down.shape
    if not runs_on(hidden, inter) or not down.is_contiguous() or not h8.is_contiguous():
        raise ValueError(
            f"the wgmma down kernel takes contiguous h8 and down weights with H in whole "
            f"{WIDE}-wide items and I in {BLOCK}-wide blocks; got down {tuple(down.shape)}."
        )
    slot_bytes = (ROWS + WIDE) * BLOCK
    stages_fit = (SHARED_MEMORY - 4096) // slot_bytes
    if not 2 <= num_stages <= stages_fit:
        raise ValueError(
            f"num_stages must be from 2 to {stages_fit} (ring slots of "
            f"{slot_bytes // 1024} KB), got {num_stages}."
        )
    h_desc, w_desc = expert_descriptors(h8, down, WIDE, BLOCK)
    grid = max(1, min(programs, tile_info.shape[0] * (hidden // WIDE)))
    launch(
        _w8a8_down_wgmma_kernel, (grid,), h_desc, w_desc, hs, down_scale, y, sorted_slots,
        row_weights, tile_info, tile_offsets, experts, hidden, inter, hs.stride(0),
        *down_scale.stride(), y.stride(0), STAGES=num_stages, CONSUMER_REGS=consumer_regs,
        num_warps=4,
    )  # fmt: skip


def row_table(layout: "FlatLayout", shape: MoeShape, rows: int = ROWS) -> tuple[Tensor, Tensor]:
    """(row_weights, tile_info): each sorted row's routing weight, and each `rows`-row tile's
    (expert, first row, rows owned) (`tiles.write_tile_info`)."""
    slots = shape.tokens * shape.top_k
    device = layout.sorted_slots.device
    row_weights = torch.empty(slots, dtype=torch.float32, device=device)
    tile_info = torch.empty(layout.row_tiles, 4, dtype=torch.int32, device=device)
    launch(
        _row_table_kernel, (max(1, layout.row_tiles),), layout.sorted_slots, layout.counts,
        layout.offsets, layout.tile_offsets, layout.slot_weights, row_weights, tile_info,
        shape.experts, STEPS=max(shape.experts - 1, 0).bit_length(), BLOCK_M=rows, num_warps=4,
    )  # fmt: skip
    return row_weights, tile_info
