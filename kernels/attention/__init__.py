"""Sparse attention with a lightning indexer: scores, position selection, and the attention itself.

VARIANTS maps a variant name to an `attention(q, kv, index, scale=None)` callable.
"""

from collections.abc import Callable

from torch import Tensor

from kernels.attention.reference import indexer_scores, select_positions, sparse_attention


def attention(q: Tensor, kv: Tensor, index: Tensor, scale: float | None = None) -> Tensor:
    """Torch reference variant, with the signature every attention variant shares."""
    return sparse_attention(q, kv, index, scale)


VARIANTS: dict[str, Callable] = {"torch": attention}

__all__ = ["VARIANTS", "attention", "indexer_scores", "select_positions", "sparse_attention"]
