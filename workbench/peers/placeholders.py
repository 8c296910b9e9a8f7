"""Peers the workbench names but cannot run yet: each says exactly what is missing.

They are registered so that a benchmark shows them as `missing-peer` rows with the reason,
rather than leaving them out silently; none of them ever runs a stand-in under the peer's
name. What would make each work is in docs/peers.md ("Not there yet").
"""

from __future__ import annotations

from importlib.util import find_spec

NO_ADAPTER = "the workbench has no adapter for it yet"
VLLM_SIZE = (
    "vLLM's wheel is 336 MB (its _C 62.7 MiB and _moe_C 36.8 MiB gzipped), over the GPU box's "
    "64 MiB per-call transfer unless staged"
)


def _installed(module: str) -> bool:
    """Whether a top-level module is importable, without importing it (vLLM takes seconds)."""
    return find_spec(module) is not None


def marlin() -> tuple[bool, str]:
    """vLLM's FP8 Marlin (W8A16), the seed's "Marlin", compiled into vLLM's `_C` ops."""
    if _installed("vllm"):
        return False, f"vllm is importable but {NO_ADAPTER}; see docs/peers.md"
    return False, (
        f"vllm is not installed: its compiled `_C` ops carry Marlin; {VLLM_SIZE}; see docs/peers.md"
    )


def vllm_fused_moe() -> tuple[bool, str]:
    """vLLM's fused MoE (Triton, with its `_moe_C` routing ops)."""
    if _installed("vllm"):
        return False, f"vllm is importable but {NO_ADAPTER}; see docs/peers.md"
    return False, (
        f"vllm is not installed: fused_moe needs its `_moe_C` ops; {VLLM_SIZE}; see docs/peers.md"
    )
