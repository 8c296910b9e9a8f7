"""MoE grouped GEMM in the vLLM fused-MoE style: every expert's rows padded to whole blocks.

The prep lays the sorted slots out in blocks of BLOCK_M rows, each expert starting on a block
boundary (its unused rows hold a sentinel slot id, T*K), and records the expert of every
block. The GEMM grid is then (blocks, column tiles, K splits) and each program reads its
expert from a table: no scan, no search, no loop over experts. It is the in-house baseline.

The number of blocks is only known on the device, so the grid covers the bound
min(E, T*K) padded experts (kernels.moe.launch.max_row_tiles) and blocks past the real count
get expert -1 and exit at once, which keeps the prep free of host syncs.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch, recording
from kernels.moe.formats import MoeWeights
from kernels.moe.launch import (
    INT4_PREFILL_TILES,
    Tiles,
    max_row_tiles,
    prepare,
    run_pipeline,
    weight_args,
)
from kernels.moe.routing import MoeShape
from kernels.moe.routing_kernels import expert_counts, expert_offsets_parallel, permute
from kernels.moe.tiles import down_tile, find_expert, gate_up_tile, store_down, store_gate_up

# Decode: 128-deep K tiles (one scale block a K tile) at 3 stages. On the H200 at T=6, FP8 took
# 0.189 ms against 0.298 with 64-deep ones (raw/logs/h200-tune-moe-decode-programs-9c400a4-
# 20261201T2332.csv, the padded rows); in one later run at 3 stages against the 4 before, FP8
# 0.186 against 0.197, INT4 0.235 against 0.248, and bf16 0.295 against 0.323 for its former
# 64-deep tiles (raw/logs/h200-tune-moe-decode-fine-c4b515e-20261201T2339.csv); the bench run
# after measured fp8 0.193 ms and bf16 0.295 (raw/bench-moe-dsv4-flash-tp2-20261201T234511).
DECODE_TILES = Tiles(block_m=16, block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=3)
PREFILL_TILES = Tiles(block_m=64, block_n=128, block_k=64, split_k=1, num_warps=8, num_stages=3)
PREFILL_ROWS = 32  # mean rows per active expert from which 64-row blocks pay off
TABLE_BLOCK = 256  # blocks labelled per program of the expert-table kernel


@triton.jit
def _block_experts_kernel(
    tile_offsets_ptr, block_experts_ptr, num_experts, num_blocks, STEPS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    blocks = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    experts = find_expert(tile_offsets_ptr, blocks, num_experts, STEPS)
    used = blocks < tl.load(tile_offsets_ptr + num_experts)
    tl.store(block_experts_ptr + blocks, tl.where(used, experts, -1), mask=blocks < num_blocks)


@triton.jit
def _padded_gate_up_kernel(
    x_ptr, h_ptr, part_ptr, padded_slots_ptr, block_experts_ptr, w_ptr, s_ptr, stride_we,
    stride_wn, stride_wk, stride_se, stride_sn, stride_sk, num_slots, hidden, inter,
    k_per_split, stride_xt, stride_xh, stride_hr, stride_ps, stride_pr,
    TOP_K: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, FMT: tl.constexpr, QBLOCK: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, SWAP: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block)
    if expert >= 0:
        # The slot ids stay 32-bit through the K loop and widen where they address: held as
        # 64-bit, the INT4 prefill tile (128 x 128, 8 warps) took ptxas (Triton 3.6's) past
        # 255 registers and spilled 8 bytes; 32-bit, it spills nothing.
        slots = tl.load(padded_slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
        row_ok = slots < num_slots
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < inter
        split = tl.program_id(2)
        k_lo = split * k_per_split
        k_hi = tl.minimum(k_lo + k_per_split, hidden)
        w_e = w_ptr + expert.to(tl.int64) * stride_we
        s_e = s_ptr + expert.to(tl.int64) * stride_se
        gate, up = gate_up_tile(
            x_ptr, (slots // TOP_K).to(tl.int64), row_ok, w_e, s_e, cols, col_ok, inter, hidden,
            k_lo, k_hi, stride_xt, stride_xh, stride_wn, stride_wk, stride_sn, stride_sk,
            BLOCK_M, BLOCK_N, BLOCK_K, FMT, QBLOCK, PRECISION, UPCAST, SWAP, EVEN_K,
        )  # fmt: skip
        store_gate_up(
            h_ptr, part_ptr, split, slots.to(tl.int64), row_ok, cols, col_ok, gate, up, inter,
            stride_hr, stride_ps, stride_pr, SPLIT, SWAP,
        )  # fmt: skip


@triton.jit
def _padded_down_kernel(
    h_ptr, y_ptr, padded_slots_ptr, block_experts_ptr, slot_weights_ptr, w_ptr, s_ptr,
    stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk, num_slots, hidden,
    inter, k_per_split, stride_hr, stride_ys, stride_yr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FMT: tl.constexpr,
    QBLOCK: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, SWAP: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block)
    if expert >= 0:
        slots = tl.load(padded_slots_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_ok = slots < num_slots
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < hidden
        split = tl.program_id(2)
        k_lo = split * k_per_split
        k_hi = tl.minimum(k_lo + k_per_split, inter)
        w_e = w_ptr + expert.to(tl.int64) * stride_we
        s_e = s_ptr + expert.to(tl.int64) * stride_se
        acc = down_tile(
            h_ptr, slots, row_ok, w_e, s_e, cols, col_ok, inter, k_lo, k_hi, stride_hr,
            stride_wn, stride_wk, stride_sn, stride_sk, BLOCK_M, BLOCK_N, BLOCK_K, FMT, QBLOCK,
            PRECISION, UPCAST, SWAP, EVEN_K,
        )  # fmt: skip
        store_down(
            y_ptr, slot_weights_ptr, split, slots, row_ok, cols, col_ok, acc, stride_ys,
            stride_yr, SWAP,
        )  # fmt: skip


def padded_layout(topk_ids: Tensor, experts: int, block_m: int) -> tuple[Tensor, Tensor]:
    """(padded_slots int32 (B * block_m,), block_experts int32 (B,)) for B = the block bound.

    padded_slots holds each expert's slots from a block boundary on, T*K in unused rows;
    block_experts[b] is the expert of block b, or -1 past the last used block.
    """
    slots = topk_ids.numel()
    num_blocks = max_row_tiles(slots, experts, block_m)
    tile_offsets = expert_offsets_parallel(expert_counts(topk_ids, experts), block_m)
    padded_slots = permute(topk_ids, tile_offsets * block_m, size=num_blocks * block_m, fill=slots)
    block_experts = torch.empty(num_blocks, dtype=torch.int32, device=topk_ids.device)
    launch(
        _block_experts_kernel,
        (triton.cdiv(num_blocks, TABLE_BLOCK),),
        tile_offsets,
        block_experts,
        experts,
        num_blocks,
        STEPS=max(experts - 1, 0).bit_length(),
        BLOCK=TABLE_BLOCK,
    )
    return padded_slots, block_experts


def default_tiles(shape: MoeShape, fmt: str) -> Tiles:
    """16-row blocks when experts get few rows (decode), 64 x 128 x 64 on 8 warps otherwise
    (INT4: launch.INT4_PREFILL_TILES)."""
    slots = shape.tokens * shape.top_k
    rows_per_expert = slots / min(shape.experts, slots)
    if rows_per_expert < PREFILL_ROWS:
        return DECODE_TILES
    return INT4_PREFILL_TILES if fmt == "int4" else PREFILL_TILES


def moe_padded(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor,
    w_down: Tensor | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
) -> Tensor:
    """Routed-expert output (T, H) in x.dtype, same contract as moe_reference.

    None options come from default_tiles(shape, fmt). Kernel facts: kernels.moe.last_facts().
    """
    with recording():
        weights, shape, tiles = prepare(
            x,
            topk_ids,
            topk_weights,
            weights,
            w_down,
            default_tiles,
            block_m=block_m,
            block_n=block_n,
            block_k=block_k,
            split_k=split_k,
            num_warps=num_warps,
            num_stages=num_stages,
            swap_ab=swap_ab,
        )
        return _run_padded(x, topk_ids, topk_weights, weights, shape, tiles)


def _run_padded(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights,
    shape: MoeShape,
    tiles: Tiles,
) -> Tensor:
    padded_slots, block_experts = padded_layout(topk_ids, shape.experts, tiles.block_m)
    slot_weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    num_slots = shape.tokens * shape.top_k
    gate_up_constants = tiles.constants(weights, x.dtype, shape.hidden)
    down_constants = tiles.constants(weights, x.dtype, shape.inter)

    def gate_up(h: Tensor, part: Tensor, splits: int, k_per_split: int) -> None:
        grid = (block_experts.numel(), triton.cdiv(shape.inter, tiles.block_n), splits)
        launch(
            _padded_gate_up_kernel,
            grid,
            x,
            h,
            part,
            padded_slots,
            block_experts,
            *weight_args(weights.gate_up, weights.gate_up_scale),
            num_slots,
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
        grid = (block_experts.numel(), triton.cdiv(shape.hidden, tiles.block_n), splits)
        launch(
            _padded_down_kernel,
            grid,
            h,
            y,
            padded_slots,
            block_experts,
            slot_weights,
            *weight_args(weights.down, weights.down_scale),
            num_slots,
            shape.hidden,
            shape.inter,
            k_per_split,
            h.stride(0),
            y.stride(0),
            y.stride(1),
            **down_constants,
        )

    return run_pipeline(x, shape, tiles, tiles.split_k, tiles.split_k, gate_up, down)
