"""The glue between a layer's GEMMs, chosen once for the whole model: the fused Triton kernels
(`kernels.glue`) on the GPU, as a server runs it, or their torch references on the CPU
stand-in (the kernels' own interpreter tests check them against those)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels.moe as moe_kernels
from kernels.glue import rms_norm_fused, rope_fused, router_topk_fused, silu_mul_fused
from kernels.norm import rms_norm
from kernels.rope import rope_heads_


@dataclass(frozen=True)
class Glue:
    """RMSNorm (with the residual add before it), the router's top-k, RoPE and SiLU-and-multiply:
    one launch each when `fused`."""

    fused: bool

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm_fused(x, weight) if self.fused else rms_norm(x, weight)

    def add_norm(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, its RMSNorm): one launch fused, two ops in torch. Without a
        residual, (x, its RMSNorm)."""
        if residual is None:
            return x, self.norm(x, weight)
        if self.fused:
            return rms_norm_fused(x, weight, residual=residual)
        summed = x + residual
        return summed, rms_norm(summed, weight)

    def router_topk(self, logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused:
            return router_topk_fused(logits, top_k)
        return moe_kernels.router_topk(logits, top_k)

    def rope(
        self,
        q_all: torch.Tensor,
        heads: tuple[int, int],
        kv: torch.Tensor,
        index_k: torch.Tensor,
        positions: torch.Tensor | int,
        rope_dim: int,
    ) -> None:
        """RoPE in place on the query and indexer-query heads (`q_all`, the up-projection's
        output), the latent key and the indexer key (`kernels.glue.rope_fused`)."""
        rotate = rope_fused if self.fused else rope_heads_
        rotate(q_all, heads, kv, index_k, positions, rope_dim)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return silu_mul_fused(gate_up)
        return moe_kernels.silu_mul_reference(gate_up)
