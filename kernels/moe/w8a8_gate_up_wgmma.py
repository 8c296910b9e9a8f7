"""The routed experts' W8A8 gate/up projection on Hopper's wgmma, in Gluon.

With the down projection on Gluon (`w8a8_wgmma`), the Triton gate/up kernel was two thirds of
`moe_w8a8` at T=33,863 (6.34 of 9.7 ms in ncu/moe-w8a8-T33863-fmtfp8, the tensor pipe 45%
busy). Here gate/up runs as the Gluon kernels do: persistent programs, an item one expert row
tile of 128 rows and one 128-column block of I, whose two weight boxes are that block's gate
rows and up rows of (E * 2I, H); each K step is one 128-wide block, so each box has one weight
scale a step. TMA cannot gather rows: the load warps (`w8a8_wgmma.gather_loads`, shared with
the bf16 kernel) copy the item's 128 rows of the FP8 activations, row p being the token of the
p-th slot sorted by expert, with cp.async, and the weight boxes by TMA. Each warpgroup's 64
rows promote and rescale as the down kernel's do (each step's fp32 product times the rows'
activation scales and the box's weight scale, added on the CUDA cores), and the epilogue
quantises silu(gate) * up per row over the block's 128 columns, exactly as the Triton kernel
(`w8a8._w8a8_gate_up_kernel`) does, into h8 at the rows' sorted places and hs[block, row].

On the H200 at the TP2 rank's shape (uniform routing), moe_w8a8 took 9.72 ms at T=33,863 with
it against 10.88 with the Triton gate/up, and 2.89 against 2.94 at T=4,096, results identical
(one run, raw/logs/h200-moe-w8a8-gluon-gate-up-probe-6f5efc6-20261202T0637.csv); in the bench
of the same commit (raw/bench-moe-dsv4-flash-tp2-20261202T063814) 9.58 ms, 751 TFLOP/s, 1.52
times flat on bf16 experts (14.60 ms, on the Gluon bf16 kernels) and 3.5 times DeepGEMM's
contiguous grouped GEMM with its torch glue, with no spills (the Triton gate/up spilled 6
bytes).

Its warpgroups do not pass over an expert's last row tile of at most 64 rows, as the down
kernel's do (`w8a8_wgmma.pass_item`). In one Nsight Compute process at T=33,863 that took the
kernel 5.16-5.17 ms against 4.70, 7.92-7.97 million cycles against 7.65 at 1.52 GHz against
1.61, its DRAM reads 16.8-17.0 GB against 7.1-7.2 and L2's hit rate 28-29% against 63-64%
(raw/logs/h200-moe-w8a8-gate-up-pass-l2-363a5d5-*). The likely reason, not measured directly:
its persistent programs walk the items in order, and while every item is the same work they
stay in step, so an expert's row tiles read each weight box (11.8 MB of weights an expert) at
about the same time; items of two costs let them drift apart. In turns the whole call was no
faster with it than with down's pass alone at 33,863, 16,384 and 4,096 rows (the same log). It
was faster only at 1,024 rows and below (that log and h200-moe-pass-padding-rows-ab-5b51a81-*),
where `moe_flat_w8a8` calls the flat kernels, not this one (under 32 rows an expert).

Gluon has no interpreter: the CPU tests compile it for sm_90 and read its SASS
(scripts/dense_wgmma_sass.py --kernel moe-w8a8-gate-up); the GPU tests compare `moe_w8a8` on
the Gluon kernels with the Triton ones.
"""

from typing import TYPE_CHECKING

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
from kernels.dense.w8a8_wgmma import allocate_ring
from kernels.fp8_quant import pow2_scale, round_to_e4m3
from kernels.moe.w8a8_wgmma import (
    BLOCK,
    DEFAULT_STAGES,
    LOAD_REGS,
    LOAD_WARPS,
    ROWS,
    expert_descriptors,
    gather_loads,
    item_place,
    second_box,
    store_rows,
)

if TYPE_CHECKING:
    from kernels.moe.flat import FlatLayout

_BLOCK = gl.constexpr(BLOCK)
_WG_ROWS = gl.constexpr(ROWS // 2)
CONSUMER_REGS = 224  # what the load warps leave of 64K registers to each consumer thread


@gluon.jit
def _consumer(args, WARPGROUP: gl.constexpr):
    """Rows 64 WARPGROUP + [0, 64) of every item this program owns. Per K step: wait for the
    slot, fence the gathered rows for wgmma, issue the gate box's wgmma, load the next step's
    scales while it runs, fold its product in, the same for the up box, release the slot."""
    (a_ring, w_ring, ready, empty, xs_ptr, ws_ptr, h8_ptr, hs_ptr, sorted_slots_ptr, tile_info_ptr,
     items, col_tiles, k_steps, top_k, inter, my_items, stride_xst, stride_wse, stride_wsn,
     stride_wsk, stride_hr, stride_hsk) = args  # fmt: skip
    SLOTS: gl.constexpr = a_ring.type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BLOCK, 32]
    )
    offsets = WARPGROUP * _WG_ROWS + gl.arange(0, _WG_ROWS, layout=gl.SliceLayout(1, layout))
    up_scales = (inter // _BLOCK) * stride_wsn  # the up blocks' scales, below the gate blocks'
    product = gl.zeros((_WG_ROWS, _BLOCK), gl.float32, layout)
    step = 0
    item = gl.program_id(0)
    for _ in range(my_items):
        expert, first_row, owned, _, col_tile = item_place(item, items, col_tiles, 2 * inter,
                                                           _BLOCK, tile_info_ptr)  # fmt: skip
        rows = first_row + offsets
        mine = offsets < owned
        tokens = gl.load(sorted_slots_ptr + rows, mask=mine, other=0) // top_k
        a_scales = xs_ptr + tokens.to(gl.int64) * stride_xst
        w_scales = ws_ptr + expert * stride_wse + col_tile * stride_wsn
        sa = gl.load(a_scales, mask=mine, other=0.0)
        sw = gl.load(w_scales)
        sw_2 = gl.load(w_scales + up_scales)
        acc = gl.zeros((_WG_ROWS, _BLOCK), gl.float32, layout)
        acc_2 = gl.zeros((_WG_ROWS, _BLOCK), gl.float32, layout)  # up's
        for k_step in range(k_steps):
            slot = step % SLOTS
            # Scales taken before the next step's load into the same names, as in the down
            # kernel (w8a8_wgmma._consumer): no copy waits for a load across the loop's end.
            scale = sa * sw
            scale_2 = sa * sw_2
            mbarrier.wait(ready.index(slot), (step // SLOTS) & 1)
            fence_async_shared()  # the rows came by the load warps' cp.async
            a_rows = a_ring.index(slot).slice(WARPGROUP * _WG_ROWS, _WG_ROWS, dim=0)
            w_tile = w_ring.index(slot)
            running = warpgroup_mma(a_rows, w_tile.slice(0, _BLOCK, dim=0).permute((1, 0)),
                                    product, use_acc=False, is_async=True)  # fmt: skip
            ahead = gl.minimum(k_step + 1, k_steps - 1)  # the last step loads its own again
            sa = gl.load(a_scales + ahead, mask=mine, other=0.0)
            sw = gl.load(w_scales + ahead * stride_wsk)
            sw_2 = gl.load(w_scales + up_scales + ahead * stride_wsk)
            product = warpgroup_mma_wait(num_outstanding=0, deps=(running,))
            acc += product * scale[:, None]
            product, acc_2 = second_box(a_rows, w_tile, acc, acc_2, scale_2, empty.index(slot))
            step += 1
        h = acc / (1.0 + gl.exp(-acc)) * acc_2
        scale, inverse = pow2_scale(gl.max(gl.abs(h), axis=1))
        h8 = round_to_e4m3(h * inverse[:, None]).to(gl.float8e4nv)  # the scaling is exact
        store_rows(h8_ptr, rows.to(gl.int64), mine, col_tile * _BLOCK, h8, stride_hr)
        gl.store(hs_ptr + col_tile * stride_hsk + rows, scale, mask=mine)
        item += gl.num_programs(0)


@gluon.jit
def _w8a8_gate_up_wgmma_kernel(
    a_desc, w_desc, x8_ptr, stride_x, xs_ptr, ws_ptr, h8_ptr, hs_ptr, sorted_slots_ptr,
    tile_info_ptr, tile_offsets_ptr, num_experts, hidden, inter, top_k, stride_xst,
    stride_wse, stride_wsn, stride_wsk, stride_hr, stride_hsk, STAGES: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
):  # fmt: skip
    a_ring, w_ring, ready, empty = allocate_ring(a_desc, w_desc, STAGES, 2, 1 + 32 * LOAD_WARPS)
    col_tiles = inter // _BLOCK
    k_steps = hidden // _BLOCK
    items = gl.load(tile_offsets_ptr + num_experts) * col_tiles
    my_items = gl.cdiv(items - gl.program_id(0), gl.num_programs(0))
    args = (a_ring, w_ring, ready, empty, xs_ptr, ws_ptr, h8_ptr, hs_ptr, sorted_slots_ptr,
            tile_info_ptr, items, col_tiles, k_steps, top_k, inter, my_items, stride_xst,
            stride_wse, stride_wsn, stride_wsk, stride_hr, stride_hsk)  # fmt: skip
    loads = (x8_ptr, stride_x, top_k, w_desc, a_ring, w_ring, ready, empty, sorted_slots_ptr,
             tile_info_ptr, items, col_tiles, k_steps, 2 * inter, _BLOCK, inter,
             my_items)  # fmt: skip
    gl.warp_specialize([(_consumer, (args, 0)), (_bottom_rows, (args,)), (gather_loads, loads)],
                       [4, LOAD_WARPS], [CONSUMER_REGS, LOAD_REGS])  # fmt: skip


# Warpgroup 0, the default partition, gets its arguments as written; a worker's arrive as
# runtime values, so warpgroup 1 has a wrapper that names it.
@gluon.jit
def _bottom_rows(args):
    """Warpgroup 1 (a worker partition): each item's last 64 rows."""
    _consumer(args, 1)


def gate_up_wgmma(
    x8: Tensor,
    xs: Tensor,
    h8: Tensor,
    hs: Tensor,
    gate_up: Tensor,
    gate_up_scale: Tensor,
    layout: "FlatLayout",
    tile_info: Tensor,
    top_k: int,
    programs: int,
    num_stages: int = DEFAULT_STAGES,
) -> None:
    """h8[row], hs[block, row] = FP8 silu(gate) * up of every sorted row (its token's x8 row
    times the expert's gate/up), quantised per row and 128-column block, as the Triton kernel
    writes them: x8 (T, H) FP8 with scales xs (T, H / 128), gate_up (E, 2I, H) FP8 in
    128 x 128 blocks with gate_up_scale (E, 2I / 128, H / 128), tile_info the row table
    (`w8a8_wgmma.row_table`); `programs` persistent programs."""
    experts, width, hidden = gate_up.shape
    inter = width // 2
    a_desc, w_desc = expert_descriptors(x8, gate_up, BLOCK, BLOCK)
    grid = max(1, min(programs, tile_info.shape[0] * (inter // BLOCK)))
    launch(
        _w8a8_gate_up_wgmma_kernel, (grid,), a_desc, w_desc, x8, x8.stride(0), xs,
        gate_up_scale, h8, hs, layout.sorted_slots, tile_info, layout.tile_offsets, experts,
        hidden, inter, top_k, xs.stride(0), *gate_up_scale.stride(), h8.stride(0),
        hs.stride(0), STAGES=num_stages, CONSUMER_REGS=CONSUMER_REGS, num_warps=4,
    )  # fmt: skip
