"""Top-k position selection on the GPU: a radix select per query row, in one program a row
(`select_positions_triton`) or, for decode rows, over programs of a chunk of positions each
(`select_chunked.select_after_first_round`, after the FP8 indexer's first round).

What `reference.select_positions` returns (the top-k candidates strictly before the sliding
window, then the window, -1 for unused slots), without torch.topk over the context and the
dozen torch ops around it. One program owns a query row and never sorts it:

1. Each score becomes an int32 key that orders like the float (negative floats have their
   magnitude bits flipped), so a radix select on integers is a select on scores.
2. `rounds` passes build a histogram of one digit of the keys (a byte by default), high digit
   first, among the keys that share the digits chosen so far, and keep the digit holding the
   k-th largest.
3. A last pass writes every position whose chosen digits beat that prefix, then positions
   equal to it in position order until k are written (ties broken by position, as a stable
   select).

Two rounds of bytes (the default) fix the cut's top 16 bits: sign, exponent and 7 mantissa
bits, the precision of bf16, so a pick falls at most 2**-7 of the cut below the exact fp32
cut, inside the 1% the workbench's selection check allows (`rounds=4` is exact). Each pass
reads the row once; at 46K keys a row is 184 KB.

The passes are bound by instructions, not memory: in ncu a 4096-row prefill chunk at 46K
context issued on 59% of cycles with DRAM at 12% (raw/logs/h200-ncu-select-prefill-46K-*.txt),
and `tl.histogram` is most of a pass (a warp vote per digit bit per key). Narrower digits
did not pay for their extra passes (4 bits: 2.57 ms, 6 bits: 2.52, 8 bits: 2.73 at 8
warps); one warp a row over 512-key blocks did best, 2.36 ms
(raw/logs/h200-tune-attention-20261201T0616.csv).

Two other designs measured slower on the H200 (raw/logs/h200-tune-attention.csv, a 46K decode
row and a 4096-row prefill chunk): 2048 equal buckets over each row's score range, 372 us and
11.4 ms (`tl.histogram`'s cost grows with its bins), and a threshold search counting by
compares (the candidates' range, two rounds of 32 thresholds), 177 us and 3.4 ms, its count
loop compute-bound (ncu: 80% integer pipe); this one takes 136 us and 2.65 ms. A decode row is
one program on one SM there (12.5% occupancy in ncu), so decode splits the row: each program
histograms its chunk, every program of the second round sums the chunks' first-round
histograms, and each program of the picks places its chunk's picks after the counts of the
chunks before it, so the picks land in the same slots as the one-program select's (34 us
with the indexer for a 46K row, ncu/attention-fp8-T1-partindexer_select).

Positions can be mapped to cache rows on the way out (`split`, `shift`): a decode stream's
own tail lives `shift[q]` rows further on in the flat cache from virtual position `split` on,
which is what `Cache.virtual_to_flat` computes with five torch ops.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch, recording
from kernels.moe.routing import planned_sms

BINS = 256
DIGITS = (4, 5, 6, 8)  # bits a round of the one-program select may fix
ROWS_PER_SM_FOR_ONE_WARP = 4  # one-program select: one warp a row from this many rows an SM


@triton.jit
def ordered_keys(scores):
    """int32 keys with the order of the fp32 scores (-inf lowest)."""
    bits = scores.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def masked_histogram(digit, match):
    """256-bin histogram of `digit` (0..255) over the lanes where `match` holds."""
    bins = tl.arange(0, 256)
    misses = tl.sum((~match).to(tl.int32), axis=0)  # counted in bin 0: taken back out
    return tl.histogram(tl.where(match, digit, 0), 256) - tl.where(bins == 0, misses, 0)


@triton.jit
def high_byte_histogram(scores, match):
    """The first round of the radix select: a histogram of the scores' signed high byte."""
    return masked_histogram((ordered_keys(scores) >> 24) + 128, match)


@triton.jit
def choose_digit(counts, need, RADIX: tl.constexpr):
    """The bin holding the `need`-th largest key, and what is still needed at or below it."""
    bins = tl.arange(0, RADIX)
    at_or_above = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0) + counts
    chosen = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
    return chosen, need - tl.sum(tl.where(bins > chosen, counts, 0), axis=0)


@triton.jit
def to_rows(positions, split, shift, SHIFTED: tl.constexpr):
    if SHIFTED:
        positions = tl.where(positions >= split, positions + shift, positions)
    return positions


@triton.jit
def _select_kernel(
    scores_ptr, pos_ptr, shift_ptr, out_ptr, length, split, stride_sq, stride_oq,
    TOPK: tl.constexpr, WINDOW: tl.constexpr, WINDOW_P: tl.constexpr, BLOCK: tl.constexpr,
    ROUNDS: tl.constexpr, DIGIT: tl.constexpr, SHIFTED: tl.constexpr,
):  # fmt: skip
    row, out, shift, candidates = begin_row(scores_ptr, pos_ptr, shift_ptr, out_ptr, length,
                                            split, stride_sq, stride_oq, TOPK, WINDOW,
                                            WINDOW_P, SHIFTED)  # fmt: skip
    if candidates <= TOPK:
        pick_everything(out, candidates, split, shift, TOPK, BLOCK, SHIFTED)
    else:
        select_row(out, row, candidates, split, shift, TOPK, BLOCK, ROUNDS, DIGIT, SHIFTED)


@triton.jit
def begin_row(scores_ptr, pos_ptr, shift_ptr, out_ptr, length, split, stride_sq, stride_oq,
              TOPK, WINDOW, WINDOW_P, SHIFTED: tl.constexpr):  # fmt: skip
    """(scores row, output row, shift, candidates) of this program's query, one program a
    row, with its window columns written; the candidates are positions [0, candidates)."""
    query = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + query)
    shift = tl.load(shift_ptr + query) if SHIFTED else 0
    row = scores_ptr + query * stride_sq
    out = out_ptr + query * stride_oq
    write_window(out, pos, length, split, shift, TOPK, WINDOW, WINDOW_P, SHIFTED)
    candidates = tl.minimum(tl.maximum(pos - WINDOW + 1, 0), length).to(tl.int32)
    return row, out, shift, candidates


@triton.jit
def pick_everything(out, candidates, split, shift, TOPK, BLOCK: tl.constexpr, SHIFTED):
    """Every candidate picked (no more than TOPK of them), the rest of the slots unused."""
    lane = tl.arange(0, BLOCK)
    for s0 in range(0, TOPK, BLOCK):
        slots = s0 + lane
        picked = tl.where(slots < candidates, to_rows(slots, split, shift, SHIFTED), -1)
        tl.store(out + slots, picked, mask=slots < TOPK)


@triton.jit
def radix_cut(src, count, need, STEP: tl.constexpr, ROUNDS: tl.constexpr, DIGIT: tl.constexpr,
              BLOCK: tl.constexpr):  # fmt: skip
    """(prefix, need): the top ROUNDS x DIGIT bits of the `need`-th largest of the scores
    src[0], src[STEP], ..., src[(count - 1) * STEP] as a signed prefix of its key, and how
    many keys with that prefix the picks take."""
    RADIX: tl.constexpr = 1 << DIGIT
    lane = tl.arange(0, BLOCK)
    bins = tl.arange(0, RADIX)
    prefix = tl.zeros((), tl.int32)  # the chosen high digits of the cut, signed
    matched = count  # keys that share the prefix: this round's to count
    lanes = tl.cdiv(count, BLOCK) * BLOCK
    for r in tl.static_range(ROUNDS):
        low_bit = 32 - DIGIT * (r + 1)  # constexpr: r is unrolled
        counts = tl.zeros((RADIX,), tl.int32)
        # Lanes outside the count fall in bin 0 (past the count, -inf's keys are the lowest)
        # and come out of it once a round, not once a block: a block's count of them was a
        # reduction across the program's warps.
        for i0 in range(0, count, BLOCK):
            ok = i0 + lane < count
            keys = ordered_keys(tl.load(src + (i0 + lane) * STEP, mask=ok,
                                         other=float("-inf")))  # fmt: skip
            if r == 0:  # the top digit holds the sign: shifted arithmetically, then offset
                counts += tl.histogram((keys >> low_bit) + RADIX // 2, RADIX)
            else:
                match = ok & ((keys >> (low_bit + DIGIT)) == prefix)
                counts += tl.histogram(tl.where(match, (keys >> low_bit) & (RADIX - 1), 0),
                                       RADIX)  # fmt: skip
        counts -= tl.where(bins == 0, lanes - matched, 0)
        chosen, need = choose_digit(counts, need, RADIX)
        matched = tl.sum(tl.where(bins == chosen, counts, 0), axis=0)
        prefix = chosen - RADIX // 2 if r == 0 else prefix * RADIX + chosen
    return prefix, need


@triton.jit
def select_row(out, row, candidates, split, shift, TOPK, BLOCK: tl.constexpr,
               ROUNDS: tl.constexpr, DIGIT: tl.constexpr, SHIFTED):  # fmt: skip
    """The radix select over row[0:candidates] (more than TOPK): its picks, in position
    order, from slot 0 of `out`."""
    prefix, need = radix_cut(row, candidates, TOPK, 1, ROUNDS, DIGIT, BLOCK)
    lane = tl.arange(0, BLOCK)
    written = tl.zeros((), tl.int32)
    ties = tl.zeros((), tl.int32)
    for j0 in range(0, candidates, BLOCK):
        j = j0 + lane
        ok = j < candidates
        written, ties = write_picks(out, tl.load(row + j, mask=ok, other=float("-inf")), j, ok,
                                    prefix, need, written, ties, split, shift,
                                    32 - DIGIT * ROUNDS, SHIFTED, 0)  # fmt: skip


@triton.jit
def write_window(out, pos, length, split, shift, TOPK, WINDOW, WINDOW_P, SHIFTED):
    """The window columns: pos, pos-1, ..., pos-WINDOW+1, inside [0, length)."""
    back = tl.arange(0, WINDOW_P)
    recent = pos - back
    in_range = (recent >= 0) & (recent < length)
    recent = tl.where(in_range, to_rows(recent, split, shift, SHIFTED), -1)
    tl.store(out + TOPK + back, recent, mask=back < WINDOW)


@triton.jit
def write_picks(out, scores, positions, ok, prefix, need, written, ties, split, shift, CUT_BIT,
                SHIFTED, offset):  # fmt: skip
    """Write the `positions` (where `ok`) whose score's key beats `prefix` in its bits from
    CUT_BIT up, and those equal to it while fewer than `need` equal ones came before (`ties`
    of them), from slot `written` on, in order, as cache rows `offset` rows on; return the new
    `written` and `ties`."""
    top = ordered_keys(scores) >> CUT_BIT
    above = ok & (top > prefix)
    equal = ok & (top == prefix)
    tie_rank = ties + tl.cumsum(equal.to(tl.int32), axis=0)
    take = above | (equal & (tie_rank <= need))
    slot = written + tl.cumsum(take.to(tl.int32), axis=0) - 1
    tl.store(out + slot, to_rows(positions, split, shift, SHIFTED) + offset, mask=take)
    return written + tl.sum(take.to(tl.int32), axis=0), ties + tl.sum(equal.to(tl.int32), axis=0)


def check_layout(query_pos: Tensor, split: int | None, shift: Tensor | None) -> None:
    if (shift is None) != (split is None) or (shift is not None and shift.shape != query_pos.shape):
        raise ValueError("give split and shift (Q,) together, or neither.")


def check_select(
    scores: Tensor,
    query_pos: Tensor,
    topk: int,
    window: int,
    split: int | None,
    shift: Tensor | None,
    rounds: int | None,
    digit_bits: int,
) -> int:
    """The rounds a one-program select runs (None: the fewest that fix 16 bits), after a
    clear error for any input it cannot take."""
    if scores.dim() != 2 or query_pos.shape != (scores.shape[0],):
        raise ValueError(
            f"select_positions expects scores (Q, L) and query_pos (Q,), got "
            f"{tuple(scores.shape)} and {tuple(query_pos.shape)}"
        )
    if scores.dtype != torch.float32 or scores.stride(1) != 1:
        raise ValueError("select_positions_triton needs fp32 scores with contiguous rows.")
    rounds = -(-16 // digit_bits) if rounds is None else rounds
    if topk < 1 or window < 0 or digit_bits not in DIGITS or not 1 <= rounds * digit_bits <= 32:
        raise ValueError(
            f"need topk >= 1, window >= 0, digit_bits in {DIGITS} and 1 <= rounds x digit_bits "
            f"<= 32 (the key's bits); got topk={topk}, window={window}, rounds={rounds}, "
            f"digit_bits={digit_bits}"
        )
    check_layout(query_pos, split, shift)
    return rounds


def default_row_programs(rows: int, device: torch.device) -> tuple[int, int]:
    """(warps, keys a step) of the one-program select: one warp over 512 keys where rows fill
    the GPU several times over (a prefill chunk: 2.36 ms against 2.73 at 8 warps over 2048
    for 4096 rows at 46K context on the H200), 8 warps over 2048 where a few rows would each
    leave one warp to walk a whole row (one decode row at 46K: 0.49 ms against 0.14;
    raw/logs/h200-tune-attention-20261201T0616.csv and raw/bench-attention-*T062248)."""
    if rows >= ROWS_PER_SM_FOR_ONE_WARP * planned_sms(device):
        return 1, 512
    return 8, 2048


def select_positions_triton(
    scores: Tensor,
    query_pos: Tensor,
    topk: int,
    window: int,
    split: int | None = None,
    shift: Tensor | None = None,
    rounds: int | None = None,
    block: int | None = None,
    num_warps: int | None = None,
    digit_bits: int = 8,
) -> Tensor:
    """Key positions each query attends to, (Q, topk + window) int64 with -1 for unused slots,
    as `reference.select_positions` defines them (the top-k part in position order, not best
    first; its cut exact to the top `rounds` x `digit_bits` bits of the score: `rounds`
    defaults to the fewest that fix 16). `num_warps` and `block` default by the row count
    (`default_row_programs`).

    With `shift` (Q,) int64, positions from `split` on come back as cache rows `position +
    shift[q]`. Scores must be fp32 with contiguous rows."""
    rounds = check_select(scores, query_pos, topk, window, split, shift, rounds, digit_bits)
    out = torch.empty(scores.shape[0], topk + window, dtype=torch.int64, device=scores.device)
    if len(out):
        launch_row_select(_select_kernel, scores, query_pos, out, topk, window, split, shift,
                          rounds, digit_bits, block, num_warps)  # fmt: skip
    return out


def launch_row_select(
    kernel: triton.JITFunction,
    scores: Tensor,
    query_pos: Tensor,
    out: Tensor,
    topk: int,
    window: int,
    split: int | None,
    shift: Tensor | None,
    rounds: int,
    digit_bits: int,
    block: int | None,
    num_warps: int | None,
    *extra: object,
    **constants: object,
) -> None:
    """Launch a one-program-a-row select `kernel` into `out` with the arguments and constants
    every such kernel takes (`_select_kernel`'s), then `extra` arguments and `constants`;
    warps and keys a step default by the row count (`default_row_programs`)."""
    num_q, length = scores.shape
    pos = query_pos.to(torch.int64)
    warps, keys = default_row_programs(num_q, scores.device)
    with recording():
        launch(
            kernel, (num_q,), scores, pos, pos if shift is None else shift, out, length,
            length if split is None else split, scores.stride(0), out.stride(0), *extra,
            TOPK=topk, WINDOW=window, WINDOW_P=triton.next_power_of_2(max(window, 1)),
            BLOCK=block or keys, ROUNDS=rounds, DIGIT=digit_bits, SHIFTED=shift is not None,
            num_warps=num_warps or warps, **constants,
        )  # fmt: skip
