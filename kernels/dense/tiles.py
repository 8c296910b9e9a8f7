"""Host and device plumbing shared by the dense GEMM kernels: tile options, split-K plans, the
program-to-tile order, and the output store with its split-K reduction.

Both FP8 kernels (w8a16, w8a8) go through these, so their profiles differ only in how they
multiply. Split-K (small M) writes fp32 partial sums to a (splits, M, N) buffer, and the last
split of each output tile to arrive (an atomic count per tile) sums them and writes the tile:
one launch per GEMM. A separate reduction kernel would cost a launch per projection, about as
long as a decode-size projection itself. The Gluon W8A16 kernel (`w8a16_wgmma`) has its splits
add into fp32 sums kept at zero instead (`kept_sums`: L2 atomics, one tile for the last split
to read). The same store in these Triton kernels read some sums back stale on the H200 (a few
rows, varying from call to call: raw/logs/h200-dense-triton-split-sums-diagnosis-*.txt), where
the interpreter's were right; read by an atomic exchange they were right, but a decode layer
was no faster (raw/logs/h200-dense-triton-split-sums-exchange-ab-*.csv), so these kernels keep
the partials.
"""

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.moe.routing import planned_sms
from kernels.pdl import check_option as check_pdl_option
from kernels.pdl import launches_with_pdl
from kernels.tiling import check_block_sizes
from kernels.zeroed import kept_zeros

WARPS = (1, 2, 4, 8, 16)
GROUP_M = 8  # row tiles per group in the program order (L2 reuse of weight tiles at large M)
LOCKS = 4096  # arrival counters kept per device; a split GEMM has at most 2 tiles an SM
PARTIALS_IN_FLIGHT = tl.constexpr(4)  # partial tiles the summing program loads at once
REDUCE_BYTES = 512 * 1024  # most fp32 partial sums the last split of a tile adds (default plan)
MAX_ROUNDS = 4  # programs an SM a split plan stacks at most: the decode tiles' shared memory
# fp32 sums kept per device at least (8 MB): K is split only where a GEMM has at most half as
# many tiles as SMs, so on the H200 (132) a split GEMM's sums are at most 66 tiles of 128 x 128
SUMS = 1 << 21
_locks: dict[torch.device, Tensor] = {}
_sums: dict[torch.device, Tensor] = {}


@dataclass(frozen=True)
class GemmTiles:
    """Launch options of one GEMM. split_k None lets the plan fill the GPU for small M; swap_ab
    computes y.T = W @ x.T (W8A16 only: see kernels.dense.w8a16); pdl launches with
    programmatic dependent launch (W8A16 only: kernels.pdl): None where the GPU has it, True
    or an error, False (the default) never."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int | None = None
    swap_ab: bool = False
    pdl: bool | None = False

    def override(self, **options: object) -> "GemmTiles":
        """These tiles with every option that is not None replaced, and `pdl` as given: its
        None means "where the GPU has it", not "unchanged"."""
        given = {k: v for k, v in options.items() if v is not None or k == "pdl"}
        return dataclasses.replace(self, **given)

    def check(self) -> None:
        """Reject options that would not compile."""
        check_block_sizes(self)
        if self.block_k < 32:
            raise ValueError(
                f"block_k={self.block_k} must be at least 32: FP8 MMAs reduce over 32 elements."
            )
        if self.split_k is not None and (not isinstance(self.split_k, int) or self.split_k < 1):
            raise ValueError(f"split_k={self.split_k!r} must be an integer >= 1; 1 means no split.")
        check_pdl_option(self.pdl)
        if not isinstance(self.swap_ab, bool):
            raise ValueError(f"swap_ab={self.swap_ab!r} must be True or False.")
        if self.num_warps not in WARPS:
            raise ValueError(f"num_warps={self.num_warps!r} must be one of {WARPS}.")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"num_stages={self.num_stages!r} must be an integer >= 1.")

    def launch_pdl(self, device: torch.device) -> bool:
        """Whether to launch with PDL on `device` (`kernels.pdl.launches_with_pdl`)."""
        return launches_with_pdl(self.pdl, device)

    def sub_k(self, qblock: int) -> int:
        """K width of one MMA: a K tile is cut into sub-tiles that each lie in one scale block
        (both are powers of two, so the smaller divides the larger)."""
        return min(self.block_k, qblock)


@dataclass(frozen=True)
class TilesByM:
    """A kernel's default tiles: bandwidth tiles up to 16 rows, then wider tiles as the GEMM
    turns compute-bound (middle up to `middle_up_to` rows, prefill above)."""

    decode: GemmTiles
    middle: GemmTiles
    prefill: GemmTiles
    middle_up_to: int = 64

    def __call__(self, m: int) -> GemmTiles:
        if m <= 16:
            return self.decode
        return self.middle if m <= self.middle_up_to else self.prefill


def split_plan(tiles: GemmTiles, m: int, n: int, k: int, device: torch.device) -> tuple[int, int]:
    """(splits, K elements per split): whole K tiles per split, no split left empty; an explicit
    split_k as given, else `balanced_splits`. The last split of a tile adds all the partial
    tiles alone, so the plan keeps what it reads under REDUCE_BYTES: on the H200, 128 x 128
    tiles split 80 ways (narrow projections at M of 128 to 944) made layers 5 to 8 times slower
    than cuBLAS (raw/bench-dense-*T154120)."""
    k_tiles = triton.cdiv(k, tiles.block_k)
    if tiles.split_k is None:
        programs = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
        most = max(1, REDUCE_BYTES // (4 * tiles.block_m * tiles.block_n))
        splits, per_split = balanced_splits(programs, k_tiles, planned_sms(device), most)
    else:
        per_split = triton.cdiv(k_tiles, min(tiles.split_k, k_tiles))
        splits = triton.cdiv(k_tiles, per_split)
    return splits, per_split * tiles.block_k


@functools.lru_cache(maxsize=1024)  # on every launch's host path: a few shapes a model
def balanced_splits(tiles: int, k_steps: int, sms: int, most: int) -> tuple[int, int]:
    """(splits, K steps a split) of `tiles` output tiles over K, at most `most` splits, that
    give the busiest SM the fewest K steps: programs stack in rounds of one an SM, so that SM
    runs rounds x steps. Ties go to fewer splits (fewer partial sums); a plan of one round is
    taken only where no other is (one program an SM leaves its load latency bare), and no split
    plan of more than MAX_ROUNDS rounds (the programs past what an SM holds would wait).

    Why: a decode GEMM has few output tiles, so K is split until every SM has programs, and a
    plan that leaves a third program on some SMs (o_a: 64 tiles x 5 splits = 320 programs,
    seven steps each; 21 steps on 56 SMs) runs as long as its busiest SM, where four splits (256
    programs, eight steps, 16 on the busiest) took the projection from 12.96 to 11.70 us at M=1
    on the H200 (raw/logs/h200-w8a16-decode-per-projection-*.csv)."""
    best: tuple[tuple[bool, int, int], int, int] | None = None
    for want in range(1, min(k_steps, most) + 1):
        per = triton.cdiv(k_steps, want)
        splits = triton.cdiv(k_steps, per)
        rounds = triton.cdiv(tiles * splits, sms)
        if splits > 1 and rounds > MAX_ROUNDS:
            continue
        key = (rounds < 2, rounds * per, splits)
        if best is None or key < best[0]:
            best = (key, splits, per)
    assert best is not None  # one split is always a plan
    return best[1], best[2]


def outputs(
    m: int,
    n: int,
    tiles: int,
    splits: int,
    dtype: torch.dtype,
    device: torch.device,
    groups: int = 1,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, part, locks): the output (M, groups * N), the fp32 partial-sum buffer (splits,
    groups, M, N) and the arrival counters, `tiles` per group (y stands in for both when not
    split).

    The counters are zero between calls (the last split of a tile resets its counter), so one
    zeroed buffer per device serves every split GEMM on its stream (`kernels.zeroed`).
    """
    y = torch.empty(m, groups * n, dtype=dtype, device=device)
    if splits == 1:
        return y, y, y
    part = torch.empty(splits, groups, m, n, dtype=torch.float32, device=device)
    return y, part, arrival_counters(groups * tiles, device)


def arrival_counters(tiles: int, device: torch.device) -> Tensor:
    """`tiles` split-K arrival counters, zero between calls (`outputs`)."""
    return kept_zeros(_locks, tiles, device, least_rows=LOCKS)


def kept_sums(elements: int, device: torch.device) -> Tensor:
    """`elements` fp32 zeros that a split GEMM's splits add their partial tiles into (atomics
    in L2) and the last split of each tile reads and zeroes again, so one buffer per device
    serves every such GEMM on its stream (`kernels.zeroed`)."""
    return kept_zeros(_sums, elements, device, least_rows=SUMS).view(torch.float32)


@triton.jit
def k_in_range(k_sub, offs_k, K, EVEN_K: tl.constexpr):
    """Which of the columns k_sub + offs_k lie inside K. When K is a whole number of K tiles
    (EVEN_K) all of them do, and the constant folds away, leaving each load only its row or
    column mask. Compiled for sm_90 that took about 4% of the lines out of the W8A16 K loops'
    PTX; it was not timed on its own."""
    if EVEN_K:
        return tl.full(offs_k.shape, 1, tl.int1)
    else:
        return k_sub + offs_k < K


@triton.jit
def program_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    """(row tile, column tile) of this program, row tiles grouped so neighbours share columns.

    Programs that run together then read the same weight tiles, which stay in L2 at large M.
    """
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group
    return pid_m, pid_n


@triton.jit
def sum_partials(part_ptrs, stride_ps, splits, mask, IN_FLIGHT: tl.constexpr):
    """The sum over splits of part_ptrs[split * stride_ps] (fp32, read from L2), with
    IN_FLIGHT loads issued before their sums.

    Why: a loop of one load a split adds each partial before it asks for the next, so the
    last split of a tile waits one L2 round trip a split (the loop compiled for sm_90 has no
    pipelining: one ld.global.cg batch a split, then the adds). On the H200 a layer's W8A16
    GEMMs took 3% less time at M=24 and 32 (0.0756 to 0.0732 ms, 0.0764 to 0.0741), where the
    32-row middle tiles split K; at 1-16 rows 0.2-0.8% less, within the spread; the Gluon
    kernel's sum (64-256 rows) did not change (raw/logs/h200-dense-partials-in-flight-ab-*)."""
    total = tl.zeros(mask.shape, tl.float32)
    for first in range(0, splits, IN_FLIGHT):
        for j in tl.static_range(IN_FLIGHT):
            split = first + j
            total += tl.load(part_ptrs + split * stride_ps, mask=mask & (split < splits),
                             other=0.0, cache_modifier=".cg")  # fmt: skip
    return total


@triton.jit
def store_tile(
    y_ptr, part_ptr, locks_ptr, rows, cols, acc, M, N, stride_ym, stride_ps,
    SPLIT: tl.constexpr,
):  # fmt: skip
    """y[rows, cols] = acc in y's dtype. With SPLIT, acc goes to part[split] and the tile's
    last split to arrive writes y[rows, cols] = the sum of part[:, rows, cols] instead.

    The barrier puts every thread's partial before the count (the acq_rel atomic releases
    them GPU-wide); the summing program reads the partials from L2 (.cg), then resets the
    count for the next GEMM on the stream.
    """
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    y_ptrs = y_ptr + rows[:, None] * stride_ym + cols[None, :]
    if SPLIT:
        splits = tl.num_programs(1)
        offsets = rows[:, None] * N + cols[None, :]
        tl.store(part_ptr + tl.program_id(1).to(tl.int64) * stride_ps + offsets, acc, mask=mask)
        tl.debug_barrier()
        lock = locks_ptr + tl.program_id(0)
        if tl.atomic_add(lock, 1, sem="acq_rel") == splits - 1:
            total = sum_partials(part_ptr + offsets, stride_ps, splits, mask, PARTIALS_IN_FLIGHT)
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock, 0)
    else:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
