"""The sparse-attention workload: queries ending at a context length, one seed.

Inputs of a scenario depend on (seed, queries, context) only, with the fp32 answers they are
checked by (indexer scores, the positions the fp32 indexer selects, the attention over them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

import kernels.attention as attention
from kernels.attention.indexer import DECODE_QUERIES  # at or below: a decode batch

__all__ = ["DECODE_QUERIES", "SCENARIOS", "Problem", "Scenario"]
from workbench.presets import RankShapes
from workbench.workloads.seeds import randn


@dataclass(frozen=True)
class Scenario:
    """`queries` consecutive queries whose last one sits at position `context - 1`."""

    name: str
    queries: int
    context: int


SCENARIOS = (
    Scenario("decode-2K", 1, 2048),
    Scenario("decode-46K", 1, 46_000),
    Scenario("prefill-46K", 4096, 46_000),
)


@dataclass
class Problem:
    """One scenario's inputs in the serving dtype, and the answers they are checked by: fp32
    of the inputs as drawn (`fp32_*`) and as a variant poses them (`scores_ref`, `index`,
    `out_ref`: the same unless its key format quantises them, `bench_attention.own_problem`)."""

    q: torch.Tensor
    kv: torch.Tensor
    index_q: torch.Tensor
    index_w: torch.Tensor
    keys: torch.Tensor
    pos: torch.Tensor
    index: torch.Tensor  # positions the reference indexer selects
    scores_ref: torch.Tensor
    out_ref: torch.Tensor
    fp32_scores: torch.Tensor
    fp32_index: torch.Tensor
    fp32_out: torch.Tensor
    cached_keys: torch.Tensor | attention.QuantizedKeys

    @classmethod
    def draw(
        cls, sc: Scenario, s: RankShapes, dtype: torch.dtype, device: torch.device, seed: int
    ) -> Problem:
        def draw(name: str, *shape: int, dtype: torch.dtype = dtype) -> torch.Tensor:
            return randn(shape, device, dtype, seed, "attention", name, sc.queries, sc.context)

        index_q = draw("index_q", sc.queries, s.index_heads, s.index_dim)
        keys = draw("keys", sc.context, s.index_dim)
        index_w = draw("index_w", sc.queries, s.index_heads, dtype=torch.float32)
        index_w *= s.index_heads**-0.5
        q = draw("q", sc.queries, s.q_heads, s.head_dim)
        kv = draw("kv", sc.context, s.head_dim)
        pos = torch.arange(sc.context - sc.queries, sc.context, device=device)
        scores = attention.indexer_scores(index_q.float(), index_w, keys.float(), pos)
        index = attention.select_positions(scores, pos, s.index_topk, s.window)
        out = attention.sparse_attention(q.float(), kv.float(), index)
        return cls(q, kv, index_q, index_w, keys, pos, index, scores, out, scores, index, out,
                   keys)  # fmt: skip

    def with_keys(self, variant: attention.AttentionVariant, topk: int, window: int) -> Problem:
        """The problem as `variant` poses it: its cache's keys, and for FP8 keys the fp32
        scores, selection and attention of the quantised inputs (what its kernels must
        reproduce; the gap to `fp32_*` is its quantisation error)."""
        if variant.key_format != "fp8":
            return self
        keys = variant.cache_keys(self.keys)
        scores = attention.reference.indexer_scores_fp8(self.index_q, self.index_w, keys, self.pos)
        index = attention.select_positions(scores, self.pos, topk, window)
        out = attention.sparse_attention(self.q.float(), self.kv.float(), index)
        return replace(self, cached_keys=keys, scores_ref=scores, index=index, out_ref=out)
