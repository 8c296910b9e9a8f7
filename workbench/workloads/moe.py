"""The MoE workload: routed experts at a rank's shapes, T tokens, one routing, one seed.

Weights depend on (seed, shapes) only, so every variant and token count of a run shares them;
routing on (seed, routing, T); activations on (seed, T). Weight formats are quantised from the
same bf16 masters, so an FP8 and a bf16 row differ by the format alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.moe import MoeWeights, moe_reference
from workbench.presets import RankShapes, draw_routing
from workbench.workloads.seeds import derive, randn


@dataclass(frozen=True)
class MoeProblem:
    """One (routing, tokens) input: activations, expert ids and routing weights."""

    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    routing: str

    @property
    def tokens(self) -> int:
        return self.x.shape[0]

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first three arguments of every MoE kernel and of `moe_reference`."""
        return self.x, self.ids, self.weights

    def experts_touched(self) -> int:
        return int(torch.unique(self.ids).numel())


def expert_masters(
    s: RankShapes, seed: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routed-expert weights (E, 2I, H) and (E, H, I), scaled by fan-in."""
    gate_up = randn((s.experts, 2 * s.expert_intermediate, s.hidden), device, dtype, seed,
                    "moe", "gate_up")  # fmt: skip
    down = randn((s.experts, s.hidden, s.expert_intermediate), device, dtype, seed, "moe", "down")
    return gate_up.mul_(s.hidden**-0.5), down.mul_(s.expert_intermediate**-0.5)


def expert_weights(
    s: RankShapes, fmt: str, seed: int, device: torch.device, dtype: torch.dtype, **quantize
) -> MoeWeights:
    """The experts in weight format `fmt` (bf16, fp8, int4), quantised from the masters."""
    return MoeWeights.quantize(*expert_masters(s, seed, device, dtype), fmt, **quantize)


def moe_problem(
    s: RankShapes, tokens: int, routing: str, seed: int, device: torch.device, dtype: torch.dtype
) -> MoeProblem:
    """The tokens' activations and routing for (seed, routing, tokens)."""
    ids, route = draw_routing(tokens, s.experts, s.top_k, routing,
                              derive(seed, "moe", "routing", routing, tokens))  # fmt: skip
    x = randn((tokens, s.hidden), device, dtype, seed, "moe", "x", tokens)
    return MoeProblem(x, torch.from_numpy(ids).to(device), torch.from_numpy(route).to(device),
                      routing)  # fmt: skip


def reference(problem: MoeProblem, weights: MoeWeights) -> torch.Tensor:
    """The fp32 reference on the weights as the kernel holds them (dequantised)."""
    return moe_reference(*problem.args(), weights)


def weight_bytes(fmt: str, experts_touched: int, s: RankShapes, block: int = 128) -> float:
    """Bytes of the weights a launch must read: the touched experts' values and scales, as
    `kernels.moe.formats` stores them (FP8: an fp32 scale a block x block tile; INT4: a bf16
    scale a `block` values of a row)."""
    elements = experts_touched * 3 * s.hidden * s.expert_intermediate
    per_element = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5}[fmt]
    scale_bytes = {
        "bf16": 0.0,
        "fp8": 4.0 * elements / block**2,
        "int4": 2.0 * elements / block,
    }[fmt]
    return elements * per_element + scale_bytes


def flops(tokens: int, s: RankShapes) -> float:
    """Gate, up and down GEMMs of every routed slot."""
    return 2.0 * tokens * s.top_k * 3 * s.hidden * s.expert_intermediate


def min_bytes(fmt: str, problem: MoeProblem, s: RankShapes) -> float:
    """The fewest bytes a launch must move: the touched experts' weights and scales, the
    tokens' activations read once and the output written once."""
    activations = 2 * problem.tokens * s.hidden * problem.x.element_size()
    return weight_bytes(fmt, problem.experts_touched(), s) + activations
