"""Routed MoE experts: torch references and Triton grouped-GEMM schedulers.

VARIANTS maps a scheduler name to a callable with moe_reference's signature
(x, topk_ids, topk_weights, w_gate_up, w_down) -> (T, H).
"""

from collections.abc import Callable

from kernels.moe.reference import moe_reference, router_topk, shared_expert
from kernels.moe.stock import moe_stock

VARIANTS: dict[str, Callable] = {"stock": moe_stock, "reference": moe_reference}

__all__ = ["VARIANTS", "moe_reference", "moe_stock", "router_topk", "shared_expert"]
