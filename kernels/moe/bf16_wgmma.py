"""The routed experts' bf16 prefill on Hopper's wgmma, in Gluon: gate/up and down as persistent
grouped GEMMs over rows sorted by expert.

At T=33,863 the flat scheduler's Triton kernels ran the TP2 rank's bf16 experts at 48% of
cuBLAS's dense bf16 rate, slower than torch's bare `_grouped_mm` pair: Triton pipelines a work
item's loads inside the item, so each 128 x 128 item fills its pipeline from memory and drains
it, and its activation rows are gathered by per-row pointers. Here both projections run as the
W8A8 down kernel (`w8a8_wgmma`) runs: persistent programs whose TMA ring runs across items, two
consumer warpgroups of 64 rows, an item 128 rows by two 128-row weight boxes. Without FP8's
scales there is nothing to promote, so each box's product accumulates in its wgmma, and a
step's two wgmmas stay in flight while the next step's are issued (one wait a step, for the
step before, whose slot is then released).

Both kernels read a table of row tiles (expert, first sorted row, rows owned) and each sorted
row's routing weight, which `w8a8_wgmma.row_table` writes, in place of a search. Then:
- gate/up: an item is one expert row tile and 128 columns of I; its two boxes are those
  columns' gate rows and up rows of (E * 2I, H). Hopper's TMA cannot gather rows, so a third
  partition of four load warps copies the item's 128 rows of x, row p being the token of the
  p-th slot sorted by expert, into the slot with cp.async, 16 bytes a copy, and arrives on
  the slot's barrier when its copies land (the weight boxes still come by TMA); the
  consumers fence the rows for wgmma's async proxy. The epilogue stores silu(gate) * up in
  bf16 at the rows' sorted places of h;
- down: an item is one row tile and 256 columns of H (two boxes of (E * H, I)), the rows of h
  by TMA, issued by warpgroup 0 between its steps; the epilogue stores each row times its
  routing weight at its slot of y for `combine`.
Rows of a tile past the expert's count are not stored: down's TMA reads the next expert's
rows there (or zeros past the end), gate/up's load warps copy nothing for them.

On the H200 at the TP2 rank's shape (T=33,863, uniform routing), the call takes 14.74 ms in
the newest bench, 62.5% of cuBLAS's dense bf16 rate measured in the same run, against 15.83 for
torch's bare `_grouped_mm` pair (raw/bench-moe-dsv4-flash-tp2-20261202T091055); the same
kernels read 62.2 to 66.4% in three earlier runs (14.11 to 14.60 ms; …T062755, …T063814,
…T082824: the card holds the timed calls at its 700 W cap, where its SM clock sat at 1,395 to
1,410 MHz, raw/logs/h200-moe-prefill-gaps-clocks-*.csv), and the Triton kernels 18.68 ms
(…T043943).
Each step, in one probe run a commit (raw/logs/h200-moe-bf16-gluon-probe-*.csv): the first
version, with x copied into sorted order before gate/up, 15.64 ms against the
Triton kernels' 19.31 (the copy 1.03 ms); the copy reading each token's row once, 0.66 ms; a
TMA producer warp in place of warpgroup 0's refills, no gain; the rows gathered in gate/up,
no copy, gate/up 0.2 ms slower, the call's GPU time 0.41 ms less. In ncu
(ncu/moe-flat-T33863-fmtbf16) the tensor pipe is 87% busy in gate/up and 85% in down. The
padding rows of each expert's last tile are 17% of the MMA work here, but not 17% of the time:
an item's bytes do not shrink with its rows, and at 48 KB a K step for 128 x 256 x 64 MACs the
ring already asks about 10 TB/s of L2 across the card. Running tiles of 64 rows or fewer as
half items (both warpgroups on their 64 rows, the columns split) did not pay
(raw/logs/h200-moe-bf16-half-items-*.csv): chosen per item inside the kernel, gate/up took
11.06 ms against 7.69; as launches of their own, the half items' kernel re-read every expert's
weights from HBM (1.66 ms for 15% of the items). Nor did letting warpgroup 1 skip the wgmmas
of the items where it owns no rows (commits 9ee0b05, 53354a3; one process, alternated): at
T=33,863 this call took 17.16 ms against 14.61 and moe_w8a8 9.76 against 9.40, and only
moe_w8a8 at 4,096 gained (2.24 against 2.27; raw/logs/h200-moe-prefill-idle-rows-*.csv).
Items that finish early pull the programs apart, and an expert's weights are shared in L2
only while the programs on its row tiles run together. Fewer bytes a MAC (a pair of programs
sharing each weight box by TMA multicast) is what is left to try.

Gluon has no interpreter: the CPU tests compile both kernels for sm_90 and read their SASS
(scripts/dense_wgmma_sass.py --kernel moe-bf16-gate-up / moe-bf16-down); the GPU tests compare
them with the flat scheduler's Triton kernels.
"""

from typing import TYPE_CHECKING

import torch
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from kernels.compiled import launch
from kernels.dense.w8a8_wgmma import (
    SHARED_MEMORY,
    allocate_ring,
    issue_load,
    released_slot,
)
from kernels.moe.formats import MoeWeights
from kernels.moe.routing import MoeShape
from kernels.moe.routing_kernels import combine
from kernels.moe.w8a8_wgmma import (  # ROWS: an item's rows, two warpgroups of wgmma's 64
    LOAD_REGS,
    LOAD_WARPS,
    ROWS,
    WG_ROWS,
    expert_descriptors,
    gather_loads,
    item_place,
    row_table,
    store_rows,
)
from kernels.moe.widen import widened

if TYPE_CHECKING:  # flat imports this module to run it
    from kernels.moe.flat import FlatLayout

BOX = 128  # weight rows a TMA box, an accumulator's columns; an item has two boxes
BLOCK_K = 64  # a K step: 128-byte rows of bf16, TMA's widest swizzle
_WG_ROWS = gl.constexpr(WG_ROWS)
_BOX = gl.constexpr(BOX)
# Ring slots: 48 KB each (the rows' 128 x 64 and the two boxes' 256 x 64), as many as fit
# beside the epilogue's layout conversion.
DEFAULT_STAGES = 4
DEFAULT_LAG = 0  # the slot refilled is the one just released: loads run STAGES - 1 steps ahead
CONSUMER_REGS = {True: 224, False: 232}  # by SWIGLU: what the load warps leave of 64K


@gluon.jit
def _issue(a_ring, w_ring, ready, step, acc, acc_2, WARPGROUP: gl.constexpr,
           USE_ACC: gl.constexpr, GATHERED: gl.constexpr):  # fmt: skip
    """Wait for `step`'s copy and issue this warpgroup's wgmmas of its slot, one a box. Rows
    the threads' cp.async wrote (GATHERED) are fenced for wgmma, which reads them through the
    async proxy."""
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    slot = step % SLOTS
    mbarrier.wait(ready.index(slot), (step // SLOTS) & 1)
    if GATHERED:
        fence_async_shared()
    a_rows = a_ring.index(slot).slice(WARPGROUP * _WG_ROWS, _WG_ROWS, dim=0)
    w_tile = w_ring.index(slot)
    acc = warpgroup_mma(a_rows, w_tile.slice(0, _BOX, dim=0).permute((1, 0)), acc,
                        use_acc=USE_ACC, is_async=True)  # fmt: skip
    acc_2 = warpgroup_mma(a_rows, w_tile.slice(_BOX, _BOX, dim=0).permute((1, 0)), acc_2,
                          use_acc=USE_ACC, is_async=True)  # fmt: skip
    return acc, acc_2


@gluon.jit
def _release(a_desc, w_desc, a_ring, w_ring, ready, empty, released, total, cursor, k_steps,
             tile_info_ptr, items, col_tiles, expert_rows, col_rows, second, LAG,
             WARPGROUP: gl.constexpr, REFILLS: gl.constexpr):  # fmt: skip
    """Release the slot of step `released`; where the consumers load (REFILLS: down),
    warpgroup 0 then refills the slot released LAG steps before (once both warpgroups have)
    with the step the cursor (item, K step, its rows' and first box's first rows) points at,
    and returns the cursor advanced."""
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    load_item, load_k, load_row, load_w_row = cursor
    mbarrier.arrive(empty.index(released % SLOTS), count=1)
    if REFILLS and WARPGROUP == 0 and released >= LAG:
        issue_load(a_desc, w_desc, a_ring, w_ring, ready,
                   released_slot(empty, released, LAG), total, load_row, load_w_row, load_k,
                   load_w_row + second)  # fmt: skip
        load_k += 1
        if load_k == k_steps:
            load_k = 0
            load_item += gl.num_programs(0)
            _, load_row, _, load_w_row, _ = item_place(load_item, items, col_tiles,
                                                       expert_rows, col_rows,
                                                       tile_info_ptr)  # fmt: skip
    return load_item, load_k, load_row, load_w_row


@gluon.jit
def _consumer(args, WARPGROUP: gl.constexpr, SWIGLU: gl.constexpr):
    """Rows 64 WARPGROUP + [0, 64) of every item this program owns: per K step, wait for the
    slot's copy, issue the two boxes' wgmmas, wait for the step before's and release its
    slot (the first step starts the accumulators, so only wgmmas write them while one is in
    flight); after an item's last step, wait for all and store (module docstring). Warpgroup
    0 runs it as the default partition, warpgroup 1 through a worker wrapper (`_gate_up_bottom`,
    `_down_bottom`)."""
    (a_desc, w_desc, a_ring, w_ring, ready, empty, out_ptr, sorted_slots_ptr, row_weights_ptr,
     tile_info_ptr, items, col_tiles, k_steps, expert_rows, col_rows, second, my_items,
     stride_out, LAG) = args  # fmt: skip
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BOX, 16]
    )
    offsets = WARPGROUP * _WG_ROWS + gl.arange(0, _WG_ROWS, layout=gl.SliceLayout(1, layout))
    programs = gl.num_programs(0)
    total = my_items * k_steps
    places = (tile_info_ptr, items, col_tiles, expert_rows, col_rows)
    # The refill cursor: step SLOTS (the prologue loaded 0 .. SLOTS - 1), as an item and K step.
    load_item = gl.program_id(0) + (SLOTS // k_steps) * programs
    _, load_row, _, load_w_row, _ = item_place(load_item, items, col_tiles, expert_rows,
                                               col_rows, tile_info_ptr)  # fmt: skip
    cursor = (load_item, SLOTS % k_steps, load_row, load_w_row)
    acc = gl.zeros((_WG_ROWS, _BOX), gl.float32, layout)
    acc_2 = gl.zeros((_WG_ROWS, _BOX), gl.float32, layout)  # the second box's columns
    step = 0
    item = gl.program_id(0)
    for _ in range(my_items):
        _, first_row, owned, _, col_tile = item_place(item, items, col_tiles, expert_rows,
                                                      col_rows, tile_info_ptr)  # fmt: skip
        rows = first_row + offsets
        mine = offsets < owned
        if SWIGLU:
            out_rows = rows.to(gl.int64)
        else:
            out_rows = gl.load(sorted_slots_ptr + rows, mask=mine, other=0).to(gl.int64)
            weights = gl.load(row_weights_ptr + rows, mask=mine, other=0.0)
        acc, acc_2 = _issue(a_ring, w_ring, ready, step, acc, acc_2, WARPGROUP, False, SWIGLU)
        # waits for nothing (both stay in flight): the loop carries tensors, not tokens
        acc, acc_2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_2))
        step += 1
        for _k in range(1, k_steps):
            acc, acc_2 = _issue(a_ring, w_ring, ready, step, acc, acc_2, WARPGROUP, True, SWIGLU)
            acc, acc_2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_2))
            cursor = _release(a_desc, w_desc, a_ring, w_ring, ready, empty, step - 1, total,
                              cursor, k_steps, *places, second, LAG, WARPGROUP,
                              not SWIGLU)  # fmt: skip
            step += 1
        acc, acc_2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_2))
        cursor = _release(a_desc, w_desc, a_ring, w_ring, ready, empty, step - 1, total,
                          cursor, k_steps, *places, second, LAG, WARPGROUP,
                          not SWIGLU)  # fmt: skip
        if SWIGLU:
            h = acc / (1.0 + gl.exp(-acc)) * acc_2
            store_rows(out_ptr, out_rows, mine, col_tile * _BOX, h, stride_out)
        else:
            store_rows(out_ptr, out_rows, mine, col_tile * 2 * _BOX, acc * weights[:, None],
                       stride_out)  # fmt: skip
            store_rows(out_ptr, out_rows, mine, col_tile * 2 * _BOX + _BOX,
                       acc_2 * weights[:, None], stride_out)  # fmt: skip
        item += programs


@gluon.jit
def _bf16_wgmma_kernel(
    a_desc, w_desc, out_ptr, x_ptr, stride_x, top_k, sorted_slots_ptr, row_weights_ptr,
    tile_info_ptr, tile_offsets_ptr, num_experts, col_tiles, k_steps, expert_rows, col_rows,
    second, stride_out, STAGES: gl.constexpr, LAG: gl.constexpr, SWIGLU: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
):  # fmt: skip
    """Gate/up (SWIGLU: rows gathered from x by the load warps) or down (rows of h by TMA,
    which warpgroup 0 issues between its steps)."""
    a_ring, w_ring, ready, empty = allocate_ring(a_desc, w_desc, STAGES, 2,
                                                 1 + 32 * LOAD_WARPS if SWIGLU else 1)  # fmt: skip
    items = gl.load(tile_offsets_ptr + num_experts) * col_tiles
    my_items = gl.cdiv(items - gl.program_id(0), gl.num_programs(0))
    args = (a_desc, w_desc, a_ring, w_ring, ready, empty, out_ptr, sorted_slots_ptr,
            row_weights_ptr, tile_info_ptr, items, col_tiles, k_steps, expert_rows, col_rows,
            second, my_items, stride_out, LAG)  # fmt: skip
    if SWIGLU:
        loads = (x_ptr, stride_x, top_k, w_desc, a_ring, w_ring, ready, empty,
                 sorted_slots_ptr, tile_info_ptr, items, col_tiles, k_steps, expert_rows,
                 col_rows, second, my_items)  # fmt: skip
        gl.warp_specialize([(_consumer, (args, 0, True)), (_gate_up_bottom, (args,)),
                            (gather_loads, loads)], [4, LOAD_WARPS],
                           [CONSUMER_REGS, LOAD_REGS])  # fmt: skip
    else:
        for first in gl.static_range(STAGES):
            item = gl.program_id(0) + (first // k_steps) * gl.num_programs(0)
            _, first_row, _, w_row, _ = item_place(item, items, col_tiles, expert_rows,
                                                   col_rows, tile_info_ptr)  # fmt: skip
            issue_load(a_desc, w_desc, a_ring, w_ring, ready, first, my_items * k_steps,
                       first_row, w_row, first % k_steps, w_row + second)  # fmt: skip
        gl.warp_specialize([(_consumer, (args, 0, False)), (_down_bottom, (args,))], [4],
                           [CONSUMER_REGS])  # fmt: skip


# The default partition gets its arguments as written, constants included; a worker's arrive
# as runtime values, so warpgroup 1 of each projection has a wrapper that names its constants.
@gluon.jit
def _gate_up_bottom(args):
    """Gate/up, warpgroup 1 (the worker partition): each item's last 64 rows."""
    _consumer(args, 1, True)


@gluon.jit
def _down_bottom(args):
    """Down, warpgroup 1 (the worker partition): each item's last 64 rows."""
    _consumer(args, 1, False)


def runs_on(hidden: int, inter: int) -> bool:
    """Whether the kernels take these expert shapes: I in whole gate/up items and down K
    steps, H in whole down items and gate/up K steps."""
    return inter % BOX == 0 and hidden % (2 * BOX) == 0


def check_ring(num_stages: int, lag: int) -> None:
    """Ring slots are 48 KB: from 2 to as many as fit beside the epilogue's scratch; a slot is
    refilled from 0 to num_stages - 2 steps after its release (the refill must stay ahead)."""
    slot_bytes = 2 * (ROWS + 2 * BOX) * BLOCK_K
    stages_fit = (SHARED_MEMORY - 2 * WG_ROWS * BOX * 2) // slot_bytes
    if not isinstance(num_stages, int) or not 2 <= num_stages <= stages_fit:
        raise ValueError(f"num_stages must be from 2 to {stages_fit} (ring slots of "
                         f"{slot_bytes // 1024} KB), got {num_stages!r}.")  # fmt: skip
    if not isinstance(lag, int) or not 0 <= lag <= num_stages - 2:
        raise ValueError(f"lag must be from 0 to num_stages - 2 = {num_stages - 2}, got {lag!r}.")


def projection(
    rows: Tensor,
    weights: Tensor,
    out: Tensor,
    layout: "FlatLayout",
    row_weights: Tensor,
    tile_info: Tensor,
    programs: int,
    *,
    swiglu: bool,
    top_k: int = 1,
    num_stages: int = DEFAULT_STAGES,
    lag: int = DEFAULT_LAG,
) -> None:
    """One projection in bf16: gate/up (`swiglu`: rows is x (T, H), sorted row p's token is
    sorted_slots[p] // top_k; weights (E, 2I, H)) writes silu(gate) * up at the rows' sorted
    places of out (slots, I); down (rows is h, sorted; weights (E, H, I)) writes each row
    times its routing weight at its slot of out (slots, H)."""
    check_ring(num_stages, lag)
    experts, width, depth = weights.shape
    a_desc, w_desc = expert_descriptors(rows, weights, BOX, BLOCK_K)
    if swiglu:  # an item: 128 columns of I, its gate rows and, I rows below, its up rows
        col_tiles, col_rows, second = width // 2 // BOX, BOX, width // 2
    else:  # an item: 256 columns of H, two adjacent boxes
        col_tiles, col_rows, second = width // (2 * BOX), 2 * BOX, BOX
    grid = max(1, min(programs, tile_info.shape[0] * col_tiles))
    launch(
        _bf16_wgmma_kernel, (grid,), a_desc, w_desc, out, rows, rows.stride(0), top_k,
        layout.sorted_slots, row_weights, tile_info, layout.tile_offsets, experts, col_tiles,
        depth // BLOCK_K, width, col_rows, second, out.stride(0), STAGES=num_stages, LAG=lag,
        SWIGLU=swiglu, CONSUMER_REGS=CONSUMER_REGS[swiglu], num_warps=4,
    )  # fmt: skip


def moe_bf16_wgmma(
    x: Tensor, weights: MoeWeights, layout: "FlatLayout", shape: MoeShape, programs: int,
    num_stages: int = DEFAULT_STAGES, lag: int = DEFAULT_LAG,
) -> Tensor:  # fmt: skip
    """Routed-expert output (T, H) of bf16 x on the layout's 128-row tiles: the row table,
    gate/up, down, `combine`; four launches after the layout's. FP8 and INT4 experts are
    widened to bf16 one projection at a time, the experts with rows only (`widen`), one more
    launch each."""
    slots = shape.tokens * shape.top_k
    row_weights, tile_info = row_table(layout, shape)
    h = torch.empty(slots, shape.inter, dtype=x.dtype, device=x.device)
    options = {"num_stages": num_stages, "lag": lag}
    projection(x, widened(weights, "gate_up", layout.counts), h, layout, row_weights, tile_info,
               programs, swiglu=True, top_k=shape.top_k, **options)  # fmt: skip
    y = torch.empty(slots, shape.hidden, dtype=x.dtype, device=x.device)
    projection(h, widened(weights, "down", layout.counts), y, layout, row_weights, tile_info,
               programs, swiglu=False, **options)  # fmt: skip
    return combine(y, shape.tokens, shape.top_k, x.dtype)
