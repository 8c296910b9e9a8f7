"""MoE grouped GEMM scheduled like the exl3 "stock" kernel.

Each program owns one N tile, one K split and a round-robin share of the experts (expert e goes
to group e % groups), and finds its experts' rows by walking ALL expert counts serially with a
running offset. That serial walk is the point of this variant: it is the stock kernel's
schedule, and the profiler should show its cost against the multirow/flat/padded schedulers.
The routing prep matches: a device histogram, the serial offset scan, then the permutation.

Stock keeps 16-row tiles; `run_stock` takes BLOCK_M as a parameter so kernels.moe.multirow
reuses these kernels with 32- and 64-row tiles.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch, recording
from kernels.moe.formats import MoeWeights
from kernels.moe.launch import Tiles, prepare, run_pipeline, weight_args
from kernels.moe.routing import MoeShape, default_groups
from kernels.moe.routing_kernels import expert_counts, expert_offsets_serial, permute
from kernels.moe.tiles import down_tile, gate_up_tile, store_down, store_gate_up

STOCK_TILES = Tiles(block_m=16, block_n=64, block_k=64, split_k=1, num_warps=4, num_stages=3)


@triton.jit
def _stock_gate_up_kernel(
    x_ptr,
    h_ptr,
    part_ptr,
    sorted_slots_ptr,
    counts_ptr,
    w_ptr,
    s_ptr,
    stride_we,
    stride_wn,
    stride_wk,
    stride_se,
    stride_sn,
    stride_sk,
    num_experts,
    hidden,
    inter,
    k_per_split,
    stride_xt,
    stride_xh,
    stride_hr,
    stride_ps,
    stride_pr,
    TOP_K: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FMT: tl.constexpr,
    QBLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SWAP: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    group = tl.program_id(0)
    groups = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    split = tl.program_id(2)
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, hidden)

    row_start = group * 0  # first sorted row of the current expert
    w_e = w_ptr  # advanced by one expert per step: no 32-bit overflow of e * stride_we
    s_e = s_ptr
    for expert in range(0, num_experts):
        count = tl.load(counts_ptr + expert)
        own_count = tl.where(expert % groups == group, count, 0)  # 0 rows: skip the expert
        for m0 in range(0, own_count, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            row_ok = rows < count
            slots = tl.load(sorted_slots_ptr + row_start + rows, mask=row_ok, other=0)
            slots = slots.to(tl.int64)
            gate, up = gate_up_tile(
                x_ptr, slots // TOP_K, row_ok, w_e, s_e, cols, col_ok, inter, hidden, k_lo,
                k_hi, stride_xt, stride_xh, stride_wn, stride_wk, stride_sn, stride_sk,
                BLOCK_M, BLOCK_N, BLOCK_K, FMT, QBLOCK, PRECISION, UPCAST, SWAP, EVEN_K,
            )  # fmt: skip
            store_gate_up(
                h_ptr, part_ptr, split, slots, row_ok, cols, col_ok, gate, up, inter,
                stride_hr, stride_ps, stride_pr, SPLIT, SWAP,
            )  # fmt: skip
        row_start += count
        w_e += stride_we
        s_e += stride_se


@triton.jit
def _stock_down_kernel(
    h_ptr,
    y_ptr,
    sorted_slots_ptr,
    counts_ptr,
    slot_weights_ptr,
    w_ptr,
    s_ptr,
    stride_we,
    stride_wn,
    stride_wk,
    stride_se,
    stride_sn,
    stride_sk,
    num_experts,
    hidden,
    inter,
    k_per_split,
    stride_hr,
    stride_ys,
    stride_yr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FMT: tl.constexpr,
    QBLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SWAP: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    group = tl.program_id(0)
    groups = tl.num_programs(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    split = tl.program_id(2)
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, inter)

    row_start = group * 0
    w_e = w_ptr
    s_e = s_ptr
    for expert in range(0, num_experts):
        count = tl.load(counts_ptr + expert)
        own_count = tl.where(expert % groups == group, count, 0)
        for m0 in range(0, own_count, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            row_ok = rows < count
            slots = tl.load(sorted_slots_ptr + row_start + rows, mask=row_ok, other=0)
            slots = slots.to(tl.int64)
            acc = down_tile(
                h_ptr, slots, row_ok, w_e, s_e, cols, col_ok, inter, k_lo, k_hi, stride_hr,
                stride_wn, stride_wk, stride_sn, stride_sk, BLOCK_M, BLOCK_N, BLOCK_K, FMT,
                QBLOCK, PRECISION, UPCAST, SWAP, EVEN_K,
            )  # fmt: skip
            store_down(
                y_ptr, slot_weights_ptr, split, slots, row_ok, cols, col_ok, acc, stride_ys,
                stride_yr, SWAP,
            )  # fmt: skip
        row_start += count
        w_e += stride_we
        s_e += stride_se


def run_stock(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights,
    shape: MoeShape,
    tiles: Tiles,
    groups: int | None,
) -> Tensor:
    """The stock schedule at any BLOCK_M (tiles.block_m); inputs already validated."""
    groups = default_groups(x.device) if groups is None else groups
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups={groups!r} must be an integer >= 1 (or None for the default).")
    counts = expert_counts(topk_ids, shape.experts)
    sorted_slots = permute(topk_ids, expert_offsets_serial(counts))
    slot_weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    gate_up_constants = tiles.constants(weights, x.dtype, shape.hidden)
    down_constants = tiles.constants(weights, x.dtype, shape.inter)

    def gate_up(h: Tensor, part: Tensor, splits: int, k_per_split: int) -> None:
        grid = (groups, triton.cdiv(shape.inter, tiles.block_n), splits)
        launch(
            _stock_gate_up_kernel,
            grid,
            x,
            h,
            part,
            sorted_slots,
            counts,
            *weight_args(weights.gate_up, weights.gate_up_scale),
            shape.experts,
            shape.hidden,
            shape.inter,
            k_per_split,
            *x.stride(),
            h.stride(0),
            part.stride(0),
            part.stride(1),
            TOP_K=shape.top_k,
            SPLIT=splits > 1,
            **gate_up_constants,
        )

    def down(h: Tensor, y: Tensor, splits: int, k_per_split: int) -> None:
        grid = (groups, triton.cdiv(shape.hidden, tiles.block_n), splits)
        launch(
            _stock_down_kernel,
            grid,
            h,
            y,
            sorted_slots,
            counts,
            slot_weights,
            *weight_args(weights.down, weights.down_scale),
            shape.experts,
            shape.hidden,
            shape.inter,
            k_per_split,
            h.stride(0),
            y.stride(0),
            y.stride(1),
            **down_constants,
        )

    return run_pipeline(x, shape, tiles, tiles.split_k, tiles.split_k, gate_up, down)


def moe_stock(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor,
    w_down: Tensor | None = None,
    *,
    groups: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
) -> Tensor:
    """Routed-expert output (T, H) in x.dtype; same contract as moe_reference.

    `weights` is MoeWeights in any format, a (w_gate_up, w_down) tuple, or w_gate_up with
    w_down as the next argument (what workbench/model.py passes). `groups` is the number of
    programs sharing each N tile (experts dealt round-robin); it defaults to one per 8 SMs.
    None options take STOCK_TILES. Kernel facts of the call: kernels.moe.last_facts().
    """
    with recording():
        weights, shape, tiles = prepare(
            x,
            topk_ids,
            topk_weights,
            weights,
            w_down,
            STOCK_TILES,
            block_n=block_n,
            block_k=block_k,
            split_k=split_k,
            num_warps=num_warps,
            num_stages=num_stages,
            swap_ab=swap_ab,
        )
        return run_stock(x, topk_ids, topk_weights, weights, shape, tiles, groups)
