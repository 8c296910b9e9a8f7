"""Top-k position selection on the GPU as one Triton kernel: a threshold search per query row.

What `reference.select_positions` returns (the top-k candidates strictly before the sliding
window, then the window, -1 for unused slots), without torch.topk over the context and the
dozen torch ops around it. One program owns a query row and never sorts it. It reads the row
`rounds + 2` times:

1. the range of the candidates' scores, [lo, hi] (two reductions);
2. each round, `thresholds` evenly spaced values over the current interval, and how many
   scores reach each (a dense compare and a sum, no atomics): the interval shrinks to the step
   whose lower end still has k scores at or above it;
3. every position above the final interval, then positions inside it in position order until
   k are written (ties broken by position, as a stable select).

A pick is therefore at most one final step, (hi - lo) / thresholds**rounds, below the exact
fp32 cut: with the default 32 thresholds and two rounds at most 0.2% of the row's largest
|score|, inside the 1% the workbench's selection check allows. Counting by compares rather
than `tl.histogram`: on the H200 a 256-bin histogram per byte of the floats (a radix select)
took 136 us a 46K decode row, and 2048 buckets over the score range 372 us; the histogram's
cost grew with its bins (raw/logs/h200-tune-attention.csv). At 46K keys a row is 184 KB,
which stays in L2 between passes.

Positions can be mapped to cache rows on the way out (`split`, `shift`): a decode stream's
own tail lives `shift[q]` rows further on in the flat cache from virtual position `split` on.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.moe.compiled import launch, recording


@triton.jit
def _to_rows(positions, split, shift, SHIFTED: tl.constexpr):
    if SHIFTED:
        positions = tl.where(positions >= split, positions + shift, positions)
    return positions


@triton.jit
def _select_kernel(
    scores_ptr, pos_ptr, shift_ptr, out_ptr, length, split, stride_sq, stride_oq,
    TOPK: tl.constexpr, WINDOW: tl.constexpr, WINDOW_P: tl.constexpr, BLOCK: tl.constexpr,
    THRESHOLDS: tl.constexpr, ROUNDS: tl.constexpr, SHIFTED: tl.constexpr,
):  # fmt: skip
    query = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + query)
    shift = tl.load(shift_ptr + query) if SHIFTED else 0
    row = scores_ptr + query * stride_sq
    out = out_ptr + query * stride_oq

    # The window: pos, pos-1, ..., pos-WINDOW+1, inside [0, length).
    back = tl.arange(0, WINDOW_P)
    recent = pos - back
    in_range = (recent >= 0) & (recent < length)
    recent = tl.where(in_range, _to_rows(recent, split, shift, SHIFTED), -1)
    tl.store(out + TOPK + back, recent, mask=back < WINDOW)

    lane = tl.arange(0, BLOCK)
    # Candidates are positions [0, candidates). Names differ between the branches below: the
    # compiler types a name once across both.
    candidates = tl.minimum(tl.maximum(pos - WINDOW + 1, 0), length).to(tl.int32)
    if candidates <= TOPK:  # every candidate is picked, the rest of the slots unused
        for s0 in range(0, TOPK, BLOCK):
            slots = s0 + lane
            picked = tl.where(slots < candidates, _to_rows(slots, split, shift, SHIFTED), -1)
            tl.store(out + slots, picked, mask=slots < TOPK)
    else:
        hi = tl.full((), float("-inf"), tl.float32)
        lo = tl.full((), float("inf"), tl.float32)
        for j0 in range(0, candidates, BLOCK):
            j = j0 + lane
            x = tl.load(row + j, mask=j < candidates, other=float("-inf"))
            hi = tl.maximum(hi, tl.max(x, axis=0))
            lo = tl.minimum(lo, tl.min(tl.where(j < candidates, x, float("inf")), axis=0))
        # Invariant: at least TOPK scores reach `base` and `above` < TOPK reach `floor` (none
        # reach +inf). Both bounds are values the counts compared with, never recomputed, so
        # the picks below add up to exactly TOPK.
        base, floor, step = lo, float("inf"), (hi - lo) / THRESHOLDS
        above = tl.zeros((), tl.int32)
        marks = tl.arange(0, THRESHOLDS)
        for _round in tl.static_range(ROUNDS):
            levels = base + marks.to(tl.float32) * step
            reach = tl.zeros((THRESHOLDS,), tl.int32)  # scores >= levels[i]
            for c0 in range(0, candidates, BLOCK):
                c = c0 + lane
                x = tl.load(row + c, mask=c < candidates, other=float("-inf"))
                reach += tl.sum((x[:, None] >= levels[None, :]).to(tl.int32), axis=0)
            level = tl.max(tl.where(reach >= TOPK, marks, 0), axis=0)
            if_next = marks == level + 1  # the next level up, if inside this interval
            floor = tl.where(level == THRESHOLDS - 1, floor,
                             tl.sum(tl.where(if_next, levels, 0.0), axis=0))  # fmt: skip
            above = tl.where(level == THRESHOLDS - 1, above,
                             tl.sum(tl.where(if_next, reach, 0), axis=0))  # fmt: skip
            base = tl.sum(tl.where(marks == level, levels, 0.0), axis=0)
            step = step / THRESHOLDS
        need = TOPK - above  # picks from [base, floor), in position order
        written = tl.zeros((), tl.int32)
        ties = tl.zeros((), tl.int32)
        for w0 in range(0, candidates, BLOCK):
            w = w0 + lane
            ok = w < candidates
            x = tl.load(row + w, mask=ok, other=float("-inf"))
            clear = ok & (x >= floor)
            inside = ok & (x >= base) & (x < floor)
            tie_rank = ties + tl.cumsum(inside.to(tl.int32), axis=0)
            take = clear | (inside & (tie_rank <= need))
            slot = written + tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(out + slot, _to_rows(w, split, shift, SHIFTED), mask=take)
            written += tl.sum(take.to(tl.int32), axis=0)
            ties += tl.sum(inside.to(tl.int32), axis=0)


def select_positions_triton(
    scores: Tensor,
    query_pos: Tensor,
    topk: int,
    window: int,
    split: int | None = None,
    shift: Tensor | None = None,
    thresholds: int = 32,
    rounds: int = 2,
    block: int = 1024,
    num_warps: int = 8,
) -> Tensor:
    """Key positions each query attends to, (Q, topk + window) int64 with -1 for unused slots,
    as `reference.select_positions` defines them (the top-k part in position order, not best
    first; its cut within (hi - lo) / thresholds**rounds of the exact one, hi and lo the
    candidates' largest and smallest scores).

    With `shift` (Q,) int64, positions from `split` on come back as cache rows `position +
    shift[q]`. Scores must be fp32 with contiguous rows."""
    if scores.dim() != 2 or query_pos.shape != (scores.shape[0],):
        raise ValueError(
            f"select_positions expects scores (Q, L) and query_pos (Q,), got "
            f"{tuple(scores.shape)} and {tuple(query_pos.shape)}"
        )
    if scores.dtype != torch.float32 or scores.stride(1) != 1:
        raise ValueError("select_positions_triton needs fp32 scores with contiguous rows.")
    if topk < 1 or window < 0 or rounds < 1 or thresholds < 2 or thresholds & (thresholds - 1):
        raise ValueError(f"need topk >= 1, window >= 0, rounds >= 1 and a power of two of "
                         f"thresholds; got {topk}, {window}, {rounds}, {thresholds}")  # fmt: skip
    if (shift is None) != (split is None) or (shift is not None and shift.shape != query_pos.shape):
        raise ValueError("give split and shift (Q,) together, or neither.")
    num_q, length = scores.shape
    out = torch.empty(num_q, topk + window, dtype=torch.int64, device=scores.device)
    if num_q == 0:
        return out
    pos = query_pos.to(torch.int64)
    with recording():
        launch(
            _select_kernel, (num_q,), scores, pos, pos if shift is None else shift, out, length,
            length if split is None else split, scores.stride(0), out.stride(0), TOPK=topk,
            WINDOW=window, WINDOW_P=triton.next_power_of_2(max(window, 1)), BLOCK=block,
            THRESHOLDS=thresholds, ROUNDS=rounds, SHIFTED=shift is not None, num_warps=num_warps,
        )  # fmt: skip
    return out
