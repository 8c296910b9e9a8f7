"""The dense workload: one layer's projections at a rank's shapes, M tokens, one seed.

The weights of projection `p`, copy `c` depend on (seed, p, c) only, and the activations of M
tokens with K features on (seed, M, K), so a bench row, an ncu capture and a tuning script of
the same (variant, M, seed) run on the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

import kernels.dense as dense
from workbench.presets import RankShapes
from workbench.workloads.model_weights import q_up_split, qkv_a_split
from workbench.workloads.seeds import randn


@dataclass(frozen=True)
class Projection:
    """One dense projection of a layer: y (M, n) = x (M, k) @ W.T, `count` distinct weights."""

    name: str
    n: int
    k: int
    count: int = 1


def layer_projections(s: RankShapes) -> list[Projection]:
    """The dense GEMMs of one layer at one rank's shapes, as the synthetic model runs them."""
    per_group = (s.q_heads // s.o_groups) * s.head_dim
    return [
        Projection("qkv_a", sum(qkv_a_split(s)), s.hidden),
        Projection("q_up", sum(q_up_split(s)), s.q_lora_rank),
        Projection("o_a", s.o_group_rank, per_group, count=s.o_groups),
        Projection("o_b", s.hidden, s.o_groups * s.o_group_rank),
        Projection("shared_gate_up", 2 * s.shared_intermediate, s.hidden),
        Projection("shared_down", s.hidden, s.shared_intermediate),
    ]


def layer_flops(m: int, projections: Sequence[Projection]) -> float:
    return 2.0 * m * sum(p.n * p.k * p.count for p in projections)


def projection_master(
    p: Projection,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    copy: int = 0,
    index: int = 0,
) -> torch.Tensor:
    """The weight (n, k) of projection `p` (its `index`-th of `count`) in layer copy `copy`,
    scaled by fan-in."""
    return randn((p.n, p.k), device, dtype, seed, "dense", p.name, copy, index).mul_(p.k**-0.5)


def activations(
    m: int, in_features: Iterable[int], seed: int, device: torch.device, dtype: torch.dtype
) -> dict[int, torch.Tensor]:
    """The layer's inputs at M tokens: one (M, K) activation per distinct K."""
    return {k: randn((m, k), device, dtype, seed, "dense", "x", m, k) for k in set(in_features)}


class Layer:
    """`copies` copies of one layer's dense weights: bf16 masters and the FP8 DenseWeights."""

    def __init__(
        self,
        s: RankShapes,
        copies: int,
        block: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
    ) -> None:
        self.projections = layer_projections(s)
        self.masters = [
            [
                w
                for p in self.projections
                for w in torch.stack(
                    [projection_master(p, seed, device, dtype, copy, i) for i in range(p.count)]
                ).unbind()  # a group's members at one stride (kernels.dense.grouped)
            ]
            for copy in range(copies)
        ]
        self.fp8 = [self._quantized(ws, block) for ws in self.masters]
        # The input width of each call: a group reads the concatenation of its members' inputs.
        self.input_widths = [p.k * p.count for p in self.projections]

    def _quantized(self, masters: list[torch.Tensor], block: int) -> list:
        """FP8 weights of one copy, a group's members quantised together (one stride)."""
        out, first = [], 0
        for p in self.projections:
            out += dense.DenseWeights.quantize_group(masters[first : first + p.count], "fp8", block)
            first += p.count
        return out

    def calls(
        self, linear: Callable, linear_group: Callable, xs: dict[int, torch.Tensor], weights: list
    ) -> list[Callable[[], torch.Tensor]]:
        """One call per projection of the layer, on the inputs `xs` (`activations` at
        `input_widths`) and one copy's `weights`: `linear(x, w)`, or for a group (count > 1)
        `linear_group(x viewed (M, count, K), members)`, as the model runs them."""
        calls, first = [], 0
        for p in self.projections:
            members = weights[first : first + p.count]
            first += p.count
            x = xs[p.k * p.count]
            if p.count == 1:
                calls.append(partial(linear, x, members[0]))
            else:
                calls.append(partial(linear_group, x.view(x.shape[0], p.count, p.k), members))
        return calls

    def weights(self, variant: str) -> list[list]:
        return self.masters if dense.WEIGHT_FORMAT[variant] == "bf16" else self.fp8

    def activation_bytes(self, m: int) -> int:
        """Bytes of the layer's inputs read and outputs written once at M tokens (bf16)."""
        return 2 * m * sum((p.k + p.n) * p.count for p in self.projections)

    def weight_bytes(self, variant: str) -> int:
        """Bytes one copy of the layer's weights takes in the variant's format."""
        return sum(w.nbytes for w in self.weights(variant)[0])
