"""Host and device plumbing shared by the dense GEMM kernels: tile options, split-K plans, the
program-to-tile order, and the output store with its split-K reduction.

Both FP8 kernels (w8a16, w8a8) go through these, so their profiles differ only in how they
multiply. Split-K (small M) adds each split's fp32 partial tile into an (M, N) buffer of sums
kept at zero between GEMMs (atomics in L2), and the last split of each output tile to arrive
(an atomic count per tile) writes the tile from the sums and zeroes them: one launch per GEMM.
A separate reduction kernel would cost a launch per projection, about as long as a decode-size
projection itself.
"""

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.moe.routing import planned_sms
from kernels.pdl import enabled as pdl_available
from kernels.tiling import check_block_sizes
from kernels.zeroed import kept_zeros

WARPS = (1, 2, 4, 8, 16)
GROUP_M = 8  # row tiles per group in the program order (L2 reuse of weight tiles at large M)
LOCKS = 4096  # arrival counters kept per device; split GEMMs have fewer tiles than 2 per SM
REDUCE_BYTES = 512 * 1024  # most fp32 partial sums a tile's splits add in L2 (default plan)
SUMS = 1 << 20  # fp32 sums kept per device at least (4 MB), so that few calls grow them
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
        """These tiles with every option that is not None replaced."""
        return dataclasses.replace(self, **{k: v for k, v in options.items() if v is not None})

    def check(self) -> None:
        """Reject options that would not compile."""
        check_block_sizes(self)
        if self.block_k < 32:
            raise ValueError(
                f"block_k={self.block_k} must be at least 32: FP8 MMAs reduce over 32 elements."
            )
        if self.split_k is not None and (not isinstance(self.split_k, int) or self.split_k < 1):
            raise ValueError(f"split_k={self.split_k!r} must be an integer >= 1; 1 means no split.")
        if self.pdl is not None and not isinstance(self.pdl, bool):
            raise ValueError(f"pdl={self.pdl!r} must be True, False or None (where available).")
        if not isinstance(self.swap_ab, bool):
            raise ValueError(f"swap_ab={self.swap_ab!r} must be True or False.")
        if self.num_warps not in WARPS:
            raise ValueError(f"num_warps={self.num_warps!r} must be one of {WARPS}.")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"num_stages={self.num_stages!r} must be an integer >= 1.")

    def launch_pdl(self, device: torch.device) -> bool:
        """Whether to launch with PDL on `device`: `pdl`, or where available when None."""
        available = pdl_available(device)
        if self.pdl and not available:
            raise ValueError(
                f"pdl=True needs a Hopper or newer GPU outside the Triton interpreter; {device} "
                f"has none. Pass pdl=None to use it where available."
            )
        return available if self.pdl is None else self.pdl

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
    """(splits, K elements per split): whole K tiles per split, no split left empty.

    Without an explicit split_k, small-M GEMMs split K until there are about two programs per
    SM: a decode GEMM with N = 64 would otherwise stream its whole weight through one SM. Every
    split's partial tile is L2 traffic, so the plan keeps a tile's under REDUCE_BYTES: on the
    H200, 128 x 128 tiles split 80 ways (narrow projections at M of 128 to 944) made layers 5
    to 8 times slower than cuBLAS (raw/bench-dense-*T154120; the last split then read every
    partial tile itself).
    """
    k_tiles = triton.cdiv(k, tiles.block_k)
    want = tiles.split_k
    if want is None:
        programs = triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n)
        want = triton.cdiv(2 * planned_sms(device), programs)
        want = min(want, max(1, REDUCE_BYTES // (4 * tiles.block_m * tiles.block_n)))
    per_split = triton.cdiv(k_tiles, min(want, k_tiles))
    return triton.cdiv(k_tiles, per_split), per_split * tiles.block_k


def outputs(
    m: int,
    n: int,
    tiles: int,
    splits: int,
    dtype: torch.dtype,
    device: torch.device,
    groups: int = 1,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, sums, locks): the output (M, groups * N), the fp32 sums (groups, M, N) the splits add
    their partial tiles into (`kept_sums`) and the arrival counters, `tiles` per group (y
    stands in for both when not split).

    The counters are zero between calls (the last split of a tile resets its counter), so one
    zeroed buffer per device serves every split GEMM on its stream (`kernels.zeroed`).
    """
    y = torch.empty(m, groups * n, dtype=dtype, device=device)
    if splits == 1:
        return y, y, y
    return y, kept_sums(groups * m * n, device), arrival_counters(groups * tiles, device)


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
def store_tile(
    y_ptr, sums_ptr, locks_ptr, rows, cols, acc, M, N, stride_ym, SPLIT: tl.constexpr,
):  # fmt: skip
    """y[rows, cols] = acc in y's dtype. With SPLIT, acc is added into sums[rows, cols] (fp32,
    zero before the GEMM; atomics done in L2, no value comes back) and the tile's last split to
    arrive writes y[rows, cols] = sums[rows, cols] instead and zeroes the sums again.

    The barrier puts every thread's additions before the count (the acq_rel atomic releases
    them GPU-wide); the last split reads the sums from L2 (.cg), then resets the count for
    the next GEMM on the stream. Why atomics: the last split used to read every split's
    partial tile, `splits` round trips' worth of L2 traffic on one SM while the others idled.
    """
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    y_ptrs = y_ptr + rows[:, None] * stride_ym + cols[None, :]
    if SPLIT:
        splits = tl.num_programs(1)
        sums = sums_ptr + rows[:, None] * N + cols[None, :]
        tl.atomic_add(sums, acc, mask=mask, sem="relaxed")
        tl.debug_barrier()
        lock = locks_ptr + tl.program_id(0)
        if tl.atomic_add(lock, 1, sem="acq_rel") == splits - 1:
            total = tl.load(sums, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(sums, tl.zeros_like(acc), mask=mask)
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock, 0)
    else:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
