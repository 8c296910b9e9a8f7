"""Routed MoE experts: torch references and Triton grouped-GEMM schedulers in three formats.

VARIANTS maps a scheduler name to a callable with moe_reference's signature, (x, topk_ids,
topk_weights, weights, w_down=None) -> (T, H), where weights is MoeWeights in one of FORMATS, a
(w_gate_up, w_down) tuple, or w_gate_up followed by w_down (plain tensors mean the bf16 format).
The W8A8_VARIANTS quantise the activations too and take FP8 weights only. After a call,
last_facts() gives registers, spills and shared memory of the Triton kernels it launched (None
under the interpreter).
"""

from collections.abc import Callable

from kernels.compiled import KernelFacts, last_facts
from kernels.moe.flat import moe_flat
from kernels.moe.formats import FORMATS, MoeWeights
from kernels.moe.multirow import moe_multirow
from kernels.moe.padded import moe_padded
from kernels.moe.reference import moe_reference, router_topk, shared_expert, silu_mul_reference
from kernels.moe.routing import trusted_routing
from kernels.moe.stock import moe_stock
from kernels.moe.w8a8 import moe_flat_w8a8, moe_w8a8

VARIANTS: dict[str, Callable] = {
    "stock": moe_stock,
    "multirow": moe_multirow,
    "flat": moe_flat,
    "padded": moe_padded,
    "w8a8": moe_w8a8,
    "flat_w8a8": moe_flat_w8a8,
    "reference": moe_reference,
}
# FP8 activations (flat_w8a8: at prefill): FP8 weights only, checked as W8A8
W8A8_VARIANTS = frozenset({"w8a8", "flat_w8a8"})

__all__ = [
    "FORMATS",
    "VARIANTS",
    "W8A8_VARIANTS",
    "KernelFacts",
    "MoeWeights",
    "last_facts",
    "moe_flat",
    "moe_flat_w8a8",
    "moe_multirow",
    "moe_padded",
    "moe_reference",
    "moe_stock",
    "moe_w8a8",
    "router_topk",
    "shared_expert",
    "silu_mul_reference",
    "trusted_routing",
]
