"""humming_moe: humming-kernels' routed-experts path (FP8 E4M3 experts, bf16 activations) run as
a peer of the workbench's MoE layer, the way a server would drive it around a router.

The API path. Each projection is one `humming.layer.HummingLayer` over all E experts
(`num_experts=E`) with the checkpoint schema `{"quant_method": "fp8", "weight_block_size":
[128, 128]}`, loaded with the workbench's E4M3 values as `weight` (E, N, K) and its fp32 block
scales as `weight_scale_inv` (E, N/128, K/128), then `transform()`ed, as the dense `humming`
peer loads one matrix. Both are called as humming's *indexed* MoE GEMM (`compute_config`
`{"gemm_type": "indexed"}`) with the block-aligned routing of vLLM's moe_align_block_size:
`sorted_ids` (slot indices t*K + k grouped by expert, each expert padded to whole M tiles with
the out-of-range id T*K), `expert_ids` (one expert per M tile) and `num_tokens_padded`.

1. gate/up: x (T, H) with `top_k=K`; the kernel reads row id // K and writes row id of a
   (T*K, 2I) bf16 output.
2. SiLU-and-multiply: `humming.forward.may_process_input` for the down layer with
   `activation_type="binary_split"`. humming has no named SiLU: its input kernel takes the
   activation as a CUDA expression of `a` (columns [0, I)) and `b` (columns [I, 2I)), so
   `silu(a) * b` reads the workbench's [gate, up] row order as it is, with no reordering.
3. down: h (T*K, I) with `top_k=1`, the same slot ids, into (T*K, H) bf16.

humming does not apply routing weights (its GEMMs take no per-row weights for an epilogue) and
has no combine, so those are torch here.

Inside the timed call, besides humming's three kernels, plain torch on the device, with no
host sync (so the call can be captured in a CUDA graph): one stable sort of the T*K expert ids
and a searchsorted for each expert's first slot; for each M tile size the two GEMMs use, the
padded `sorted_ids`, `expert_ids` and `num_tokens_padded` (humming ships only a Python loop
for these, in `humming.testing`); and the combine, y = sum_k route[t, k] * out[t*K + k], as one
batched (1 x K) @ (K x H) bf16 matmul.

What differs from a plain `layer(x)`. The padding must use the M tile of the kernel that runs,
and humming picks the kernel by M = T*K from its heuristics' interval table, so `prepare` asks
`humming.tune.get_heuristics_config(..., gemm_type="indexed")` for that table once and passes
the same table back as `tuning_config` on every call: the kernels humming would pick itself,
pinned so that kernel and padding agree. `may_process_input` gets `use_pdl=False` (humming's
heuristics choose PDL only on SM120/121), so no kernel family first compiles in a timed call.
Numbers: humming turns the block scales into bf16 group scales (the workbench's MoE scales are
absmax/448, not powers of two: up to 2^-9 relative per block), stores gate/up in bf16 before
the SiLU (the reference keeps fp32), and the combine takes the routing weights in bf16; together
about 1e-3 relative, inside the 2e-2 MoE bound. H and I must be multiples of 128 (whole scale
blocks). humming JIT-compiles through NVRTC: `prepare` runs one call, which compiles the kernels
of every M interval of both GEMMs and the activation kernel.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import partial

import torch
from torch import Tensor

from kernels.moe.formats import MoeWeights
from workbench.peers.humming_kernels import INSTALL, VERSION, available

__all__ = ["INSTALL", "VARIANT", "VERSION", "available", "prepare"]

VARIANT = "w8a16-block128 indexed + torch glue"  # the MoE rows' `variant`
BLOCK = 128
CHECKPOINT_SCHEMA = {"quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK]}
INDEXED = json.dumps({"gemm_type": "indexed"})  # a string: humming re-serialises dicts per call
# silu(gate) * up as humming's input kernel evaluates it, in fp32 (built without fast math).
SILU_AND_MUL = "a / (1.0f + expf(-a)) * b"

MoeCall = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class SortedSlots:
    """The T*K (token, slot) pairs sorted by expert, shared by both GEMMs' paddings.

    experts: expert of each sorted slot (int64, T*K); order: slot index t*K + k of each
    (int64, T*K), stable so an expert's slots stay in token order; starts: first sorted
    position of each expert, E + 1 entries ending at T*K.
    """

    experts: Tensor
    order: Tensor
    starts: Tensor


@dataclass(frozen=True)
class Tuning:
    """humming's heuristic interval table for one layer: as the JSON it is passed back as, and
    the upper bound of each M interval (min < M <= max) with its kernel's M tile."""

    table: str
    bounds: tuple[int, ...]
    tiles: tuple[int, ...]

    def tile(self, m: int) -> int:
        """The M tile of the kernel humming launches for M routed rows."""
        return self.tiles[bisect_left(self.bounds, m)]


@dataclass(frozen=True)
class Gemm:
    """One transformed expert layer and the interval table its calls pin."""

    layer: torch.nn.Module
    tuning: Tuning


@dataclass(frozen=True)
class Plan:
    """Everything a call needs: the two layers, E + 1 expert edges for the sort, and H."""

    gate_up: Gemm
    down: Gemm
    edges: Tensor
    hidden: int


def _check_weights(weights: MoeWeights) -> None:
    """Refuse what humming's FP8 checkpoint schema cannot take, before anything is converted."""
    if weights.fmt != "fp8" or weights.block != BLOCK:
        raise ValueError(
            f"humming takes FP8 expert weights in {BLOCK}x{BLOCK} blocks, got {weights.fmt} "
            f"with block {weights.block}; build them with "
            f"MoeWeights.quantize(w_gate_up, w_down, 'fp8', {BLOCK})."
        )
    hidden, inter = weights.hidden, weights.inter
    if hidden % BLOCK or inter % BLOCK:
        raise ValueError(
            f"humming sizes its block scales as whole {BLOCK}-blocks, so H and I must be "
            f"multiples of {BLOCK}; got H={hidden}, I={inter}."
        )


def _json_value(value: object) -> object:
    """What JSON lacks in a heuristic config: an Enum member as its value (as humming's own
    configs carry it), a numpy or torch scalar as its Python number."""
    if isinstance(value, Enum):
        return value.value
    if callable(getattr(value, "item", None)):
        return value.item()
    raise TypeError(f"cannot pass {type(value).__name__} back to humming as JSON")


def tuning_from_table(table: list) -> Tuning:
    """A Tuning from humming's [[min_m, max_m, config], ...] list, contiguous in M."""
    bounds = tuple(int(entry[1]) for entry in table)
    tiles = tuple(int(entry[2]["block_shape"][0]) for entry in table)
    return Tuning(json.dumps(table, default=_json_value), bounds, tiles)


def _expert_layer(values: Tensor, scales: Tensor) -> Gemm:
    """A transformed HummingLayer over all experts of one projection, with its pinned table."""
    from humming.layer import HummingLayer
    from humming.tune import get_heuristics_config

    experts, n, k = values.shape
    with torch.device(values.device):  # the empty parameters go straight to the GPU
        layer = HummingLayer(
            shape_n=n,
            shape_k=k,
            weight_config=dict(CHECKPOINT_SCHEMA),
            num_experts=experts,
            torch_dtype=torch.bfloat16,
        )
    layer.load_from_tensors({"weight": values, "weight_scale_inv": scales})
    layer.transform()
    table = get_heuristics_config(layer.humming_config, gemm_type="indexed", device=values.device)
    return Gemm(layer, tuning_from_table(table))


def sort_slots(ids: Tensor, edges: Tensor) -> SortedSlots:
    """Sort the slots of ids (T, K) by expert; edges is arange(E + 1) on ids' device."""
    experts, order = torch.sort(ids.reshape(-1).long(), stable=True)
    return SortedSlots(experts, order, torch.searchsorted(experts, edges))


def align_blocks(slots: SortedSlots, tile: int) -> tuple[Tensor, Tensor, Tensor]:
    """(sorted_ids, expert_ids, num_tokens_padded), int32, for M tiles of `tile` rows.

    Each expert's slots, in token order, fill whole tiles, the rest of its last tile holding
    the id T*K that the kernel neither reads nor writes. The tensors are sized for the most
    padding possible (each non-empty expert short of a tile by tile - 1), so nothing waits on
    the device; the kernel stops at num_tokens_padded, and tail tiles name the last expert.
    """
    num_slots, num_experts = slots.order.numel(), slots.starts.numel() - 1
    counts = slots.starts.diff()
    tiles = (counts + tile - 1) // tile
    tile_end = tiles.cumsum(0)
    shift = (tile_end - tiles) * tile - slots.starts[:-1]  # padded start - sorted start
    position = shift[slots.experts] + torch.arange(num_slots, device=counts.device)
    capacity = (num_slots + min(num_experts, num_slots) * (tile - 1)) // tile
    sorted_ids = torch.full((capacity * tile,), num_slots, dtype=torch.int32, device=counts.device)
    sorted_ids[position] = slots.order.to(torch.int32)
    block = torch.arange(capacity, device=counts.device)
    expert_ids = torch.searchsorted(tile_end, block, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, expert_ids.to(torch.int32), (tile_end[-1:] * tile).to(torch.int32)


def combine(out: Tensor, route: Tensor) -> Tensor:
    """(T, H): each token's K slot rows of out (T*K, H) weighted by route (T, K) and summed."""
    tokens, top_k = route.shape
    slots = out.view(tokens, top_k, out.shape[-1])
    return torch.bmm(route.to(out.dtype).unsqueeze(1), slots).view(tokens, -1)


def _indexed(
    gemm: Gemm, inputs: Tensor, routing: tuple[Tensor, Tensor, Tensor], top_k: int
) -> Tensor:
    """One indexed MoE GEMM, its kernel chosen from the table the routing was padded for."""
    sorted_ids, expert_ids, num_tokens_padded = routing
    return gemm.layer(
        inputs,
        sorted_ids=sorted_ids,
        expert_ids=expert_ids,
        num_tokens_padded=num_tokens_padded,
        top_k=top_k,
        compute_config=INDEXED,
        tuning_config=gemm.tuning.table,
    )


def _check_call(plan: Plan, x: Tensor, ids: Tensor, route: Tensor) -> None:
    """Shapes and x's dtype only: a range check of ids would read the device back (a sync)."""
    if x.dim() != 2 or x.shape[1] != plan.hidden or x.dtype != torch.bfloat16:
        raise ValueError(
            f"x must be bf16 (T, H={plan.hidden}), the layers' activation dtype; got "
            f"{x.dtype} {tuple(x.shape)}."
        )
    if ids.dim() != 2 or ids.shape[0] != x.shape[0] or route.shape != ids.shape:
        raise ValueError(
            f"ids and route must both be (T={x.shape[0]}, top_k), got {tuple(ids.shape)} and "
            f"{tuple(route.shape)}."
        )


def _moe(plan: Plan, x: Tensor, ids: Tensor, route: Tensor) -> Tensor:
    """y (T, H) bf16: gate/up, SiLU-and-multiply, down, combine (see the module docstring)."""
    from humming.forward import may_process_input

    _check_call(plan, x, ids, route)
    top_k = ids.shape[1]
    rows = ids.numel()
    slots = sort_slots(ids, plan.edges)
    gate_up_tile, down_tile = plan.gate_up.tuning.tile(rows), plan.down.tuning.tile(rows)
    gate_up_routing = align_blocks(slots, gate_up_tile)
    down_routing = gate_up_routing
    if down_tile != gate_up_tile:
        down_routing = align_blocks(slots, down_tile)
    gate_up = _indexed(plan.gate_up, x, gate_up_routing, top_k)
    h, _, _ = may_process_input(
        plan.down.layer.humming_config,
        gate_up,
        activation_type="binary_split",
        activation_impl=SILU_AND_MUL,
        use_pdl=False,
    )
    return combine(_indexed(plan.down, h, down_routing, 1), route)


def prepare(weights: MoeWeights) -> MoeCall:
    """The peer's moe(x, ids, route) for one set of experts: both layers transformed, the
    routing tables pinned, and every kernel compiled by one call on one token."""
    _check_weights(weights)
    device = weights.gate_up.device
    plan = Plan(
        gate_up=_expert_layer(weights.gate_up, weights.gate_up_scale),
        down=_expert_layer(weights.down, weights.down_scale),
        edges=torch.arange(weights.gate_up.shape[0] + 1, device=device),
        hidden=weights.hidden,
    )
    moe = partial(_moe, plan)
    x = torch.zeros(1, weights.hidden, dtype=torch.bfloat16, device=device)
    ids = torch.zeros(1, 1, dtype=torch.int32, device=device)
    moe(x, ids, torch.ones(1, 1, device=device))  # JIT-compile now, outside any timing
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a failing kernel shows here, not in the first timing
    return moe
