"""The chunked top-k select for decode rows: a row's positions split over programs of
SELECT_CHUNK each, so one query's 46K scores fill many SMs where the one-program select
(`select.select_positions_triton`) walked them on one. The FP8 indexer writes the first round
as it scores (`FirstRound`: each chunk's high-byte histogram and the row's total); here the
second round counts each chunk's second byte under the chosen high byte, and the picks place
each chunk's picks after the counts of the chunks before it, slot for slot what the
one-program select writes (`select`'s docstring has the design and the measurements).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.attention.select import (
    BINS,
    check_layout,
    choose_digit,
    masked_histogram,
    ordered_keys,
    to_rows,
    write_picks,
    write_window,
)
from kernels.compiled import launch, recording
from kernels.zeroed import kept_zeros

# Positions a program of the chunked (decode) select owns: a decode row's 46K scores are 90
# programs, where the one-program select walked them on one SM (136 us). With the indexer's
# first round, 34 us at 512 on the H200 against 38 at 1024 and 51 at 2048
# (raw/logs/h200-tune-attention.csv); with the picks' sums in one pass, 31.8 us at 512
# against 35.8 at 1024 and 136 at 256 (raw/logs/h200-tune-attention-20261201.csv).
SELECT_CHUNK = 512
CHUNK_ROWS = 32  # chunk histograms the picks sum per step


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
    chosen0, _ = choose_digit(tl.load(totals_ptr + query * 256 + bins), TOPK, 256)
    j = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = j < candidates
    keys = ordered_keys(tl.load(scores_ptr + query * stride_sq + j, mask=ok,
                                 other=float("-inf")))  # fmt: skip
    counts = masked_histogram((keys >> 16) & 255, ok & ((keys >> 24) == chosen0 - 128))
    tl.store(second_ptr + query * chunks * 256 + chunk * 256 + bins, counts)


@triton.jit
def _chunk_picks_kernel(
    scores_ptr, pos_ptr, shift_ptr, first_ptr, second_ptr, totals_ptr, out_ptr, extra_ptr,
    length, split, chunks, offset, stride_sq, stride_oq, stride_eq, TOPK: tl.constexpr,
    WINDOW: tl.constexpr, WINDOW_P: tl.constexpr, EXTRA: tl.constexpr, EXTRA_P: tl.constexpr,
    BLOCK: tl.constexpr, CHUNK_ROWS: tl.constexpr, SHIFTED: tl.constexpr,
):  # fmt: skip
    """The chunked select's picks: the cut from both rounds' sums, this chunk's first slot
    from the chunks before it, then its picks in position order (what the one-program select
    writes, slot for slot), as cache rows `offset` rows on. The row's first program writes
    the window columns, and then EXTRA columns copied from the row's `extra` (rows given by
    the caller), and zeroes the row's first-round total for the next select: only the second
    round read it (`FirstRound`)."""
    query = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    pos = tl.load(pos_ptr + query)
    shift = tl.load(shift_ptr + query) if SHIFTED else 0
    row = scores_ptr + query * stride_sq
    out = out_ptr + query * stride_oq
    if chunk == 0:
        write_window(out, pos, length, split, shift, TOPK, WINDOW, WINDOW_P, SHIFTED)
        if EXTRA > 0:
            e = tl.arange(0, EXTRA_P)
            extra = tl.load(extra_ptr + query * stride_eq + e, mask=e < EXTRA)
            tl.store(out + TOPK + WINDOW + e, extra, mask=e < EXTRA)
        tl.store(totals_ptr + query * 256 + tl.arange(0, 256), tl.zeros((256,), tl.int32))
    candidates = tl.minimum(tl.maximum(pos - WINDOW + 1, 0), length).to(tl.int32)
    j = chunk * BLOCK + tl.arange(0, BLOCK)
    if candidates <= TOPK:  # every candidate is picked, the rest of the slots unused
        everything = tl.where(j < candidates, to_rows(j, split, shift, SHIFTED) + offset, -1)
        tl.store(out + j, everything, mask=j < TOPK)
    else:
        first, second, first_before, second_before = _sums_and_before(
            first_ptr + query * chunks * 256, second_ptr + query * chunks * 256, chunks, chunk,
            CHUNK_ROWS,
        )  # fmt: skip
        chosen0, need0 = choose_digit(first, TOPK, 256)
        chosen1, need = choose_digit(second, need0, 256)
        # Keys of the chunks before this one above the cut's 16-bit prefix, and equal to it.
        bins = tl.arange(0, 256)
        above = tl.sum(tl.where(bins > chosen0, first_before, 0), axis=0) + tl.sum(
            tl.where(bins > chosen1, second_before, 0), axis=0
        )
        equal = tl.sum(tl.where(bins == chosen1, second_before, 0), axis=0)
        ok = j < candidates
        write_picks(out, tl.load(row + j, mask=ok, other=float("-inf")), j, ok,
                    (chosen0 - 128) * 256 + chosen1, need, above + tl.minimum(equal, need),
                    equal, split, shift, 16, SHIFTED, offset)  # fmt: skip


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
    offset: int = 0,
    extra: Tensor | None = None,
) -> Tensor:
    """`select_positions_triton`'s result (two rounds) over programs of `chunk` positions
    each, for rows too few to fill the GPU one program a row: decode. The first round is
    `first_round`, which the FP8 indexer writes as it scores the keys (`FirstRound`); this
    is the second round and the picks, two launches. Picks come in position order, slot for
    slot as the one-program select. `chunk` is a power of two of at least topk.

    The picks are written `offset` rows on, and `extra` (Q, e) int64 rows, where given, are
    copied after the window columns: what a compressed layer's queries attend to besides the
    entries picked (kernels.attention.compress), without a launch of their own."""
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
    check_layout(query_pos, split, shift)
    width = 0 if extra is None else extra.shape[1]
    if extra is not None and (extra.shape[0] != num_q or extra.dtype != torch.int64
                              or extra.stride(1) != 1):  # fmt: skip
        raise ValueError(f"extra rows must be ({num_q}, e) int64 with contiguous rows; got "
                         f"{tuple(extra.shape)} {extra.dtype}.")  # fmt: skip
    pos = query_pos.to(torch.int64)
    second = torch.empty_like(hist)
    out = torch.empty(num_q, topk + window + width, dtype=torch.int64, device=scores.device)
    totals = first_round.totals
    with recording():
        launch(
            _second_round_kernel, (num_q, chunks), scores, pos, hist, second, totals, length,
            window, chunks, scores.stride(0), TOPK=topk, BLOCK=chunk, num_warps=num_warps,
        )  # fmt: skip
        launch(
            _chunk_picks_kernel, (num_q, chunks), scores, pos, pos if shift is None else shift,
            hist, second, totals, out, out if extra is None else extra, length,
            length if split is None else split, chunks, offset, scores.stride(0), out.stride(0),
            0 if extra is None else extra.stride(0), TOPK=topk, WINDOW=window,
            WINDOW_P=triton.next_power_of_2(max(window, 1)), EXTRA=width,
            EXTRA_P=triton.next_power_of_2(max(width, 1)), BLOCK=chunk, CHUNK_ROWS=CHUNK_ROWS,
            SHIFTED=shift is not None, num_warps=num_warps,
        )  # fmt: skip
    return out
