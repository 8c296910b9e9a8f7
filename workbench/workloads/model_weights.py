"""The synthetic model's weights: one rank's shard of a few distinct layer weight sets.

Weights are drawn at the *whole* model's shapes, so every tensor-parallel degree slices the
same numbers and TP1 and TPn compute the same function; each weight set draws from its own
stream of the seed rule (`workloads.seeds`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels.dense as dense_kernels
from workbench.presets import RankShapes
from workbench.workloads.seeds import generator

# The dense projections of a layer: each a weight that SyntheticModel.linear multiplies by.
# Projections of one input are fused into one GEMM, as serving engines fuse them: `qkv_a`
# stacks the query LoRA's down projection, the latent KV, the indexer's key and its head
# weights (all of the normed hidden state); `q_up` the query heads and the indexer's queries
# (both of the normed query LoRA). At decode each GEMM is a launch of a few microseconds that
# moves little, so six launches become two.
DENSE_WEIGHTS = ("qkv_a", "q_up", "o_b", "shared_gate_up", "shared_down")


def qkv_a_split(s: RankShapes) -> tuple[int, int, int, int]:
    """Output widths of `qkv_a`: query LoRA, latent KV, indexer key, indexer head weights."""
    return (s.q_lora_rank, s.head_dim, s.index_dim, s.index_heads)


def q_up_split(s: RankShapes) -> tuple[int, int]:
    """Output widths of `q_up`: this rank's query heads, the indexer's queries."""
    return (s.q_heads * s.head_dim, s.index_heads * s.index_dim)


@dataclass(frozen=True)
class Shard:
    """Which slice of the model this process holds: rank `rank` of tensor parallelism `tp`.

    `group` is the torch.distributed process group of a real multi-rank run; without one the
    process simulates rank 0 alone and no collective runs (the preset's one-rank profile).
    """

    tp: int = 1
    rank: int = 0
    group: object | None = None

    def part(self, size: int) -> slice:
        """This rank's contiguous share of a dimension of `size`."""
        n = size // self.tp
        return slice(self.rank * n, (self.rank + 1) * n)


class ShardedInit:
    """Weights drawn at the *whole* model's shapes from one seed, keeping this rank's slice.

    Every tensor-parallel degree therefore slices the same weights, and TP1 and TPn compute
    the same function. Scaled by the whole fan-in so activations stay O(1) through 40 layers.
    Drawn in chunks of the leading dimension (experts) so the full size never sits in memory.
    """

    CHUNK = 16

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int, *key: object):
        self.gen = generator(device, seed, *key)
        self.device, self.dtype = device, dtype

    def _draw(self, shape: tuple[int, ...]) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen, device=self.device, dtype=self.dtype)
        return t.mul_(shape[-1] ** -0.5)

    def take(self, shape: tuple[int, ...], rows: list[slice] | None = None, cols=None):
        """The tensor of `shape`, keeping `rows` (of dim -2) and `cols` (of dim -1) slices."""

        def keep(t: torch.Tensor) -> torch.Tensor:
            if rows is not None:
                t = torch.cat([t[..., r, :] for r in rows], dim=-2)
            return t[..., cols] if cols is not None else t

        if len(shape) < 3:
            return keep(self._draw(shape)).contiguous()
        out = None
        for i in range(0, shape[0], self.CHUNK):
            part = keep(self._draw((min(self.CHUNK, shape[0] - i), *shape[1:])))
            if out is None:  # the shard alone is allocated; chunks of the full size come and go
                out = torch.empty((shape[0], *part.shape[1:]), device=self.device, dtype=self.dtype)
            out[i : i + part.shape[0]].copy_(part)
        return out


class LayerWeights:
    """One distinct weight set, this rank's shard of it; layers cycle through a few sets.

    Column-parallel (split by output rows): query heads, expert and shared-expert gate/up.
    Row-parallel (split by input columns, summed by an all-reduce): the output projection's
    second half and the expert and shared-expert down projections. Replicated: the single KV
    head, the query LoRA, the indexer, the router and the norms.
    """

    def __init__(
        self,
        full: RankShapes,
        shard: Shard,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        index: int,
        compressor: bool = False,
    ) -> None:
        """Weight set `index` of the model seeded by `seed` (its own stream of the seed rule);
        with `compressor`, also the gates of DeepSeek-V4's compressed layers (drawn last, so
        the other weights are the same numbers with or without it)."""
        init = ShardedInit(device, dtype, seed, "model", "weights", index)
        h, d = full.hidden, full.head_dim
        self.attn_norm = torch.ones(h, device=device, dtype=dtype)
        self.q_norm = torch.ones(full.q_lora_rank, device=device, dtype=dtype)
        self.kv_norm = torch.ones(d, device=device, dtype=dtype)
        self.ffn_norm = torch.ones(h, device=device, dtype=dtype)
        q_a = init.take((full.q_lora_rank, h))
        heads = shard.part(full.q_heads)
        q_b = init.take(
            (full.q_heads * d, full.q_lora_rank), rows=[slice(heads.start * d, heads.stop * d)]
        )
        kv = init.take((d, h))
        index_q = init.take((full.index_heads * full.index_dim, full.q_lora_rank))
        index_k = init.take((full.index_dim, h))
        # The indexer's 1/sqrt(heads) is folded into its head weights, so their GEMM's output
        # goes to the indexer as it is (no cast and scale launches after it).
        index_w = init.take((full.index_heads, h)).mul_(full.index_heads**-0.5)
        self.qkv_a = torch.cat([q_a, kv, index_k, index_w])
        self.q_up = torch.cat([q_b, index_q])
        del q_a, q_b, kv, index_q, index_k, index_w
        per_group = (full.q_heads // full.o_groups) * d
        o_a = [init.take((full.o_group_rank, per_group)) for _ in range(full.o_groups)]
        groups = shard.part(full.o_groups)
        # One tensor at one stride, so the group runs as one launch (kernels.dense.grouped).
        self.o_a = list(torch.stack(o_a[groups]).unbind())
        del o_a
        ranks = slice(groups.start * full.o_group_rank, groups.stop * full.o_group_rank)
        self.o_b = init.take((h, full.o_groups * full.o_group_rank), cols=ranks)
        self.router = init.take((full.experts, h))
        inter = full.expert_intermediate
        mine = shard.part(inter)
        gate_up_rows = [mine, slice(inter + mine.start, inter + mine.stop)]
        self.experts_gate_up = init.take((full.experts, 2 * inter, h), rows=gate_up_rows)
        self.experts_down = init.take((full.experts, h, inter), cols=mine)
        shared = full.shared_intermediate
        own = shard.part(shared)
        self.shared_gate_up = init.take(
            (2 * shared, h), rows=[own, slice(shared + own.start, shared + own.stop)]
        )
        self.shared_down = init.take((h, shared), cols=own)
        # The compressor's gates of a latent row and an indexer key, one per channel, whose
        # softmax over a group of tokens pools the group into one cache entry (replicated).
        self.compress = init.take((d + full.index_dim, h)) if compressor else None

    def quantize_dense(self, fmt: str) -> None:
        """Store every dense projection (and each output-projection group) as DenseWeights in
        `fmt`, replacing the bf16 tensors: done once, so no GEMM pays for quantisation."""
        for name in DENSE_WEIGHTS:
            setattr(self, name, dense_kernels.DenseWeights.quantize(getattr(self, name), fmt))
        if self.compress is not None:
            self.compress = dense_kernels.DenseWeights.quantize(self.compress, fmt)
        self.o_a = dense_kernels.DenseWeights.quantize_group(self.o_a, fmt)
