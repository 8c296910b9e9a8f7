"""Top-k position selection on the GPU as one Triton kernel: a radix select per query row.

What `reference.select_positions` returns (the top-k candidates strictly before the sliding
window, then the window, -1 for unused slots), without torch.topk over the context and the
dozen torch ops around it. One program owns a query row and never sorts it:

1. Each score becomes an int32 key that orders like the float (negative floats have their
   magnitude bits flipped), so a radix select on integers is a select on scores.
2. `rounds` passes build a 256-bin histogram of one byte of the keys, high byte first, among
   the keys that share the bytes chosen so far, and keep the byte holding the k-th largest.
3. A last pass writes every position whose chosen bytes beat that prefix, then positions equal
   to it in position order until k are written (ties broken by position, as a stable select).

Two rounds (the default) fix the cut's top 16 bits: sign, exponent and 7 mantissa bits, the
precision of bf16, so a pick falls at most 2**-7 of the cut below the exact fp32 cut, inside
the 1% the workbench's selection check allows (`rounds=4` is exact). Each pass reads the row
once; at 46K keys a row is 184 KB, which stays in L2 between passes.

Two other designs measured slower on the H200 (raw/logs/h200-tune-attention.csv, a 46K decode
row and a 4096-row prefill chunk): 2048 equal buckets over each row's score range, 372 us and
11.4 ms (`tl.histogram`'s cost grows with its bins), and a threshold search counting by
compares (the candidates' range, two rounds of 32 thresholds), 177 us and 3.4 ms, its count
loop compute-bound (ncu: 80% integer pipe); this one takes 136 us and 2.65 ms. A decode row is
one program on one SM (12.5% occupancy in ncu): splitting a row over programs is what would
close the rest.

Positions can be mapped to cache rows on the way out (`split`, `shift`): a decode stream's
own tail lives `shift[q]` rows further on in the flat cache from virtual position `split` on,
which is what `Cache.virtual_to_flat` computes with five torch ops.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.moe.compiled import launch, recording

BINS = 256


@triton.jit
def _ordered_keys(scores):
    """int32 keys with the order of the fp32 scores (-inf lowest)."""
    bits = scores.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _to_rows(positions, split, shift, SHIFTED: tl.constexpr):
    if SHIFTED:
        positions = tl.where(positions >= split, positions + shift, positions)
    return positions


@triton.jit
def _select_kernel(
    scores_ptr, pos_ptr, shift_ptr, out_ptr, length, split, stride_sq, stride_oq,
    TOPK: tl.constexpr, WINDOW: tl.constexpr, WINDOW_P: tl.constexpr, BLOCK: tl.constexpr,
    ROUNDS: tl.constexpr, SHIFTED: tl.constexpr,
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
        bins = tl.arange(0, 256)
        prefix = tl.zeros((), tl.int32)  # the chosen high bytes of the cut, signed
        need = tl.full((), TOPK, tl.int32)  # picks still to place at or below the prefix
        for r in tl.static_range(ROUNDS):
            low_bit = 24 - 8 * r  # constexpr: r is unrolled
            counts = tl.zeros((256,), tl.int32)
            for j0 in range(0, candidates, BLOCK):
                j = j0 + lane
                ok = j < candidates
                keys = _ordered_keys(tl.load(row + j, mask=ok, other=float("-inf")))
                if r == 0:
                    match = ok
                    digit = (keys >> 24) + 128  # the signed high byte, as 0..255
                else:
                    match = ok & ((keys >> (low_bit + 8)) == prefix)
                    digit = (keys >> low_bit) & 255
                digit = tl.where(match, digit, 0)
                # Non-matching lanes were counted in bin 0: take them back out.
                misses = tl.sum((~match).to(tl.int32), axis=0)
                counts += tl.histogram(digit, 256) - tl.where(bins == 0, misses, 0)
            at_or_above = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0) + counts
            chosen = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
            need -= tl.sum(tl.where(bins > chosen, counts, 0), axis=0)
            prefix = chosen - 128 if r == 0 else prefix * 256 + chosen
        cut_bit = 32 - 8 * ROUNDS
        written = tl.zeros((), tl.int32)
        ties = tl.zeros((), tl.int32)
        for j0 in range(0, candidates, BLOCK):
            j = j0 + lane
            ok = j < candidates
            top = _ordered_keys(tl.load(row + j, mask=ok, other=float("-inf"))) >> cut_bit
            above = ok & (top > prefix)
            equal = ok & (top == prefix)
            tie_rank = ties + tl.cumsum(equal.to(tl.int32), axis=0)
            take = above | (equal & (tie_rank <= need))
            slot = written + tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(out + slot, _to_rows(j, split, shift, SHIFTED), mask=take)
            written += tl.sum(take.to(tl.int32), axis=0)
            ties += tl.sum(equal.to(tl.int32), axis=0)


def select_positions_triton(
    scores: Tensor,
    query_pos: Tensor,
    topk: int,
    window: int,
    split: int | None = None,
    shift: Tensor | None = None,
    rounds: int = 2,
    block: int = 2048,
    num_warps: int = 8,
) -> Tensor:
    """Key positions each query attends to, (Q, topk + window) int64 with -1 for unused slots,
    as `reference.select_positions` defines them (the top-k part in position order, not best
    first; its cut exact to `rounds` bytes of the score).

    With `shift` (Q,) int64, positions from `split` on come back as cache rows `position +
    shift[q]`. Scores must be fp32 with contiguous rows."""
    if scores.dim() != 2 or query_pos.shape != (scores.shape[0],):
        raise ValueError(
            f"select_positions expects scores (Q, L) and query_pos (Q,), got "
            f"{tuple(scores.shape)} and {tuple(query_pos.shape)}"
        )
    if scores.dtype != torch.float32 or scores.stride(1) != 1:
        raise ValueError("select_positions_triton needs fp32 scores with contiguous rows.")
    if topk < 1 or window < 0 or not 1 <= rounds <= 4:
        raise ValueError(f"need topk >= 1, window >= 0 and 1 <= rounds <= 4; got "
                         f"{topk}, {window}, {rounds}")  # fmt: skip
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
            ROUNDS=rounds, SHIFTED=shift is not None, num_warps=num_warps,
        )  # fmt: skip
    return out
