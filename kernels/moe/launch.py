"""Host-side plumbing shared by the MoE schedulers: tile options, kernel arguments, split-K plans
and the gate/up -> (reduce) -> down -> combine pipeline around a scheduler's two launches.

Keeping this in one place means every scheduler validates options with the same messages and
allocates the same buffers, so their profiles differ only where their schedules do.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
from torch import Tensor

from kernels.compiled import launch
from kernels.moe.formats import INT4_RUN, MoeWeights, as_moe_weights
from kernels.moe.routing import MoeShape, dot_options, validate_moe_inputs
from kernels.moe.routing_kernels import combine
from kernels.moe.tiles import silu_reduce_kernel
from kernels.tiling import check_block_sizes

FMT_CODES = {"bf16": 0, "fp8": 1, "int4": 2}  # tiles.FMT_PLAIN / FMT_FP8 / FMT_INT4
WARPS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Tiles:
    """Launch options of one call. split_k None lets the flat scheduler choose per projection."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int | None
    num_warps: int
    num_stages: int
    swap_ab: bool = False

    def override(self, **options: object) -> "Tiles":
        """These tiles with every option that is not None replaced."""
        return dataclasses.replace(self, **{k: v for k, v in options.items() if v is not None})

    def check(self, weights: MoeWeights) -> None:
        """Reject options that would not compile or would compute the wrong thing."""
        check_block_sizes(self)
        if self.split_k is not None and (not isinstance(self.split_k, int) or self.split_k < 1):
            raise ValueError(f"split_k={self.split_k!r} must be an integer >= 1; 1 means no split.")
        if self.num_warps not in WARPS:
            raise ValueError(f"num_warps={self.num_warps!r} must be one of {WARPS}.")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"num_stages={self.num_stages!r} must be an integer >= 1.")
        if weights.fmt == "int4" and self.block_k < 2 * INT4_RUN:
            raise ValueError(
                f"block_k={self.block_k} is too small for int4: each K tile's low and high "
                f"nibbles meet the MMA as two products at least 16 deep; use block_k >= "
                f"{2 * INT4_RUN}."
            )
        if weights.fmt != "bf16" and weights.block % self.block_k:
            raise ValueError(
                f"block_k={self.block_k} must divide the {weights.fmt} block {weights.block}, so "
                f"one scale covers each K tile; use block_k <= {weights.block}."
            )

    def constants(self, weights: MoeWeights, dtype: torch.dtype, k_size: int) -> dict[str, object]:
        """Compile-time arguments common to every GEMM kernel of the schedulers, for a GEMM
        over K = k_size. EVEN_K: every K tile lies inside K (split-K takes whole K tiles), so
        the kernel drops its K masks (`tiles._masks` says what that buys)."""
        precision, upcast = dot_options(dtype)
        return {
            "EVEN_K": k_size % self.block_k == 0,
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "BLOCK_K": self.block_k,
            "FMT": FMT_CODES[weights.fmt],
            "QBLOCK": weights.block,
            "PRECISION": precision,
            "UPCAST": upcast,
            "SWAP": self.swap_ab,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
        }


# INT4 prefill in every scheduler that has prefill tiles: the weights are the MMA's first
# operand, unpacked and scaled in registers (tiles._mma), 128 rows a tile as the MMA's N. On
# the H200 at T=33,863 (flat, raw/logs/h200-tune-moe-int4-1d7d385-20261201T1953.csv): 35.4 ms,
# against 116 for the old 64 x 64 x 64 unswapped tiles in the run layout (the df8f8b5 log)
# and 96.7 before it. Padded's gate/up spilled 8 bytes with them under Triton 3.6 until its
# slot ids stayed 32-bit (padded._padded_gate_up_kernel); every tile that compiled without
# spills then was slower: 38.8 ms at best (64 rows a tile) against 35.4
# (raw/logs/h200-tune-moe-int4-prefill-nospill-a01574b-20261203T2353.csv).
INT4_PREFILL_TILES = Tiles(
    block_m=128, block_n=128, block_k=128, split_k=1, num_warps=8, num_stages=3, swap_ab=True
)


def prepare(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor,
    w_down: Tensor | None,
    defaults: Tiles | Callable[[MoeShape, str], Tiles],
    **options: object,
) -> tuple[MoeWeights, MoeShape, Tiles]:
    """The prologue every scheduler entry point shares: weights in one type, inputs checked,
    the scheduler's default tiles (fixed, or chosen from the shape) with the caller's options.

    Default K tiles deeper than the weights' quantisation block shrink to it, so weights
    quantised in blocks under 128 run on the defaults (a K tile must lie in one scale block);
    a block_k the caller asks for is checked as given."""
    weights = as_moe_weights(weights, w_down)
    shape = validate_moe_inputs(x, topk_ids, topk_weights, weights)
    base = defaults(shape, weights.fmt) if callable(defaults) else defaults
    if weights.fmt != "bf16" and base.block_k > weights.block:
        base = base.override(block_k=weights.block)
    tiles = base.override(**options)
    tiles.check(weights)
    return weights, shape, tiles


def weight_args(values: Tensor, scales: Tensor | None) -> tuple:
    """(w, s, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_sk) for a kernel.

    bf16 weights have no scales: the values stand in as a pointer the kernel never reads.
    """
    if scales is None:
        return (values, values, *values.stride(), 0, 0, 0)
    return (values, scales, *values.stride(), *scales.stride())


def split_plan(k_size: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(splits, K elements per split): whole K tiles per split, no split left empty.

    split_k is rounded down to what cdiv(K tiles, split_k) tiles per split leaves non-empty, so
    every split writes its partial sums and no buffer needs zeroing.
    """
    k_tiles = triton.cdiv(k_size, block_k)
    per_split = triton.cdiv(k_tiles, min(split_k, k_tiles))
    return triton.cdiv(k_tiles, per_split), per_split * block_k


def max_row_tiles(slots: int, experts: int, block_m: int) -> int:
    """Upper bound on sum over experts of cdiv(count, block_m), known without a device sync.

    Each non-empty expert wastes at most block_m - 1 padding rows, and at most min(E, T*K)
    experts are non-empty.
    """
    return (slots + min(experts, slots) * (block_m - 1)) // block_m


# gate_up(h, part, splits, k_per_split) and down(h, y, splits, k_per_split) launch the GEMMs.
GateUpLaunch = Callable[[Tensor, Tensor, int, int], None]
DownLaunch = Callable[[Tensor, Tensor, int, int], None]


# The split-K reduce's tile. On the H200 (raw/logs/h200-moe-decode-glue-probe-822a65d-
# 20261202T1211.csv) 4 x 64 tiles took a flat FP8 layer at T=1 from 0.077 to 0.064 ms against
# 16 x 128 (with combine's narrower decode programs), and at T=6 from 0.194 to 0.188: a decode
# call has a few dozen slot rows, and 16-row tiles gave them a few dozen programs.
SILU_ROWS, SILU_COLS = 4, 64


def run_pipeline(
    x: Tensor,
    shape: MoeShape,
    tiles: Tiles,
    gate_up_splits: int,
    down_splits: int,
    gate_up: GateUpLaunch,
    down: DownLaunch,
    down_block_k: int | None = None,
    down_pdl: bool = False,
) -> Tensor:
    """gate/up into h (T*K, I), split-K reduce if split, down into y (S, T*K, H), combine.

    With one split, gate/up writes h directly (the SiLU epilogue) and `part` is h itself, a
    pointer the kernel never writes through. Splits take whole K tiles of tiles.block_k, down's
    of `down_block_k` where given. `down_pdl`: down launches with PDL, so the reduce lets it
    launch as soon as the reduce's programs have all started.
    """
    slots = shape.tokens * shape.top_k
    h = torch.empty(slots, shape.inter, dtype=x.dtype, device=x.device)
    splits, k_per_split = split_plan(shape.hidden, tiles.block_k, gate_up_splits)
    part = h
    if splits > 1:
        part = torch.empty(splits, slots, 2 * shape.inter, dtype=torch.float32, device=x.device)
    gate_up(h, part, splits, k_per_split)
    if splits > 1:
        grid = (triton.cdiv(slots, SILU_ROWS), triton.cdiv(shape.inter, SILU_COLS))
        launch(
            silu_reduce_kernel,
            grid,
            part,
            h,
            slots,
            shape.inter,
            splits,
            part.stride(0),
            part.stride(1),
            h.stride(0),
            BLOCK_R=SILU_ROWS,
            BLOCK_C=SILU_COLS,
            LAUNCH_DEPENDENTS=down_pdl,
        )
    splits, k_per_split = split_plan(shape.inter, down_block_k or tiles.block_k, down_splits)
    # Split partials stay fp32; whole rows go in the activations' dtype, as in moe_w8a8 (half
    # the bytes of the rows down writes and combine reads back).
    y_dtype = torch.float32 if splits > 1 else x.dtype
    y = torch.empty(splits, slots, shape.hidden, dtype=y_dtype, device=x.device)
    down(h, y, splits, k_per_split)
    return combine(y, shape.tokens, shape.top_k, x.dtype)
