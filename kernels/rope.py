"""Rotary position embedding (RoPE), torch reference: the rotary part of each query and key
head turned by angles that grow with the token's position, so that a query-key product depends
on their distance.

DeepSeek's attention rotates 64 dims of each query and key head (of the latent's and of each
indexer head's); the synthetic model's heads hold them as their last `rope_dim` dims (DeepSeek
keeps the latent's apart from its 512), rotated in halves (the GPT-NeoX layout: dim i pairs
with dim i + rope_dim / 2; DeepSeek pairs neighbours, at the same cost) by angles
pos * theta^(-2i / rope_dim). Computed in fp32 and stored in the tensor's own dtype, in place,
as serving engines apply it between the projections and the attention.
"""

import math

import torch
from torch import Tensor

ROPE_THETA = 10000.0


def rope_angles(positions: Tensor, rope_dim: int, theta: float = ROPE_THETA) -> Tensor:
    """The angles (rows, rope_dim / 2), fp32, of the tokens at `positions` (rows,)."""
    half = torch.arange(rope_dim // 2, dtype=torch.float32, device=positions.device)
    inv_freq = torch.exp2(half * (-2.0 * math.log2(theta) / rope_dim))
    return positions.to(torch.float32)[:, None] * inv_freq


def rope_(x: Tensor, positions: Tensor, rope_dim: int, theta: float = ROPE_THETA) -> Tensor:
    """Rotate the last `rope_dim` dims of every head of x (rows, heads, dim) in place, each
    row by its token's position (`positions`, (rows,)); returns x."""
    angles = rope_angles(positions, rope_dim, theta)[:, None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    part = x[..., x.shape[-1] - rope_dim :]
    first, second = part.float().chunk(2, dim=-1)
    part.copy_(torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1))
    return x


def rope_heads_(
    q_all: Tensor, heads: tuple[int, int], kv: Tensor, index_k: Tensor,
    positions: Tensor | int, rope_dim: int, theta: float = ROPE_THETA,
) -> None:  # fmt: skip
    """`kernels.glue.rope_fused`'s reference, argument for argument: `rope_` on the query and
    indexer-query heads side by side in each row of `q_all`, the latent key `kv` and the
    indexer key `index_k`, in place; `positions` a tensor or the first of consecutive ones."""
    rows, head, idx = kv.shape[0], kv.shape[-1], index_k.shape[-1]
    if not isinstance(positions, Tensor):
        positions = torch.arange(positions, positions + rows, device=q_all.device)
    q, index_q = q_all.split([heads[0] * head, heads[1] * idx], 1)
    for x in (q.view(rows, heads[0], head), kv.view(rows, 1, head),
              index_q.view(rows, heads[1], idx), index_k.view(rows, 1, idx)):  # fmt: skip
        rope_(x, positions, rope_dim, theta)
