"""Sparse attention with a lightning indexer: the cache write, scores, position selection, and
the attention itself.

VARIANTS maps a variant name to an `AttentionVariant`: its cache write, indexer, position
selection and attention, which the model calls in that order. Called directly, a variant is
its attention, `variant(q, kv, index, scale=None)`.

- `torch`: the references (torch.topk selection), bf16 keys.
- `triton`: the bf16 Triton indexer, the sampled Triton select (`select_sampled`: a radix
  select on a sample, then on the few candidates that reach its cut) and sparse attention.
- `fp8`: as DeepSeek serves it: keys cached in FP8 with per-key scales, the FP8 indexer and
  sparse attention; at decode the indexer takes the select's first round and the select is
  chunked over many programs, at prefill the sampled select takes a row a program; five
  launches a decode layer, the indexer writing the step's token into the caches
  (`indexer_select`, `choose(new=...)`).

DeepSeek-V4's compressed layers also pool groups of tokens into cache entries
(`kernels.attention.compress`): the torch variant with the torch definition, the others with
its kernels.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kernels.attention import compress
from kernels.attention.formats import NewTokens, QuantizedKeys, empty_keys
from kernels.attention.indexer import indexer_scores_triton
from kernels.attention.indexer_fp8 import indexer_scores_fp8
from kernels.attention.indexer_select import entry_select_fp8, indexer_select_fp8
from kernels.attention.key_cache import quantize_keys, write_cache
from kernels.attention.reference import (
    cache_rows,
    indexer_scores,
    select_positions,
    sparse_attention,
)
from kernels.attention.select import select_positions_triton
from kernels.attention.select_sampled import select_positions_sampled
from kernels.attention.sparse import sparse_attention_triton


def write_cache_torch(
    kv_cache: Tensor, keys: Tensor, rows: int | Tensor, kv: Tensor, index_k: Tensor
) -> None:
    """Store tokens' latent rows and bf16 indexer keys at `rows` (a first row, or a tensor)."""
    where = slice(rows, rows + kv.shape[0]) if isinstance(rows, int) else rows
    kv_cache[where] = kv
    keys[where] = index_k


@dataclass(frozen=True)
class AttentionVariant:
    """The steps of indexer-driven sparse attention, as one variant runs them.

    write_cache(kv_cache, keys, rows, kv, index_k) stores tokens at cache rows;
    indexer_scores(q_idx, weights, keys, query_pos=None, length=None, split=None, shift=None)
    -> (Q, length) fp32;
    select_positions(scores, query_pos, topk, window, split=None, shift=None)
    -> (Q, topk + window) cache rows, -1 unused;
    attend(q, kv, index, scale=None) -> (Q, heads, D).
    `key_format` is how `keys` are cached: "bf16" tensors or "fp8" `QuantizedKeys`.
    `indexer_select`, where a variant fuses the two, does what `choose` does otherwise.
    `pool_groups` and `compress_step` are a compressed layer's compressor at prefill and
    decode, `csa_rows` a CSA query's picked entries and window as one row list
    (`kernels.attention.compress`); `entry_select`, where a variant has it, does what
    `choose_entries` does otherwise.
    """

    write_cache: Callable[..., None]
    indexer_scores: Callable[..., Tensor]
    select_positions: Callable[..., Tensor]
    attend: Callable[..., Tensor]
    key_format: str = "bf16"
    indexer_select: Callable[..., Tensor] | None = None
    pool_groups: Callable[..., Tensor] = compress.pool_groups
    compress_step: Callable[..., None] = compress.compress_step
    csa_rows: Callable[..., Tensor] = compress.csa_rows
    entry_select: Callable[..., Tensor] | None = None

    def __call__(self, q: Tensor, kv: Tensor, index: Tensor, scale: float | None = None) -> Tensor:
        return self.attend(q, kv, index, scale)

    def choose(
        self,
        q_idx: Tensor,
        weights: Tensor,
        keys: Tensor | QuantizedKeys,
        query_pos: Tensor,
        length: int | None,
        topk: int,
        window: int,
        split: int | None = None,
        shift: Tensor | None = None,
        new: NewTokens | None = None,
    ) -> Tensor:
        """The positions (cache rows) each query attends to: the indexer's scores, then the
        selection, or the variant's fused `indexer_select`. A decode step's `new` tokens are
        written to the caches first (`write_cache`), by the fused indexer itself where the
        variant has one: one launch fewer a layer."""
        if self.indexer_select is not None:
            return self.indexer_select(q_idx, weights, keys, query_pos, length, topk, window,
                                       split, shift, new=new)  # fmt: skip
        if new is not None:
            self.write_cache(new.kv_cache, keys, new.rows, new.kv, new.index_k)
        layout = {"split": split, "shift": shift}
        scores = self.indexer_scores(q_idx, weights, keys, query_pos, length, **layout)
        return self.select_positions(scores, query_pos, topk, window, **layout)

    def choose_entries(
        self,
        q_idx: Tensor,
        weights: Tensor,
        keys: Tensor | QuantizedKeys,
        entry_pos: Tensor,
        query_pos: Tensor,
        length: int,
        topk: int,
        window_rows: Tensor,
        offset: int,
        split: int | None = None,
        shift: Tensor | None = None,
    ) -> Tensor:
        """The rows a CSA query attends to (`compress.csa_rows`): the entries the indexer
        picks among `length`, scored from query_pos (its entry position entry_pos, or 0 where
        that is -1), `offset` rows on, then its window rows; or the variant's `entry_select`."""
        if self.entry_select is not None:
            return self.entry_select(q_idx, weights, keys, entry_pos, query_pos, length, topk,
                                     window_rows, offset, split, shift)  # fmt: skip
        picked = self.choose(q_idx, weights, keys, query_pos, length, topk, 0, split, shift)
        return self.csa_rows(picked, entry_pos, window_rows, offset)

    def empty_keys(
        self, rows: int, dim: int, device: torch.device | str, dtype: torch.dtype
    ) -> Tensor | QuantizedKeys:
        """A key cache of `rows` keys in this variant's format."""
        if self.key_format == "fp8":
            return empty_keys(rows, dim, device)
        return torch.empty(rows, dim, device=device, dtype=dtype)

    def cache_keys(self, keys: Tensor) -> Tensor | QuantizedKeys:
        """(L, d) keys as this variant's cache holds them."""
        return quantize_keys(keys) if self.key_format == "fp8" else keys


VARIANTS: dict[str, AttentionVariant] = {
    "torch": AttentionVariant(
        write_cache_torch, indexer_scores, select_positions, sparse_attention
    ),
    "triton": AttentionVariant(
        write_cache_torch,
        indexer_scores_triton,
        select_positions_sampled,
        sparse_attention_triton,
        pool_groups=compress.pool_groups_triton,
        compress_step=compress.compress_step_triton,
        csa_rows=compress.csa_rows_triton,
    ),
    "fp8": AttentionVariant(
        write_cache,
        indexer_scores_fp8,
        select_positions_sampled,
        sparse_attention_triton,
        "fp8",
        indexer_select_fp8,
        compress.pool_groups_triton,
        compress.compress_step_triton,
        compress.csa_rows_triton,
        entry_select_fp8,
    ),
}

__all__ = [
    "VARIANTS",
    "AttentionVariant",
    "NewTokens",
    "QuantizedKeys",
    "cache_rows",
    "indexer_scores",
    "indexer_scores_fp8",
    "indexer_scores_triton",
    "entry_select_fp8",
    "indexer_select_fp8",
    "quantize_keys",
    "select_positions",
    "select_positions_sampled",
    "select_positions_triton",
    "sparse_attention",
    "sparse_attention_triton",
    "write_cache",
]
