"""Top-k position selection on the GPU as one Triton kernel: a histogram select per query row.

What `reference.select_positions` returns (the top-k candidates strictly before the sliding
window, then the window, -1 for unused slots), without torch.topk over the context and the
dozen torch ops around it. One program owns a query row and never sorts it; it reads the row
three times:

1. the range of the candidates' scores, [lo, hi] (two reductions);
2. a histogram of `bins` equal-width buckets over that range, counted from the top, which
   names the bucket holding the k-th largest score;
3. every position in a higher bucket, then positions of that bucket in position order until k
   are written (ties broken by position, as a stable select).

A pick is therefore at most one bucket, (hi - lo) / bins, below the exact fp32 cut: with the
default 2048 buckets at most 0.1% of the row's largest |score|, inside the 1% the workbench's
selection check allows. Buckets over the scores' own range, not over the bits of the floats:
a radix select's first byte (sign and exponent) put nearly every score of a row into one or
two of 256 bins, and the histogram's shared-memory atomics on them serialised (136 us a 46K
row on the H200, raw/bench-attention-dsv4-flash-tp2-20261130T171947). At 46K keys a row is
184 KB, which stays in L2 between passes.

Positions can be mapped to cache rows on the way out (`split`, `shift`): a decode stream's
own tail lives `shift[q]` rows further on in the flat cache from virtual position `split` on.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.moe.compiled import launch, recording


@triton.jit
def _buckets(scores, hi, inverse_width, BINS: tl.constexpr):
    """Bucket of each score counted from the top: 0 holds hi, BINS - 1 holds lo."""
    return tl.minimum((hi - scores) * inverse_width, BINS - 1).to(tl.int32)


@triton.jit
def _to_rows(positions, split, shift, SHIFTED: tl.constexpr):
    if SHIFTED:
        positions = tl.where(positions >= split, positions + shift, positions)
    return positions


@triton.jit
def _select_kernel(
    scores_ptr, pos_ptr, shift_ptr, out_ptr, length, split, stride_sq, stride_oq,
    TOPK: tl.constexpr, WINDOW: tl.constexpr, WINDOW_P: tl.constexpr, BLOCK: tl.constexpr,
    BINS: tl.constexpr, SHIFTED: tl.constexpr,
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
        width = (hi - lo) / BINS
        inverse_width = tl.where(width > 0, 1 / width, 0.0)  # all equal: one bucket
        bins = tl.arange(0, BINS)
        counts = tl.zeros((BINS,), tl.int32)
        for h0 in range(0, candidates, BLOCK):
            h = h0 + lane
            beyond = h >= candidates  # the tail's lanes land in the last bucket: taken back out
            bucket = _buckets(tl.load(row + h, mask=~beyond, other=0.0), hi, inverse_width, BINS)
            bucket = tl.where(beyond, BINS - 1, bucket)
            misses = tl.sum(beyond.to(tl.int32), axis=0)
            counts += tl.histogram(bucket, BINS) - tl.where(bins == BINS - 1, misses, 0)
        reached = tl.cumsum(counts, axis=0)  # scores in this bucket or a higher one
        cut = tl.min(tl.where(reached >= TOPK, bins, BINS), axis=0)
        need = TOPK - tl.sum(tl.where(bins < cut, counts, 0), axis=0)  # picks from the cut
        written = tl.zeros((), tl.int32)
        ties = tl.zeros((), tl.int32)
        for w0 in range(0, candidates, BLOCK):
            w = w0 + lane
            ok = w < candidates
            bucket = _buckets(tl.load(row + w, mask=ok, other=0.0), hi, inverse_width, BINS)
            above = ok & (bucket < cut)
            equal = ok & (bucket == cut)
            tie_rank = ties + tl.cumsum(equal.to(tl.int32), axis=0)
            take = above | (equal & (tie_rank <= need))
            slot = written + tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(out + slot, _to_rows(w, split, shift, SHIFTED), mask=take)
            written += tl.sum(take.to(tl.int32), axis=0)
            ties += tl.sum(equal.to(tl.int32), axis=0)


def select_positions_triton(
    scores: Tensor,
    query_pos: Tensor,
    topk: int,
    window: int,
    split: int | None = None,
    shift: Tensor | None = None,
    bins: int = 2048,
    block: int = 2048,
    num_warps: int = 8,
) -> Tensor:
    """Key positions each query attends to, (Q, topk + window) int64 with -1 for unused slots,
    as `reference.select_positions` defines them (the top-k part in position order, not best
    first; its cut within one of `bins` buckets of the row's score range).

    With `shift` (Q,) int64, positions from `split` on come back as cache rows `position +
    shift[q]`. Scores must be fp32 with contiguous rows."""
    if scores.dim() != 2 or query_pos.shape != (scores.shape[0],):
        raise ValueError(
            f"select_positions expects scores (Q, L) and query_pos (Q,), got "
            f"{tuple(scores.shape)} and {tuple(query_pos.shape)}"
        )
    if scores.dtype != torch.float32 or scores.stride(1) != 1:
        raise ValueError("select_positions_triton needs fp32 scores with contiguous rows.")
    if topk < 1 or window < 0 or bins < 2 or bins & (bins - 1):
        raise ValueError(f"need topk >= 1, window >= 0 and a power of two of bins; got "
                         f"{topk}, {window}, {bins}")  # fmt: skip
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
            BINS=bins, SHIFTED=shift is not None, num_warps=num_warps,
        )  # fmt: skip
    return out
