"""Changing what a built model computes with: its experts quantised to a weight format, or a
category handed to another project's kernel (a peer), each converted once.

The model draws bf16 masters; these functions replace them in place with what a kernel holds,
so the profiled region never pays for a conversion.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch

import kernels.dense as dense_kernels
import kernels.moe as moe_kernels
from workbench.workloads.model_weights import DENSE_WEIGHTS

if TYPE_CHECKING:
    from workbench.workloads.model import SyntheticModel


def _call_peer_linear(x: torch.Tensor, linear: Callable) -> torch.Tensor:
    """A dense GEMM when a peer holds the weight: the weight is the peer's linear(x)."""
    return linear(x)


def _call_peer_moe(x, ids, route, moe: Callable, _unused: None) -> torch.Tensor:
    """The routed experts when a peer holds them: the gate_up slot is the peer's moe call."""
    return moe(x, ids, route)


EXPERT_CHUNK = 4  # experts quantised at once: the fp32 temporaries of a few, not of all


def quantize_experts(
    gate_up: torch.Tensor, down: torch.Tensor, fmt: str, block: int = 128
) -> moe_kernels.MoeWeights:
    """`MoeWeights.quantize(gate_up, down, fmt, block)`, a few experts at a time, so that the
    quantiser's fp32 copies never hold a whole weight set (gigabytes at the served shapes)."""
    if fmt == "bf16":  # nothing to quantise: the tensors as they are
        return moe_kernels.MoeWeights.quantize(gate_up, down, fmt, block)
    out = None
    for i in range(0, gate_up.shape[0], EXPERT_CHUNK):
        part = moe_kernels.MoeWeights.quantize(
            gate_up[i : i + EXPERT_CHUNK], down[i : i + EXPERT_CHUNK], fmt, block
        )
        pieces = (part.gate_up, part.down, part.gate_up_scale, part.down_scale)
        if out is None:
            out = [p.new_empty((gate_up.shape[0], *p.shape[1:])) for p in pieces]
        for whole, piece in zip(out, pieces):
            whole[i : i + piece.shape[0]].copy_(piece)
    return moe_kernels.MoeWeights(fmt, *out, block=block)


def use_dense_peer(model: SyntheticModel, name: str, prepare: Callable) -> None:
    """Hand the dense projections to another project's kernel: `prepare(DenseWeights) ->
    linear(x)` converts each FP8 projection once (the model must have been built with an
    FP8 dense variant, so they are DeepSeek's 128x128 blocks), and every GEMM then calls
    the peer's linear. The LM head stays cuBLAS bf16, as checkpoints ship it."""
    for weights in model.weights:
        for attr in DENSE_WEIGHTS:
            setattr(weights, attr, prepare(getattr(weights, attr)))
        weights.o_a = [prepare(w) for w in weights.o_a]
        if weights.compress is not None:
            weights.compress = prepare(weights.compress)
    model.linear = _call_peer_linear
    model.linear_group = partial(dense_kernels.one_by_one, _call_peer_linear)
    model.kernels_run["dense"] = name


def use_moe_peer(model: SyntheticModel, name: str, prepare_moe: Callable) -> None:
    """Hand the routed experts to another project's kernel: each weight set's experts are
    quantised to FP8 in 128x128 blocks (the peers' format) and converted once by
    `prepare_moe(MoeWeights) -> moe(x, ids, route)`, which then replaces the MoE kernel."""
    for weights in model.weights:
        experts = quantize_experts(weights.experts_gate_up, weights.experts_down, "fp8")
        weights.experts_gate_up, weights.experts_down = prepare_moe(experts), None
        del experts
    model.moe_fn = _call_peer_moe
    model.kernels_run["moe"] = name
