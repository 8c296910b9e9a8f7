"""Routing on the device: expert histogram, prefix scans, slot permutation, per-token combine.

These are the Triton halves of the prep every scheduler needs; their torch references live in
kernels.moe.routing. Two scans exist on purpose: `expert_offsets_serial` is one program walking
the counts in order, the way the stock exl3 kernel finds its rows, and
`expert_offsets_parallel` is a single `tl.cumsum` over a padded block, the way the flat
scheduler builds its work list. Neither needs a host sync, so the prep can be graph-captured.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch

SLOT_BLOCK = 1024  # slots per program in the permutation
COUNT_BLOCK = 2048  # slots per program in the histogram, on COUNT_WARPS warps
COUNT_WARPS = 8
SMALL_SLOTS = 256  # most slots `small_layout` takes: its rank count is SLOTS x SLOTS compares
SMALL_CHUNK = 32  # slots compared at a time there


@triton.jit
def _counts_kernel(ids_ptr, counts_ptr, num_slots, num_experts, BLOCK: tl.constexpr,
                   BINS: tl.constexpr):  # fmt: skip
    """The program's BLOCK slots counted per expert (`tl.histogram`, merged across warps in
    shared memory), then one atomic an expert it saw: a slot's own atomic on a hot counter
    serialised in L2."""
    slots = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = slots < num_slots
    experts = tl.load(ids_ptr + slots, mask=valid, other=0)
    counts = tl.histogram(experts, BINS, mask=valid)
    bins = tl.arange(0, BINS)
    tl.atomic_add(counts_ptr + bins, counts, mask=(bins < num_experts) & (counts > 0),
                  sem="relaxed")  # fmt: skip


@triton.jit
def _offsets_serial_kernel(counts_ptr, offsets_ptr, num_experts, TILE: tl.constexpr):
    running = tl.program_id(0) * 0  # an int32 tensor, so the loop carries one type
    for expert in range(0, num_experts):
        tl.store(offsets_ptr + expert, running)
        running += (tl.load(counts_ptr + expert) + TILE - 1) // TILE
    tl.store(offsets_ptr + num_experts, running)


@triton.jit
def _offsets_parallel_kernel(counts_ptr, offsets_ptr, num_experts, TILE, BLOCK: tl.constexpr):
    idx = tl.arange(0, BLOCK)  # offsets[idx] sums the tiles of experts 0 .. idx - 1
    before = tl.load(counts_ptr + idx - 1, mask=(idx >= 1) & (idx <= num_experts), other=0)
    tl.store(offsets_ptr + idx, tl.cumsum((before + TILE - 1) // TILE, 0), mask=idx <= num_experts)


@triton.jit
def _permute_kernel(ids_ptr, offsets_ptr, cursors_ptr, out_ptr, num_slots, BLOCK: tl.constexpr):
    slots = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = slots < num_slots
    experts = tl.load(ids_ptr + slots, mask=valid, other=0)
    ones = tl.full((BLOCK,), 1, tl.int32)
    rank = tl.atomic_add(cursors_ptr + experts, ones, mask=valid, sem="relaxed")
    position = tl.load(offsets_ptr + experts, mask=valid, other=0) + rank
    tl.store(out_ptr + position, slots, mask=valid)


@triton.jit
def _small_layout_kernel(
    ids_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr, out_ptr, slot_weights_ptr,
    row_weights_ptr, tile_info_ptr, num_slots, num_experts, tile, SLOTS: tl.constexpr,
    EXPERTS: tl.constexpr, CHUNK: tl.constexpr, ROW_TABLE: tl.constexpr,
):  # fmt: skip
    """The whole flat routing layout in one program: counts, slot and row-tile offsets, and the
    slots sorted by expert, each expert's in ascending slot order (a slot's rank is how many
    earlier slots chose its expert, counted CHUNK slots at a time); with ROW_TABLE also the
    table of row tiles the Gluon kernels read (`tiles.write_tile_info`): each sorted row's
    routing weight, and each tile's (expert, first row, rows owned), written by its first row's
    slot.

    A slot's expert's offsets and count come from the program's own scans by `tl.gather`, not
    read back from the offsets it stores: at decode sizes this launch is a chain of dependent
    memory round trips, and the read-backs (the offsets after a barrier, then the row tiles'
    offsets and the counts) were three of them. Compiled for sm_90 (Triton 3.6, 64 slots, the
    row table), its instructions wait for a global load twice in program order, where the
    read-backs' form waited six times (scripts/glue_sass_facts.py). On the H200, in turns
    against the read-backs' form (raw/ab-moe-20261205T020714, flat INT4), the launch took 6.7%
    less time at T=6 and 1.7% more at T=1, and the MoE call did not move measurably."""
    slots = tl.arange(0, SLOTS)
    valid = slots < num_slots
    experts = tl.load(ids_ptr + slots, mask=valid, other=0)
    if ROW_TABLE:
        weights = tl.load(slot_weights_ptr + slots, mask=valid, other=0.0)
    rank = tl.zeros((SLOTS,), tl.int32)
    for first in tl.static_range(0, SLOTS, CHUNK):
        others = first + tl.arange(0, CHUNK)
        theirs = tl.load(ids_ptr + others, mask=others < num_slots, other=-1)
        earlier = (theirs[None, :] == experts[:, None]) & (others[None, :] < slots[:, None])
        rank += tl.sum(earlier.to(tl.int32), axis=1)
    bins = tl.arange(0, EXPERTS)
    # each lane's bin: invalid lanes take the one past the last expert, which nothing reads
    mine = tl.where(valid, experts, num_experts)
    counts = tl.histogram(mine, EXPERTS)
    ends = tl.cumsum(counts, 0)  # offsets[e + 1]
    tiles = (counts + tile - 1) // tile
    tile_ends = tl.cumsum(tiles, 0)
    tl.store(counts_ptr + bins, counts, mask=bins < num_experts)
    tl.store(offsets_ptr + 1 + bins, ends, mask=bins < num_experts)
    tl.store(tile_offsets_ptr + 1 + bins, tile_ends, mask=bins < num_experts)
    tl.store(offsets_ptr + bins, 0, mask=bins == 0)
    tl.store(tile_offsets_ptr + bins, 0, mask=bins == 0)
    position = tl.gather(ends - counts, mine, 0) + rank
    tl.store(out_ptr + position, slots, mask=valid)
    if ROW_TABLE:
        tl.store(row_weights_ptr + position, weights, mask=valid)
        info = tile_info_ptr + 4 * (tl.gather(tile_ends - tiles, mine, 0) + rank // tile)
        first = valid & (rank % tile == 0)
        owned = tl.minimum(tl.gather(counts, mine, 0) - rank, tile)
        tl.store(info, experts, mask=first)
        tl.store(info + 1, position, mask=first)
        tl.store(info + 2, owned, mask=first)


def small_layout(
    topk_ids: Tensor,
    experts: int,
    tile: int,
    row_table: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(counts, slot offsets, row-tile offsets, sorted slots) as expert_counts,
    expert_offsets_parallel(counts) and (counts, tile) and permute give them, in one launch
    instead of six (two of them zero fills): for decode-size routings (up to SMALL_SLOTS
    slots), where each launch costs more than its work. Within an expert the slots come in
    ascending order. On the H200 the flat scheduler's served decode step took 8.36 ms with it
    against 8.54 before, 1,093 launches against 1,293 (two runs, docs/design.md).

    `row_table` = (fp32 routing weights a slot, row_weights, tile_info), when given: the same
    launch fills the last two as `w8a8_wgmma.row_table` does (row_weights a sorted row,
    tile_info (row tiles, 4) int32), one launch less for the Gluon INT4 decode kernels."""
    _check_tile(tile)
    flat = _flat_ids(topk_ids)
    if flat.numel() > SMALL_SLOTS:
        raise ValueError(f"small_layout takes up to {SMALL_SLOTS} slots; got {flat.numel()}. "
                         "Use expert_counts, expert_offsets_parallel and permute.")  # fmt: skip
    counts = torch.empty(experts, dtype=torch.int32, device=flat.device)
    offsets = torch.empty(experts + 1, dtype=torch.int32, device=flat.device)
    tile_offsets = torch.empty_like(offsets)
    out = torch.empty(flat.numel(), dtype=torch.int32, device=flat.device)
    block = triton.next_power_of_2(max(flat.numel(), SMALL_CHUNK))
    slot_weights, row_weights, tile_info = row_table or (out, out, out)  # unread without it
    launch(_small_layout_kernel, (1,), flat, counts, offsets, tile_offsets, out, slot_weights,
           row_weights, tile_info, flat.numel(), experts, tile, SLOTS=block,
           EXPERTS=triton.next_power_of_2(experts + 1), CHUNK=SMALL_CHUNK,
           ROW_TABLE=row_table is not None)  # fmt: skip
    return counts, offsets, tile_offsets, out


@triton.jit
def _combine_kernel(
    y_ptr,
    out_ptr,
    hidden,
    splits,
    stride_ys,
    stride_yr,
    stride_ot,
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    valid = cols < hidden
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    rows = y_ptr + token * TOP_K * stride_yr + cols
    for _ in range(0, splits):
        for k in tl.static_range(TOP_K):
            acc += tl.load(rows + k * stride_yr, mask=valid, other=0.0)
        rows += stride_ys  # stepping the pointer: split * stride_ys can overflow int32
    tl.store(out_ptr + token * stride_ot + cols, acc.to(out_ptr.dtype.element_ty), mask=valid)


def _flat_ids(topk_ids: Tensor) -> Tensor:
    return topk_ids.reshape(-1).to(torch.int32).contiguous()


def expert_counts(topk_ids: Tensor, experts: int) -> Tensor:
    """Slots routed to each expert, int32 (E,): each program's histogram (`tl.histogram`)
    added into the counts, one atomic an expert.

    Matches torch.bincount(topk_ids.flatten(), minlength=E) for ids in [0, E), which
    `validate_moe_inputs` checks unless the routing is trusted (on the GPU an id out of range
    would land in some expert's bin). A slot's own atomic, as this kernel had it, serialised
    on the experts' counters in L2: on the H200 at the TP2 rank's 384 experts under uniform
    routing it took 43.7 us at T=33,863 and 9.6 at 4,096, against 9.8 and 7.6 with 2,048
    slots a program on 8 warps, the fastest of 512 to 4,096 slots on 4 or 8 warps at 33,863
    (at 4,096, 1,024 slots on 4 warps took 6.8;
    raw/logs/h200-moe-w8a8-next-item-ahead-ab-*.txt).
    """
    flat = _flat_ids(topk_ids)
    counts = torch.zeros(experts, dtype=torch.int32, device=flat.device)
    grid = (triton.cdiv(flat.numel(), COUNT_BLOCK),)
    launch(_counts_kernel, grid, flat, counts, flat.numel(), experts, BLOCK=COUNT_BLOCK,
           BINS=triton.next_power_of_2(experts), num_warps=COUNT_WARPS)  # fmt: skip
    return counts


def _check_tile(tile: int) -> None:
    if tile < 1:
        raise ValueError(f"tile={tile} must be >= 1 (1 gives slot offsets, BLOCK_M tile offsets).")


def expert_offsets_serial(counts: Tensor, tile: int = 1) -> Tensor:
    """Exclusive prefix sums of cdiv(counts, tile) plus the total, int32 (E + 1,), serially.

    One program visits every expert in order: E dependent steps, the stock kernel's cost.
    """
    _check_tile(tile)
    offsets = torch.empty(counts.numel() + 1, dtype=torch.int32, device=counts.device)
    launch(_offsets_serial_kernel, (1,), counts, offsets, counts.numel(), TILE=tile)
    return offsets


def expert_offsets_parallel(counts: Tensor, tile: int = 1) -> Tensor:
    """Same result as expert_offsets_serial, from one tl.cumsum over a block of E + 1 lanes.

    `tile` is a runtime argument, so one compiled kernel serves slot and row-tile offsets.
    """
    _check_tile(tile)
    experts = counts.numel()
    offsets = torch.empty(experts + 1, dtype=torch.int32, device=counts.device)
    block = triton.next_power_of_2(experts + 1)
    launch(_offsets_parallel_kernel, (1,), counts, offsets, experts, tile, BLOCK=block)
    return offsets


def permute(topk_ids: Tensor, offsets: Tensor, *, size: int | None = None, fill: int = 0) -> Tensor:
    """Slot ids grouped by expert, int32: out[offsets[e] + r] is the r-th slot given to expert e.

    Slot s is token s // K's k-th choice (s = t*K + k). `offsets` holds each expert's first
    position (from expert_offsets_*; the padded scheduler passes padded starts), so the result
    is the sorted slot order. Within one expert the order is that in which the per-slot atomics
    landed: ascending slot order under the interpreter, unspecified on a GPU. No scheduler
    depends on it, since rows of one expert are independent. Positions not written (padding,
    when `size` exceeds T*K) hold `fill`.
    """
    flat = _flat_ids(topk_ids)
    num_slots = flat.numel()
    experts = offsets.numel() - 1
    if size is None:
        out = torch.empty(num_slots, dtype=torch.int32, device=flat.device)
    else:
        out = torch.full((size,), fill, dtype=torch.int32, device=flat.device)
    cursors = torch.zeros(experts, dtype=torch.int32, device=flat.device)
    grid = (triton.cdiv(num_slots, SLOT_BLOCK),)
    launch(_permute_kernel, grid, flat, offsets, cursors, out, num_slots, BLOCK=SLOT_BLOCK)
    return out


# Columns a combine program sums, at most: 1024, or 256 for up to DECODE_COMBINE_TOKENS
# tokens, whose few rows gave 1024-wide programs a handful of SMs: 0.5-3 us less a flat layer
# at T=1 to 16 on the H200 (raw/logs/h200-moe-decode-glue-probe-822a65d-20261202T1211.csv).
COMBINE_COLS = 1024
DECODE_COMBINE_COLS = 256
DECODE_COMBINE_TOKENS = 64


def combine(y_slots: Tensor, tokens: int, top_k: int, dtype: torch.dtype | None = None) -> Tensor:
    """(T, H) in `dtype` (default y's): each token's K slot rows summed in fp32, slot order k.

    y_slots is (T*K, H) in slot order, or (S, T*K, H) split-K partials, which are summed too:
    folding the split-K reduction into the combine saves a pass over the partials.
    """
    y = y_slots.reshape(-1, tokens * top_k, y_slots.shape[-1])
    if y.stride(-1) != 1:
        y = y.contiguous()
    hidden = y.shape[-1]
    out = torch.empty(tokens, hidden, dtype=dtype or y.dtype, device=y.device)
    widest = DECODE_COMBINE_COLS if tokens <= DECODE_COMBINE_TOKENS else COMBINE_COLS
    block_h = min(triton.next_power_of_2(hidden), widest)
    launch(
        _combine_kernel,
        (tokens, triton.cdiv(hidden, block_h)),
        y,
        out,
        hidden,
        y.shape[0],
        y.stride(0),
        y.stride(1),
        out.stride(0),
        TOP_K=top_k,
        BLOCK_H=block_h,
    )
    return out
