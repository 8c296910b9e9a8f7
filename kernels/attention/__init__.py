"""Sparse attention with a lightning indexer: scores, position selection, and the attention itself.

VARIANTS maps a variant name to an `AttentionVariant`: its indexer, its position selection and
its attention, which the model calls in that order. Called directly, a variant is its attention,
`variant(q, kv, index, scale=None)`. `torch` is the reference; `triton` runs the Triton indexer
and sparse attention kernels (the top-k selection is torch.topk in both).
"""

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from kernels.attention.indexer import indexer_scores_triton
from kernels.attention.reference import indexer_scores, select_positions, sparse_attention
from kernels.attention.sparse import sparse_attention_triton


@dataclass(frozen=True)
class AttentionVariant:
    """The three steps of indexer-driven sparse attention, as one variant runs them.

    indexer_scores(q_idx, weights, k_idx, query_pos=None) -> (Q, L) fp32;
    select_positions(scores, query_pos, topk, window) -> (Q, topk + window) rows, -1 unused;
    attend(q, kv, index, scale=None) -> (Q, heads, D).
    """

    indexer_scores: Callable[..., Tensor]
    select_positions: Callable[..., Tensor]
    attend: Callable[..., Tensor]

    def __call__(self, q: Tensor, kv: Tensor, index: Tensor, scale: float | None = None) -> Tensor:
        return self.attend(q, kv, index, scale)


VARIANTS: dict[str, AttentionVariant] = {
    "torch": AttentionVariant(indexer_scores, select_positions, sparse_attention),
    "triton": AttentionVariant(indexer_scores_triton, select_positions, sparse_attention_triton),
}

__all__ = [
    "VARIANTS",
    "AttentionVariant",
    "indexer_scores",
    "indexer_scores_triton",
    "select_positions",
    "sparse_attention",
    "sparse_attention_triton",
]
