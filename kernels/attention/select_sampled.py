"""The one-program top-k select with a sampled threshold: one full pass over a row instead of
three, the same picks in the same slots as `select.select_positions_triton`.

The radix select reads a row three times (two histogram rounds, then the picks) and is bound
by instructions, not memory (`select`'s docstring): `tl.histogram` votes once per digit bit
per key. Here a program first runs that radix select on a sample of its row (every STRIDE-th
candidate), for a rank a margin above topk / STRIDE, and keeps that key's 16-bit prefix as a
floor. One pass over the row then copies every candidate whose prefix reaches the floor, in
position order, into a per-row buffer of CAP slots (a compare and a prefix sum a key, no
histogram), and the radix select runs on those few hundred kept scores.

The picks are exactly the full row's: when at least topk candidates are kept, the top-k cut
is among them, and so is every key that shares its prefix (the floor is a prefix, not a
score), so the cut, its ties and their position order are the ones the full select finds.
When the sample misleads (fewer than topk kept, or more than CAP: long runs of equal scores,
or scores periodic in STRIDE), the program falls back to the radix select over the whole
row, so the result never depends on the sample, only the time does.

The rank's margin: the sample holds about topk / STRIDE of the row's top-k, a hypergeometric
count with a standard deviation below sqrt(topk / STRIDE); four of them above it keep topk
with room (at topk 512 and stride 16: rank 59 of the sample, about 950 of the row kept,
against CAP 2048).

On the H200 (raw/logs/h200-tune-attention-20261201T1055.csv, one run): 1.30 ms for a
4096-query prefill chunk at 46K context against 2.22 for the radix select at its defaults
(2.14 at its best setting), and 68 us against 124 us for one decode row. So the `triton`
variant selects with it, and the `fp8` variant wherever it does not fuse the select's first
round into its indexer (prefill).

Where that time went (ncu of the same chunk,
raw/logs/h200-ncu-select-sampled-prefill-46K-20261201T1635.txt): warps waiting on loads (35%
of stalls) with DRAM 37% busy, moving about three rows' bytes a row, since a sample of every
16th score touches every 64-byte piece of the row and each of the two radix rounds read it
again; and the full pass's prefix sum. So the sample is now copied once into a compact
scratch row that both rounds read, and the full pass keeps three blocks of loads in flight
(`FULL_PASS_STAGES`, cp.async): 0.95 ms for that chunk at two warps over 512 keys, against
1.48 in the same run before (one run, raw/logs/h200-tune-select-sampled-20261201T1640.csv).
"""

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.attention.select import (
    ROWS_PER_SM_FOR_ONE_WARP,
    begin_row,
    check_select,
    default_row_programs,
    launch_row_select,
    ordered_keys,
    pick_everything,
    radix_cut,
    select_row,
    write_picks,
)
from kernels.moe.routing import planned_sms

SAMPLE_STRIDE = 16
FULL_PASS_STAGES = tl.constexpr(3)  # the full pass's loads in flight (cp.async)


@triton.jit
def _sampled_select_kernel(
    scores_ptr, pos_ptr, shift_ptr, out_ptr, length, split, stride_sq, stride_oq,
    kept_scores_ptr, kept_pos_ptr, stride_kq, sample_ptr, stride_sample,
    TOPK: tl.constexpr, WINDOW: tl.constexpr, WINDOW_P: tl.constexpr, BLOCK: tl.constexpr,
    ROUNDS: tl.constexpr, DIGIT: tl.constexpr, SHIFTED: tl.constexpr, STRIDE: tl.constexpr,
    SAMPLE_RANK: tl.constexpr, CAP: tl.constexpr,
):  # fmt: skip
    CUT_BIT: tl.constexpr = 32 - DIGIT * ROUNDS
    KEEP_ALL: tl.constexpr = -(1 << (31 - CUT_BIT))  # the lowest prefix a key can have
    row, out, shift, candidates = begin_row(scores_ptr, pos_ptr, shift_ptr, out_ptr, length,
                                            split, stride_sq, stride_oq, TOPK, WINDOW,
                                            WINDOW_P, SHIFTED)  # fmt: skip
    if candidates <= TOPK:
        pick_everything(out, candidates, split, shift, TOPK, BLOCK, SHIFTED)
    else:
        query = tl.program_id(0).to(tl.int64)
        kept_scores = kept_scores_ptr + query * stride_kq
        kept_pos = kept_pos_ptr + query * stride_kq
        samples = candidates // STRIDE
        floor = tl.full((), KEEP_ALL, tl.int32)
        lane = tl.arange(0, BLOCK)
        if (candidates > CAP) & (samples >= SAMPLE_RANK):
            sample = sample_ptr + query * stride_sample
            for i0 in range(0, samples, BLOCK):  # one strided read, then contiguous rounds
                i = i0 + lane
                tl.store(sample + i, tl.load(row + i * STRIDE, mask=i < samples),
                         mask=i < samples)  # fmt: skip
            tl.debug_barrier()  # the sample, written by any thread, is read by any
            floor, _ = radix_cut(sample, samples, SAMPLE_RANK, 1, ROUNDS, DIGIT, BLOCK)
        kept = tl.zeros((), tl.int32)
        for j0 in tl.range(0, candidates, BLOCK, num_stages=FULL_PASS_STAGES):
            j = j0 + lane
            ok = j < candidates
            scores = tl.load(row + j, mask=ok, other=float("-inf"))
            take = ok & ((ordered_keys(scores) >> CUT_BIT) >= floor)
            slot = kept + tl.cumsum(take.to(tl.int32), axis=0) - 1
            room = take & (slot < CAP)
            tl.store(kept_scores + slot, scores, mask=room)
            tl.store(kept_pos + slot, j, mask=room)
            kept += tl.sum(take.to(tl.int32), axis=0)
        tl.debug_barrier()  # the kept rows, written by any thread, are read by any
        if (kept >= TOPK) & (kept <= CAP):
            prefix, need = radix_cut(kept_scores, kept, TOPK, 1, ROUNDS, DIGIT, BLOCK)
            written = tl.zeros((), tl.int32)
            ties = tl.zeros((), tl.int32)
            for i0 in range(0, kept, BLOCK):
                i = i0 + lane
                held = i < kept
                written, ties = write_picks(
                    out, tl.load(kept_scores + i, mask=held, other=float("-inf")),
                    tl.load(kept_pos + i, mask=held, other=0), held, prefix, need, written,
                    ties, split, shift, CUT_BIT, SHIFTED, 0,
                )  # fmt: skip
        else:  # the sample misled: the whole row
            select_row(out, row, candidates, split, shift, TOPK, BLOCK, ROUNDS, DIGIT, SHIFTED)


def sampled_row_programs(rows: int, device: torch.device) -> tuple[int, int]:
    """(warps, keys a step): two warps over 512 keys where rows fill the GPU several times
    over (a prefill chunk: 0.95 ms against 1.15 for one warp over 256 keys and 1.48 for one
    over 512 before the sample was compacted and the full pass pipelined, on the H200, one
    run: raw/logs/h200-tune-select-sampled-20261201T1640.csv), else the radix select's
    (`select.default_row_programs`)."""
    if rows >= ROWS_PER_SM_FOR_ONE_WARP * planned_sms(device):
        return 2, 512
    return default_row_programs(rows, device)


def sample_rank(topk: int, stride: int) -> int:
    """The sample's rank whose key prefix is the floor: topk / stride and four standard
    deviations of the sample's share of the top-k above it (module docstring)."""
    mean = topk / stride
    return math.ceil(mean + 4 * math.sqrt(mean)) + 4


def select_positions_sampled(
    scores: Tensor,
    query_pos: Tensor,
    topk: int,
    window: int,
    split: int | None = None,
    shift: Tensor | None = None,
    stride: int = SAMPLE_STRIDE,
    cap: int | None = None,
    rounds: int | None = None,
    block: int | None = None,
    num_warps: int | None = None,
    digit_bits: int = 8,
) -> Tensor:
    """`select_positions_triton(...)`'s result, slot for slot, from one full pass over each
    row after a select on every `stride`-th candidate (module docstring). `cap` kept scores a
    row (default: the power of two at or above 4 x topk) cost 8 bytes each of scratch, and
    the compact sample 4 bytes per `stride` positions. `num_warps` and `block` default by
    the row count (`sampled_row_programs`)."""
    rounds = check_select(scores, query_pos, topk, window, split, shift, rounds, digit_bits)
    cap = cap or triton.next_power_of_2(4 * topk)
    if not isinstance(stride, int) or stride < 2 or cap < topk:
        raise ValueError(f"need an integer stride >= 2 and cap >= topk={topk}; got "
                         f"stride={stride!r}, cap={cap}.")  # fmt: skip
    num_q = scores.shape[0]
    out = torch.empty(num_q, topk + window, dtype=torch.int64, device=scores.device)
    if num_q == 0:
        return out
    kept_scores = torch.empty(num_q, cap, dtype=torch.float32, device=scores.device)
    kept_pos = torch.empty(num_q, cap, dtype=torch.int32, device=scores.device)
    sample = torch.empty(num_q, triton.cdiv(scores.shape[1], stride), dtype=torch.float32,
                         device=scores.device)  # fmt: skip
    warps, keys = sampled_row_programs(num_q, scores.device)
    launch_row_select(
        _sampled_select_kernel, scores, query_pos, out, topk, window, split, shift, rounds,
        digit_bits, block or keys, num_warps or warps, kept_scores, kept_pos,
        kept_scores.stride(0), sample, sample.stride(0), STRIDE=stride,
        SAMPLE_RANK=sample_rank(topk, stride), CAP=cap,
    )  # fmt: skip
    return out
