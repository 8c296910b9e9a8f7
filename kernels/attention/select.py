"""Top-k position selection on the GPU: a radix select per query row, in one program a row
(`select_positions_triton`) or, for decode rows, over programs of SELECT_CHUNK positions each
(`select_after_first_round`, after the FP8 indexer's first round).

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

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.moe.compiled import launch, recording
from kernels.moe.routing import planned_sms
from kernels.zeroed import kept_zeros

BINS = 256
DIGITS = (4, 5, 6, 8)  # bits a round of the one-program select may fix
# Positions a program of the chunked (decode) select owns: a decode row's 46K scores are 90
# programs, where the one-program select walked them on one SM (136 us). With the indexer's
# first round, 34 us at 512 on the H200 against 38 at 1024 and 51 at 2048
# (raw/logs/h200-tune-attention.csv); with the picks' sums in one pass, 31.8 us at 512
# against 35.8 at 1024 and 136 at 256 (raw/logs/h200-tune-attention-20261201.csv).
SELECT_CHUNK = 512
ROWS_PER_SM_FOR_ONE_WARP = 4  # one-program select: one warp a row from this many rows an SM
CHUNK_ROWS = 32  # chunk histograms the picks sum per step


@triton.jit
def ordered_keys(scores):
    """int32 keys with the order of the fp32 scores (-inf lowest)."""
    bits = scores.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _masked_histogram(digit, match):
    """256-bin histogram of `digit` (0..255) over the lanes where `match` holds."""
    bins = tl.arange(0, 256)
    misses = tl.sum((~match).to(tl.int32), axis=0)  # counted in bin 0: taken back out
    return tl.histogram(tl.where(match, digit, 0), 256) - tl.where(bins == 0, misses, 0)


@triton.jit
def high_byte_histogram(scores, match):
    """The first round of the radix select: a histogram of the scores' signed high byte."""
    return _masked_histogram((ordered_keys(scores) >> 24) + 128, match)


@triton.jit
def _choose(counts, need, RADIX: tl.constexpr):
    """The bin holding the `need`-th largest key, and what is still needed at or below it."""
    bins = tl.arange(0, RADIX)
    at_or_above = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0) + counts
    chosen = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
    return chosen, need - tl.sum(tl.where(bins > chosen, counts, 0), axis=0)


@triton.jit
def _to_rows(positions, split, shift, SHIFTED: tl.constexpr):
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
        picked = tl.where(slots < candidates, _to_rows(slots, split, shift, SHIFTED), -1)
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
        chosen, need = _choose(counts, need, RADIX)
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
                                    32 - DIGIT * ROUNDS, SHIFTED)  # fmt: skip


@triton.jit
def write_window(out, pos, length, split, shift, TOPK, WINDOW, WINDOW_P, SHIFTED):
    """The window columns: pos, pos-1, ..., pos-WINDOW+1, inside [0, length)."""
    back = tl.arange(0, WINDOW_P)
    recent = pos - back
    in_range = (recent >= 0) & (recent < length)
    recent = tl.where(in_range, _to_rows(recent, split, shift, SHIFTED), -1)
    tl.store(out + TOPK + back, recent, mask=back < WINDOW)


@triton.jit
def write_picks(out, scores, positions, ok, prefix, need, written, ties, split, shift, CUT_BIT,
                SHIFTED):  # fmt: skip
    """Write the `positions` (where `ok`) whose score's key beats `prefix` in its bits from
    CUT_BIT up, and those equal to it while fewer than `need` equal ones came before (`ties`
    of them), from slot `written` on, in order; return the new `written` and `ties`."""
    top = ordered_keys(scores) >> CUT_BIT
    above = ok & (top > prefix)
    equal = ok & (top == prefix)
    tie_rank = ties + tl.cumsum(equal.to(tl.int32), axis=0)
    take = above | (equal & (tie_rank <= need))
    slot = written + tl.cumsum(take.to(tl.int32), axis=0) - 1
    tl.store(out + slot, _to_rows(positions, split, shift, SHIFTED), mask=take)
    return written + tl.sum(take.to(tl.int32), axis=0), ties + tl.sum(equal.to(tl.int32), axis=0)


@triton.jit
def _sums_and_before(first, second, chunks, chunk, CHUNK_ROWS: tl.constexpr):
    """Both rounds' histograms summed over a row's `chunks` chunks, and over the chunks before
    `chunk`: four (256,) counts from one pass over the histograms (the picks kernel ran one
    pass per sum, four in all, and they were most of its time)."""
    bins = tl.arange(0, 256)[None, :]
    c = tl.arange(0, CHUNK_ROWS)
    total_first = tl.zeros((256,), tl.int32)
    total_second = tl.zeros((256,), tl.int32)
    before_first = tl.zeros((256,), tl.int32)
    before_second = tl.zeros((256,), tl.int32)
    for c0 in range(0, chunks, CHUNK_ROWS):
        rows = c0 + c
        at = rows[:, None] * 256 + bins
        present = (rows < chunks)[:, None]
        high = tl.load(first + at, mask=present, other=0)
        low = tl.load(second + at, mask=present, other=0)
        earlier = (rows < chunk)[:, None]
        total_first += tl.sum(high, axis=0)
        total_second += tl.sum(low, axis=0)
        before_first += tl.sum(tl.where(earlier, high, 0), axis=0)
        before_second += tl.sum(tl.where(earlier, low, 0), axis=0)
    return total_first, total_second, before_first, before_second


@triton.jit
def _second_round_kernel(
    scores_ptr, pos_ptr, first_ptr, second_ptr, totals_ptr, length, window, chunks, stride_sq,
    TOPK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The chunked select's second round: the cut's high byte from the row's first-round
    total, then the second byte of this chunk's keys whose high byte is that one, counted
    into the chunk's histogram."""
    query = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    bins = tl.arange(0, 256)
    pos = tl.load(pos_ptr + query)
    candidates = tl.minimum(tl.maximum(pos - window + 1, 0), length).to(tl.int32)
    chosen0, _ = _choose(tl.load(totals_ptr + query * 256 + bins), TOPK, 256)
    j = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = j < candidates
    keys = ordered_keys(tl.load(scores_ptr + query * stride_sq + j, mask=ok,
                                 other=float("-inf")))  # fmt: skip
    counts = _masked_histogram((keys >> 16) & 255, ok & ((keys >> 24) == chosen0 - 128))
    tl.store(second_ptr + query * chunks * 256 + chunk * 256 + bins, counts)


@triton.jit
def _chunk_picks_kernel(
    scores_ptr, pos_ptr, shift_ptr, first_ptr, second_ptr, totals_ptr, out_ptr, length, split,
    chunks, stride_sq, stride_oq, TOPK: tl.constexpr, WINDOW: tl.constexpr,
    WINDOW_P: tl.constexpr, BLOCK: tl.constexpr, CHUNK_ROWS: tl.constexpr,
    SHIFTED: tl.constexpr,
):  # fmt: skip
    """The chunked select's picks: the cut from both rounds' sums, this chunk's first slot
    from the chunks before it, then its picks in position order (what the one-program select
    writes, slot for slot). The row's first program zeroes the row's first-round total for
    the next select: only the second round read it (`FirstRound`)."""
    query = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    pos = tl.load(pos_ptr + query)
    shift = tl.load(shift_ptr + query) if SHIFTED else 0
    row = scores_ptr + query * stride_sq
    out = out_ptr + query * stride_oq
    if chunk == 0:
        write_window(out, pos, length, split, shift, TOPK, WINDOW, WINDOW_P, SHIFTED)
        tl.store(totals_ptr + query * 256 + tl.arange(0, 256), tl.zeros((256,), tl.int32))
    candidates = tl.minimum(tl.maximum(pos - WINDOW + 1, 0), length).to(tl.int32)
    j = chunk * BLOCK + tl.arange(0, BLOCK)
    if candidates <= TOPK:  # every candidate is picked, the rest of the slots unused
        everything = tl.where(j < candidates, _to_rows(j, split, shift, SHIFTED), -1)
        tl.store(out + j, everything, mask=j < TOPK)
    else:
        first, second, first_before, second_before = _sums_and_before(
            first_ptr + query * chunks * 256, second_ptr + query * chunks * 256, chunks, chunk,
            CHUNK_ROWS,
        )  # fmt: skip
        chosen0, need0 = _choose(first, TOPK, 256)
        chosen1, need = _choose(second, need0, 256)
        # Keys of the chunks before this one above the cut's 16-bit prefix, and equal to it.
        bins = tl.arange(0, 256)
        above = tl.sum(tl.where(bins > chosen0, first_before, 0), axis=0) + tl.sum(
            tl.where(bins > chosen1, second_before, 0), axis=0
        )
        equal = tl.sum(tl.where(bins == chosen1, second_before, 0), axis=0)
        ok = j < candidates
        write_picks(out, tl.load(row + j, mask=ok, other=float("-inf")), j, ok,
                    (chosen0 - 128) * 256 + chosen1, need, above + tl.minimum(equal, need),
                    equal, split, shift, 16, SHIFTED)  # fmt: skip


def _check_layout(query_pos: Tensor, split: int | None, shift: Tensor | None) -> None:
    if (shift is None) != (split is None) or (shift is not None and shift.shape != query_pos.shape):
        raise ValueError("give split and shift (Q,) together, or neither.")


@dataclass(frozen=True)
class FirstRound:
    """The chunked select's first round, as the FP8 indexer writes it: `chunks` (Q, C, 256),
    the high-byte histogram of each chunk's candidates, and `totals` (Q, 256), their sum per
    row, which the indexer's programs add to atomically, so the second round's programs read
    256 counts instead of each summing C histograms. The totals are zero between selects (the
    picks' first program of a row zeroes them), so one buffer per device serves every select
    on its stream and a CUDA graph replays them without a memset (`row_totals`). In the
    served profiles on the H200 the second round went from 6.4 to 2.1 us a decode layer
    (the served profiles committed in fe3db78 against those of f2603b4). Totals of the second round
    as well, with an arrival count so the picks' last program could zero them, made the picks
    slower (7.0 to 10.9 us: an acq_rel atomic in each of a row's programs, commit ac43cbf)."""

    chunks: Tensor
    totals: Tensor

    @classmethod
    def empty(cls, num_q: int, chunks: int, device: torch.device) -> "FirstRound":
        """Chunk histograms to be written, with the device's zeroed totals (`row_totals`)."""
        hist = torch.empty(num_q, chunks, BINS, dtype=torch.int32, device=device)
        return cls(hist, row_totals(num_q, device))

    @classmethod
    def of(cls, chunk_histograms: Tensor) -> "FirstRound":
        """A first round from chunk histograms made elsewhere (tests), with its own totals."""
        return cls(chunk_histograms, chunk_histograms.sum(1, dtype=torch.int32))


_totals: dict[torch.device, Tensor] = {}


def row_totals(num_q: int, device: torch.device) -> Tensor:
    """(num_q, 256) int32 zeros kept per device (`kernels.zeroed`): the select leaves them at
    zero for the next."""
    return kept_zeros(_totals, num_q, device, (BINS,))


def select_after_first_round(
    scores: Tensor,
    query_pos: Tensor,
    first_round: FirstRound,
    topk: int,
    window: int,
    split: int | None = None,
    shift: Tensor | None = None,
    chunk: int = SELECT_CHUNK,
    num_warps: int = 4,
) -> Tensor:
    """`select_positions_triton`'s result (two rounds) over programs of `chunk` positions
    each, for rows too few to fill the GPU one program a row: decode. The first round is
    `first_round`, which the FP8 indexer writes as it scores the keys (`FirstRound`); this
    is the second round and the picks, two launches. Picks come in position order, slot for
    slot as the one-program select. `chunk` is a power of two of at least topk."""
    num_q, length = scores.shape
    chunks = triton.cdiv(length, chunk)
    hist = first_round.chunks
    if (
        query_pos.shape != (num_q,)
        or hist.shape != (num_q, chunks, BINS)
        or first_round.totals.shape != (num_q, BINS)
    ):
        raise ValueError(
            f"select_after_first_round expects query_pos ({num_q},) and a first round of "
            f"({num_q}, {chunks}, {BINS}) chunk histograms with ({num_q}, {BINS}) totals; "
            f"got {tuple(query_pos.shape)}, {tuple(hist.shape)} and "
            f"{tuple(first_round.totals.shape)}."
        )
    if not 1 <= topk <= chunk or chunk & (chunk - 1) or window < 0:
        raise ValueError(f"need 1 <= topk <= chunk={chunk}, a power of two, and window >= 0; "
                         f"got topk={topk}, window={window}.")  # fmt: skip
    if (
        scores.dtype != torch.float32
        or scores.stride(1) != 1
        or not all(t.is_contiguous() for t in (hist, first_round.totals))
    ):
        raise ValueError("need fp32 scores with contiguous rows and a contiguous first round.")
    _check_layout(query_pos, split, shift)
    pos = query_pos.to(torch.int64)
    second = torch.empty_like(hist)
    out = torch.empty(num_q, topk + window, dtype=torch.int64, device=scores.device)
    totals = first_round.totals
    with recording():
        launch(
            _second_round_kernel, (num_q, chunks), scores, pos, hist, second, totals, length,
            window, chunks, scores.stride(0), TOPK=topk, BLOCK=chunk, num_warps=num_warps,
        )  # fmt: skip
        launch(
            _chunk_picks_kernel, (num_q, chunks), scores, pos, pos if shift is None else shift,
            hist, second, totals, out, length,
            length if split is None else split, chunks, scores.stride(0), out.stride(0),
            TOPK=topk, WINDOW=window, WINDOW_P=triton.next_power_of_2(max(window, 1)),
            BLOCK=chunk, CHUNK_ROWS=CHUNK_ROWS, SHIFTED=shift is not None, num_warps=num_warps,
        )  # fmt: skip
    return out


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
    _check_layout(query_pos, split, shift)
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
