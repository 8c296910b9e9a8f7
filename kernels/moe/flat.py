"""Persistent MoE grouped GEMM over a flat list of (row tile, column tile, K split) work items.

The routing prep is parallel: a histogram, then `tl.cumsum` scans of slots and of BLOCK_M row
tiles per expert (kernels.moe.routing_kernels). Row tiles are numbered globally in expert order,
so item i of a projection with C column tiles and S splits is

    split = i % S,  column tile = (i // S) % C,  global row tile r = i // (S * C)

and the expert of r is found by a binary search over the per-expert tile offsets (the largest
e with tile_offsets[e] <= r; experts without rows own no tiles and are never found). A fixed
number of programs run (one an SM, a few an SM at decode: `default_programs`; fewer if there
are fewer items), each striding over the items:
`schedule="static"` gives program p the items p, p + P, p + 2P, ...; `schedule="ticket"` lets
programs take the next item from an atomic counter, which evens out unequal item costs.

Items of one row tile are adjacent, so programs running at the same time share the row
tile's activations in L2, and a few consecutive row tiles of one expert share its weights.
At decode (a handful of rows per expert) the kernel is bound by weight reads: several 4-warp
programs an SM plus split-K (partials summed by silu_reduce and combine) give every SM weight
to stream and warps enough to hide the dequantisation. The grid is sized from an upper bound
on the row tiles, so no host sync is needed.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch, recording
from kernels.dense.w8a8_wgmma import supported
from kernels.moe import bf16_wgmma, int4_mma
from kernels.moe.formats import MoeWeights
from kernels.moe.launch import (
    INT4_PREFILL_TILES,
    Tiles,
    max_row_tiles,
    prepare,
    run_pipeline,
    weight_args,
)
from kernels.moe.routing import MoeShape, sm_count
from kernels.moe.routing_kernels import (
    SMALL_SLOTS,
    expert_counts,
    expert_offsets_parallel,
    permute,
    small_layout,
)
from kernels.moe.tiles import (
    down_tile,
    gate_up_tile,
    locate_rows,
    store_down,
    store_gate_up,
)
from kernels.moe.widen import WIDEN_MIN_ROWS

SCHEDULES = ("static", "ticket")
CPU_PROGRAMS = 4
# Automatic split-K aims for at least this many items per program at decode. 2, not 4: on the
# H200 a flat FP8 layer at T=6 took 0.181-0.182 ms against 0.194-0.195 (its gate/up splits K
# 2 ways instead of 3, so each item streams longer and the reduce reads fewer partials; 1-8
# items, 2-4 programs an SM, 3-4 stages and 64-128 wide tiles in
# raw/logs/h200-moe-decode-tiles-probe-822a65d-20261202T1211.csv); then at T=1, 6, 16 and 48
# (raw/logs/h200-moe-items-per-program-probe-a4128c5-20261202T1305.csv) 2 was faster or
# within 1% for every format: INT4 0.072 against 0.081 ms at T=1 and 0.231 against 0.244 at
# T=6, FP8 0.061 against 0.065 at T=1, bf16 0.083 against 0.087 at T=1.
ITEMS_PER_PROGRAM = 2
# Chosen on the H200 at the TP2-rank shape (scripts/tune_moe.py). Decode, T=6: 64-wide,
# 128-deep K tiles over 4 warps, several programs an SM (DECODE_PROGRAMS_PER_SM): fp8 0.205 ms
# at three an SM against 0.225-0.235 for the former one 8-warp, 256-wide program an SM (12.5%
# occupancy in ncu/moe-flat-T6-fmtfp8 as captured at a4f57d3; recaptured at f5d0201, gate/up
# reaches 72% of DRAM bandwidth against 58%), bf16 0.305 at two against 0.321
# (raw/logs/h200-tune-moe-decode-programs-9c400a4-20261201T2332.csv); fp8 then 0.199 at 3
# stages against 0.213 at 4 (raw/logs/h200-tune-moe-decode-fine-c4b515e-20261201T2339.csv). The
# bench run after (raw/bench-moe-dsv4-flash-tp2-20261201T234511) measured fp8 0.213 ms (0.238 in
# the bench before, T181320) and bf16 0.334: the gain over the former tiles held, the one of 3
# stages over 4 is within the spread between runs.
# INT4: 128-wide tiles, two programs an SM, 0.260 ms at T=6 against 0.307 for one 8-warp
# program an SM, whose occupancy left the unpacking's latency unhidden
# (raw/logs/h200-tune-moe-int4-decode-flat-71d54fb-20261201T2150.csv). Re-tuned once the
# packed bytes were zero-filled (tiles._mma; 0.176 ms at T=6): of 46 settings the best,
# 32-wide tiles of 2 warps six programs an SM, took 0.1730 ms against 0.1766-0.1781 for these
# defaults in the same run, a single run's 2%; kept
# (raw/logs/h200-tune-moe-int4-decode-zero-fill-40d1de8-*.csv). Prefill, T=33863: bf16
# 20.0 ms (was 24.3 with 64-row tiles; raw/logs/h200-x2-tune-flat.csv); on sm_90 bf16 prefill
# runs the Gluon kernels instead (bf16_wgmma: 14.1 to 14.6 ms in the bench), and from
# widen.WIDEN_MIN_ROWS rows an expert so do FP8 and INT4 experts, widened. fp8 keeps 64-row
# tiles: 128-row ones were faster (40-45 ms against 46) but spilled 50+ registers.
DECODE_TILES = {
    "bf16": Tiles(block_m=16, block_n=64, block_k=128, split_k=None, num_warps=4, num_stages=4),
    "fp8": Tiles(block_m=16, block_n=64, block_k=128, split_k=None, num_warps=4, num_stages=3),
    "int4": Tiles(block_m=16, block_n=128, block_k=128, split_k=None, num_warps=4, num_stages=3),
}
DECODE_PROGRAMS_PER_SM = {"bf16": 2, "fp8": 3, "int4": 2}
# Down's own decode launch: its K (I = 1,152 at the TP2 rank) is a quarter of gate/up's, so an
# item streams a quarter as long and each program fills and drains its pipeline four times as
# often (ncu/moe-flat-T6-fmtfp8: down 59% of DRAM bandwidth, gate/up 75%). Its block_m and
# block_k are gate/up's (the row tiles and K tiles are shared); its width, stages and warps
# (options over gate/up's tiles) and its programs an SM may differ. On the H200 at T=6
# (raw/logs/h200-moe-down-decode-probe-d21fbe7-20261202T1745.csv, the defaults timed first
# and last): FP8 took 0.1763 ms with four programs an SM for down against 0.1807-0.1811 with
# three; bf16 0.2897 with 128-wide down tiles against 0.2931-0.2932; INT4 0.2290 with four
# programs against 0.2304-0.2305. Gains of 1-2.5%, each the best of its format's ten settings
# or within 0.3 us of it; two programs (FP8) or 8-warp tiles (INT4) lost 7-13%.
DECODE_DOWN_OPTIONS: dict[str, dict[str, int]] = {"bf16": {"block_n": 128}, "fp8": {}, "int4": {}}
DECODE_DOWN_PROGRAMS_PER_SM = {"bf16": 2, "fp8": 4, "int4": 4}
PREFILL_TILES = {
    "bf16": Tiles(block_m=128, block_n=128, block_k=64, split_k=1, num_warps=8, num_stages=4),
    "fp8": Tiles(block_m=64, block_n=128, block_k=128, split_k=1, num_warps=8, num_stages=3),
    "int4": INT4_PREFILL_TILES,
}
PREFILL_ROWS = 32  # mean rows per active expert from which 64-row tiles pay off


@triton.jit
def _locate(
    item, splits, col_tiles, tile_offsets_ptr, offsets_ptr, counts_ptr, sorted_slots_ptr,
    num_experts, BLOCK_M: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """(expert, slots int64, row_ok, column tile, split) of a work item."""
    expert, positions, row_ok, col_tile, split = locate_rows(
        item, splits, col_tiles, tile_offsets_ptr, offsets_ptr, counts_ptr, num_experts,
        BLOCK_M, STEPS,
    )  # fmt: skip
    slots = tl.load(sorted_slots_ptr + positions, mask=row_ok, other=0)
    return expert, slots.to(tl.int64), row_ok, col_tile, split


@triton.jit
def _gate_up_item(
    item, x_ptr, h_ptr, part_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
    w_ptr, s_ptr, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk,
    num_experts, hidden, inter, k_per_split, splits, col_tiles, stride_xt, stride_xh,
    stride_hr, stride_ps, stride_pr,
    TOP_K: tl.constexpr, SPLIT: tl.constexpr, STEPS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FMT: tl.constexpr, QBLOCK: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, SWAP: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    expert, slots, row_ok, col_tile, split = _locate(
        item, splits, col_tiles, tile_offsets_ptr, offsets_ptr, counts_ptr, sorted_slots_ptr,
        num_experts, BLOCK_M, STEPS,
    )  # fmt: skip
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, hidden)
    w_e = w_ptr + tl.cast(expert, tl.int64) * stride_we
    s_e = s_ptr + tl.cast(expert, tl.int64) * stride_se
    gate, up = gate_up_tile(
        x_ptr, slots // TOP_K, row_ok, w_e, s_e, cols, col_ok, inter, hidden, k_lo, k_hi,
        stride_xt, stride_xh, stride_wn, stride_wk, stride_sn, stride_sk, BLOCK_M, BLOCK_N,
        BLOCK_K, FMT, QBLOCK, PRECISION, UPCAST, SWAP, EVEN_K,
    )  # fmt: skip
    store_gate_up(
        h_ptr, part_ptr, split, slots, row_ok, cols, col_ok, gate, up, inter, stride_hr,
        stride_ps, stride_pr, SPLIT, SWAP,
    )  # fmt: skip


@triton.jit
def _flat_gate_up_kernel(
    x_ptr, h_ptr, part_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
    ticket_ptr, w_ptr, s_ptr, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
    stride_sk, num_experts, hidden, inter, k_per_split, splits, stride_xt, stride_xh,
    stride_hr, stride_ps, stride_pr,
    TOP_K: tl.constexpr, SPLIT: tl.constexpr, STEPS: tl.constexpr, TICKET: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FMT: tl.constexpr,
    QBLOCK: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, SWAP: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    col_tiles = tl.cdiv(inter, BLOCK_N)
    num_items = tl.load(tile_offsets_ptr + num_experts) * col_tiles * splits
    if TICKET:
        item = tl.atomic_add(ticket_ptr, 1)
        while item < num_items:
            _gate_up_item(
                item, x_ptr, h_ptr, part_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr,
                tile_offsets_ptr, w_ptr, s_ptr, stride_we, stride_wn, stride_wk, stride_se,
                stride_sn, stride_sk, num_experts, hidden, inter, k_per_split, splits,
                col_tiles, stride_xt, stride_xh, stride_hr, stride_ps, stride_pr, TOP_K, SPLIT,
                STEPS, BLOCK_M, BLOCK_N, BLOCK_K, FMT, QBLOCK, PRECISION, UPCAST, SWAP, EVEN_K,
            )  # fmt: skip
            item = tl.atomic_add(ticket_ptr, 1)
    else:
        for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
            _gate_up_item(
                item, x_ptr, h_ptr, part_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr,
                tile_offsets_ptr, w_ptr, s_ptr, stride_we, stride_wn, stride_wk, stride_se,
                stride_sn, stride_sk, num_experts, hidden, inter, k_per_split, splits,
                col_tiles, stride_xt, stride_xh, stride_hr, stride_ps, stride_pr, TOP_K, SPLIT,
                STEPS, BLOCK_M, BLOCK_N, BLOCK_K, FMT, QBLOCK, PRECISION, UPCAST, SWAP, EVEN_K,
            )  # fmt: skip


@triton.jit
def _down_item(
    item, h_ptr, y_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
    slot_weights_ptr, w_ptr, s_ptr, stride_we, stride_wn, stride_wk, stride_se, stride_sn,
    stride_sk, num_experts, hidden, inter, k_per_split, splits, col_tiles, stride_hr,
    stride_ys, stride_yr,
    STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FMT: tl.constexpr, QBLOCK: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    SWAP: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    expert, slots, row_ok, col_tile, split = _locate(
        item, splits, col_tiles, tile_offsets_ptr, offsets_ptr, counts_ptr, sorted_slots_ptr,
        num_experts, BLOCK_M, STEPS,
    )  # fmt: skip
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    k_lo = split * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, inter)
    w_e = w_ptr + tl.cast(expert, tl.int64) * stride_we
    s_e = s_ptr + tl.cast(expert, tl.int64) * stride_se
    acc = down_tile(
        h_ptr, slots, row_ok, w_e, s_e, cols, col_ok, inter, k_lo, k_hi, stride_hr, stride_wn,
        stride_wk, stride_sn, stride_sk, BLOCK_M, BLOCK_N, BLOCK_K, FMT, QBLOCK, PRECISION,
        UPCAST, SWAP, EVEN_K,
    )  # fmt: skip
    store_down(
        y_ptr, slot_weights_ptr, split, slots, row_ok, cols, col_ok, acc, stride_ys, stride_yr,
        SWAP,
    )  # fmt: skip


@triton.jit
def _flat_down_kernel(
    h_ptr, y_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
    slot_weights_ptr, ticket_ptr, w_ptr, s_ptr, stride_we, stride_wn, stride_wk, stride_se,
    stride_sn, stride_sk, num_experts, hidden, inter, k_per_split, splits, stride_hr,
    stride_ys, stride_yr,
    STEPS: tl.constexpr, TICKET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, FMT: tl.constexpr, QBLOCK: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, SWAP: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    col_tiles = tl.cdiv(hidden, BLOCK_N)
    num_items = tl.load(tile_offsets_ptr + num_experts) * col_tiles * splits
    if TICKET:
        item = tl.atomic_add(ticket_ptr, 1)
        while item < num_items:
            _down_item(
                item, h_ptr, y_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr,
                tile_offsets_ptr, slot_weights_ptr, w_ptr, s_ptr, stride_we, stride_wn,
                stride_wk, stride_se, stride_sn, stride_sk, num_experts, hidden, inter,
                k_per_split, splits, col_tiles, stride_hr, stride_ys, stride_yr, STEPS,
                BLOCK_M, BLOCK_N, BLOCK_K, FMT, QBLOCK, PRECISION, UPCAST, SWAP, EVEN_K,
            )  # fmt: skip
            item = tl.atomic_add(ticket_ptr, 1)
    else:
        for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
            _down_item(
                item, h_ptr, y_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr,
                tile_offsets_ptr, slot_weights_ptr, w_ptr, s_ptr, stride_we, stride_wn,
                stride_wk, stride_se, stride_sn, stride_sk, num_experts, hidden, inter,
                k_per_split, splits, col_tiles, stride_hr, stride_ys, stride_yr, STEPS,
                BLOCK_M, BLOCK_N, BLOCK_K, FMT, QBLOCK, PRECISION, UPCAST, SWAP, EVEN_K,
            )  # fmt: skip


class FlatLayout(NamedTuple):
    """The routing layout the flat work list runs on (the module docstring), built on the
    device without a host sync: slots per expert, their first sorted position, each expert's
    first global row tile, the sorted slots, fp32 routing weights a slot, and a bound on the
    row tiles to size grids by."""

    counts: Tensor
    offsets: Tensor
    tile_offsets: Tensor
    sorted_slots: Tensor
    slot_weights: Tensor
    row_tiles: int

    @classmethod
    def of(cls, topk_ids: Tensor, topk_weights: Tensor, shape: MoeShape,
           block_m: int) -> "FlatLayout":  # fmt: skip
        """Up to SMALL_SLOTS slots (decode) in one launch (`small_layout`), else by the
        histogram, two scans and the permutation."""
        slots = shape.tokens * shape.top_k
        if slots <= SMALL_SLOTS:
            counts, offsets, tile_offsets, sorted_slots = small_layout(
                topk_ids, shape.experts, block_m
            )
        else:
            counts = expert_counts(topk_ids, shape.experts)
            offsets = expert_offsets_parallel(counts)
            tile_offsets = expert_offsets_parallel(counts, block_m)
            sorted_slots = permute(topk_ids, offsets)
        return cls(
            counts, offsets, tile_offsets, sorted_slots, _slot_weights(topk_weights),
            max_row_tiles(slots, shape.experts, block_m),
        )  # fmt: skip

    @classmethod
    def with_row_table(cls, topk_ids: Tensor, topk_weights: Tensor, shape: MoeShape,
                       block_m: int) -> tuple["FlatLayout", tuple[Tensor, Tensor]]:  # fmt: skip
        """The layout of up to SMALL_SLOTS slots and, from the same launch, the Gluon kernels'
        table of block_m-row tiles (row_weights, tile_info), as `w8a8_wgmma.row_table` gives
        it one launch later."""
        slots = shape.tokens * shape.top_k
        slot_weights = _slot_weights(topk_weights)
        row_tiles = max_row_tiles(slots, shape.experts, block_m)
        row_weights = torch.empty(slots, dtype=torch.float32, device=topk_ids.device)
        tile_info = torch.empty(row_tiles, 4, dtype=torch.int32, device=topk_ids.device)
        counts, offsets, tile_offsets, sorted_slots = small_layout(
            topk_ids, shape.experts, block_m, (slot_weights, row_weights, tile_info)
        )
        layout = cls(counts, offsets, tile_offsets, sorted_slots, slot_weights, row_tiles)
        return layout, (row_weights, tile_info)


def _slot_weights(topk_weights: Tensor) -> Tensor:
    """The routing weights as one fp32 value a slot, the form every kernel's epilogue reads."""
    return topk_weights.reshape(-1).to(torch.float32).contiguous()


def prefill_sized(slots: int, experts: int) -> bool:
    """Whether the active experts get PREFILL_ROWS rows or more on average (compute-bound)."""
    return slots >= PREFILL_ROWS * min(experts, slots)


def default_tiles(shape: MoeShape, fmt: str) -> Tiles:
    """Decode-like calls get 16-row tiles with automatic split-K (weight streaming);
    prefill-like calls get 64- or 128-row tiles on 8 warps (compute-bound); per format."""
    prefill = prefill_sized(shape.tokens * shape.top_k, shape.experts)
    return (PREFILL_TILES if prefill else DECODE_TILES)[fmt]


def default_programs(shape: MoeShape, fmt: str, sms: int) -> int:
    """Persistent programs: one an SM, DECODE_PROGRAMS_PER_SM for decode-like calls."""
    prefill = prefill_sized(shape.tokens * shape.top_k, shape.experts)
    return sms * (1 if prefill else DECODE_PROGRAMS_PER_SM[fmt])


def auto_split_k(row_tiles: int, col_tiles: int, programs: int) -> int:
    """Splits that give every program ITEMS_PER_PROGRAM items; split_plan caps it at K tiles."""
    return triton.cdiv(ITEMS_PER_PROGRAM * programs, row_tiles * col_tiles)


def moe_flat(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor,
    w_down: Tensor | None = None,
    *,
    schedule: str = "static",
    num_programs: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
    wgmma: bool | None = None,
    int4_gluon: bool | None = None,
) -> Tensor:
    """Routed-expert output (T, H) in x.dtype, same contract as moe_reference.

    num_programs defaults to the SM count (4 on the CPU), times DECODE_PROGRAMS_PER_SM at
    decode sizes (`default_programs`); there, with no tile option or num_programs given, down
    runs on its own launch (DECODE_DOWN_OPTIONS, DECODE_DOWN_PROGRAMS_PER_SM). None tile
    options come from
    default_tiles(shape, fmt); split_k None picks a split per projection (auto_split_k), an int
    applies to both. `wgmma` runs the experts on the Gluon bf16 kernels (`bf16_wgmma`; FP8 and
    INT4 experts widened to bf16 a projection at a time, `widen`): None where they run and pay
    (sm_90, bf16 x, prefill sizes, from `widen.WIDEN_MIN_ROWS` rows an expert for FP8 and INT4,
    H a multiple of 256 and I of 128, no tile options or ticket schedule, which are the Triton
    kernels'), True or an error, False never. `int4_gluon` runs INT4 experts at decode sizes
    on the Gluon kernels of `int4_mma` (mma.sync, weights by TMA): None where they run (sm_90,
    bf16 x, INT4 groups of 128, H and I multiples of 128, no tile options or ticket schedule),
    True or an error, False never.
    Kernel facts of the call: kernels.moe.last_facts().
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} must be one of {SCHEDULES}.")
    if num_programs is not None and (not isinstance(num_programs, int) or num_programs < 1):
        raise ValueError(f"num_programs={num_programs!r} must be an integer >= 1 (or None).")
    triton_options = {"block_m": block_m, "block_n": block_n, "block_k": block_k,
                      "split_k": split_k, "num_warps": num_warps, "num_stages": num_stages,
                      "swap_ab": swap_ab}  # fmt: skip
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
        sms = sm_count(x.device) or CPU_PROGRAMS
        if _gluon_bf16(wgmma, x, weights, shape, schedule, triton_options):
            layout = FlatLayout.of(topk_ids, topk_weights, shape, bf16_wgmma.ROWS)
            return bf16_wgmma.moe_bf16_wgmma(x, weights, layout, shape, num_programs or sms)
        if _gluon_int4(int4_gluon, x, weights, shape, schedule, num_programs, triton_options):
            return _run_int4_gluon(x, topk_ids, topk_weights, weights, shape, sms)
        programs = num_programs or default_programs(shape, weights.fmt, sms)
        down_tiles, down_programs = tiles, programs
        defaults = num_programs is None and all(v is None for v in triton_options.values())
        if defaults and not prefill_sized(shape.tokens * shape.top_k, shape.experts):
            down_tiles = tiles.override(**DECODE_DOWN_OPTIONS[weights.fmt])
            down_programs = sms * DECODE_DOWN_PROGRAMS_PER_SM[weights.fmt]
        return _run_flat(x, topk_ids, topk_weights, weights, shape, tiles, schedule, programs,
                         down_tiles, down_programs)  # fmt: skip


def _gluon_int4(int4_gluon: bool | None, x: Tensor, weights: MoeWeights, shape: MoeShape,
                schedule: str, num_programs: int | None,
                triton_options: dict[str, object]) -> bool:  # fmt: skip
    """Whether moe_flat runs on the Gluon INT4 decode kernels (its `int4_gluon`)."""
    if int4_gluon is not None and not isinstance(int4_gluon, bool):
        raise ValueError(f"int4_gluon={int4_gluon!r} must be True, False or None (where it runs).")
    if int4_gluon is False:
        return False
    decode = not prefill_sized(shape.tokens * shape.top_k, shape.experts)
    missing = [
        need
        for need, met in (
            ("INT4 experts at decode sizes", weights.fmt == "int4" and decode),
            ("an sm_90 GPU, bf16 activations with 16-byte aligned rows, INT4 groups of "
             f"{int4_mma.BLOCK_K} and H and I multiples of {int4_mma.BLOCK_K}",
             int4_mma.runs_on(x, weights, shape)),
            ("no Triton tile options, num_programs or ticket schedule",
             schedule == "static" and num_programs is None
             and all(v is None for v in triton_options.values())),
        )
        if not met
    ]  # fmt: skip
    if int4_gluon and missing:
        raise ValueError(f"int4_gluon=True needs {'; '.join(missing)}; pass int4_gluon=None to "
                         "use the Gluon INT4 kernels where they run.")  # fmt: skip
    return not missing


def _run_int4_gluon(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, weights: MoeWeights,
                    shape: MoeShape, sms: int) -> Tensor:  # fmt: skip
    """Flat's pipeline on the Gluon INT4 kernels, split-K as flat's own decode (auto_split_k);
    up to SMALL_SLOTS slots, the kernels' row table comes with the layout's launch."""
    table = None
    if shape.tokens * shape.top_k <= SMALL_SLOTS:
        layout, table = FlatLayout.with_row_table(topk_ids, topk_weights, shape, int4_mma.ROWS)
    else:
        layout = FlatLayout.of(topk_ids, topk_weights, shape, int4_mma.ROWS)
    rings = int4_mma.GATE_UP_RING, int4_mma.DOWN_RING
    splits = [
        auto_split_k(layout.row_tiles, triton.cdiv(n, int4_mma.BLOCK_N), ring.programs(sms))
        for n, ring in zip((shape.inter, shape.hidden), rings, strict=True)
    ]
    return int4_mma.moe_int4_mma(x, weights, layout, shape, sms, *splits, table, rings)


def _gluon_bf16(wgmma: bool | None, x: Tensor, weights: MoeWeights, shape: MoeShape,
                schedule: str, triton_options: dict[str, object]) -> bool:  # fmt: skip
    """Whether moe_flat runs on the Gluon bf16 kernels (its `wgmma`)."""
    if wgmma is not None and not isinstance(wgmma, bool):
        raise ValueError(f"wgmma={wgmma!r} must be True, False or None (where it runs).")
    missing = [
        need
        for need, met in (
            ("an sm_90 (Hopper) GPU", supported(x.device)),
            (
                "bf16 activations and bf16, FP8 or INT4 experts",
                x.dtype == torch.bfloat16
                and (weights.fmt != "bf16" or weights.gate_up.dtype == torch.bfloat16),
            ),
            (
                f"H a multiple of {2 * bf16_wgmma.BOX} and I of {bf16_wgmma.BOX}",
                bf16_wgmma.runs_on(shape.hidden, shape.inter),
            ),
            (
                "contiguous expert weights",
                weights.gate_up.is_contiguous() and weights.down.is_contiguous(),
            ),
            (
                "x's rows contiguous and 16-byte aligned (the load warps copy 16 bytes a copy)",
                x.stride(-1) == 1 and x.stride(0) % 8 == 0 and x.data_ptr() % 16 == 0,
            ),
            (
                "no Triton tile options or ticket schedule",
                schedule == "static" and all(v is None for v in triton_options.values()),
            ),
        )
        if not met
    ]
    if wgmma and missing:
        raise ValueError(f"wgmma=True needs {', '.join(missing)}; pass wgmma=None to use the "
                         "Gluon kernels where they run.")  # fmt: skip
    if wgmma is None:
        slots = shape.tokens * shape.top_k
        if weights.fmt == "bf16":
            return not missing and prefill_sized(slots, shape.experts)
        return not missing and slots >= WIDEN_MIN_ROWS * min(shape.experts, slots)
    return wgmma


def _run_flat(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights,
    shape: MoeShape,
    tiles: Tiles,
    schedule: str,
    programs: int,
    down_tiles: Tiles,
    down_programs: int,
) -> Tensor:
    """The flat pipeline with gate/up on `tiles` and `programs` programs, down on its own
    (same block_m and block_k: the row tiles and the K tiles are shared)."""
    if (down_tiles.block_m, down_tiles.block_k) != (tiles.block_m, tiles.block_k):
        raise ValueError(f"down's tiles must share gate/up's block_m and block_k, got "
                         f"{down_tiles} against {tiles}.")  # fmt: skip
    layout = FlatLayout.of(topk_ids, topk_weights, shape, tiles.block_m)
    counts, offsets, tile_offsets, sorted_slots, slot_weights, row_tiles = layout
    # gate/up's and down's next item under the ticket schedule; static programs never read it
    # (then counts stands in, saving a fill kernel on every call)
    tickets = torch.zeros(2, dtype=torch.int32, device=x.device) if schedule == "ticket" else counts
    gate_up_cols = triton.cdiv(shape.inter, tiles.block_n)
    down_cols = triton.cdiv(shape.hidden, down_tiles.block_n)
    gate_up_split, down_split = tiles.split_k, down_tiles.split_k
    if tiles.split_k is None:
        gate_up_split = auto_split_k(row_tiles, gate_up_cols, programs)
    if down_tiles.split_k is None:
        down_split = auto_split_k(row_tiles, down_cols, down_programs)
    scheduling = {"STEPS": max(shape.experts - 1, 0).bit_length(), "TICKET": schedule == "ticket"}
    common = scheduling | tiles.constants(weights, x.dtype, shape.hidden)
    down_common = scheduling | down_tiles.constants(weights, x.dtype, shape.inter)

    def gate_up(h: Tensor, part: Tensor, splits: int, k_per_split: int) -> None:
        grid = (min(programs, row_tiles * gate_up_cols * splits),)
        launch(
            _flat_gate_up_kernel,
            grid,
            x,
            h,
            part,
            sorted_slots,
            counts,
            offsets,
            tile_offsets,
            tickets[0:],
            *weight_args(weights.gate_up, weights.gate_up_scale),
            shape.experts,
            shape.hidden,
            shape.inter,
            k_per_split,
            splits,
            *x.stride(),
            h.stride(0),
            part.stride(0),
            part.stride(1),
            TOP_K=shape.top_k,
            SPLIT=splits > 1,
            **common,
        )

    def down(h: Tensor, y: Tensor, splits: int, k_per_split: int) -> None:
        grid = (min(down_programs, row_tiles * down_cols * splits),)
        launch(
            _flat_down_kernel,
            grid,
            h,
            y,
            sorted_slots,
            counts,
            offsets,
            tile_offsets,
            slot_weights,
            tickets[1:],
            *weight_args(weights.down, weights.down_scale),
            shape.experts,
            shape.hidden,
            shape.inter,
            k_per_split,
            splits,
            h.stride(0),
            y.stride(0),
            y.stride(1),
            **down_common,
        )

    return run_pipeline(x, shape, tiles, gate_up_split, down_split, gate_up, down)
