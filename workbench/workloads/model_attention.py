"""The synthetic model's attention over its cache: the function a layer's attention block calls
with its queries, latent rows and indexer inputs, for one prefill chunk or one decode step.

A sparse layer (D, DeepSeek-V3.2's) writes the tokens into the caches, lets the attention
variant choose each query's positions (the indexer's top-k and the window) and attends to
them; window and compressed layers (W, C, H) run `compressed.CompressedAttention`. Every
step runs inside the `attention` category's profiler scope.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.profiler import record_function

import kernels.attention as attention_kernels
from workbench.presets import RankShapes
from workbench.workloads.compressed import CompressedAttention

if TYPE_CHECKING:
    from workbench.workloads.model_state import Cache, DecodeState

# attend_to(q, kv, index_q, index_k, index_w, gates=None) -> (tokens, heads, head_dim)
AttendTo = Callable[..., torch.Tensor]


def prefill_attention(
    attn: attention_kernels.AttentionVariant,
    s: RankShapes,
    kind: str,
    cache: Cache,
    layer: int,
    start: int,
    size: int,
) -> AttendTo:
    """Layer `layer`'s attention for the prefill chunk of `size` tokens from `start`."""
    if kind != "D":
        return _compressed(attn, s, kind, cache, layer, start=start)
    end = start + size

    def attend_to(q, kv, index_q, index_k, index_w, gates=None):
        with record_function("attention"):
            attn.write_cache(cache.kv[layer], cache.keys[layer], start, kv, index_k)
            pos = torch.arange(start, end, device=kv.device)
            chosen = attn.choose(index_q, index_w, cache.keys[layer], pos, end, s.index_topk,
                                 s.window)  # fmt: skip
            return attn.attend(q, cache.kv[layer], chosen)

    return attend_to


def decode_attention(
    attn: attention_kernels.AttentionVariant,
    s: RankShapes,
    kind: str,
    state: DecodeState,
    layer: int,
) -> AttendTo:
    """One step's attention of every stream over the prompt and its own tail: virtual
    positions from the prompt's end on read the stream's tail rows (`Cache`)."""
    cache = state.cache
    if kind != "D":
        return _compressed(attn, s, kind, cache, layer, state=state)
    layout = {"split": cache.prompt, "shift": state.shift}

    def attend_to(q, kv, index_q, index_k, index_w, gates=None):
        with record_function("attention"):
            new = attention_kernels.NewTokens(cache.kv[layer], state.rows, kv, index_k)
            chosen = attn.choose(index_q, index_w, cache.keys[layer], state.pos,
                                 cache.prompt + cache.tail, s.index_topk, s.window,
                                 **layout, new=new)  # fmt: skip
            return attn.attend(q, cache.kv[layer], chosen)

    return attend_to


def _compressed(
    attn: attention_kernels.AttentionVariant,
    s: RankShapes,
    kind: str,
    cache: Cache,
    layer: int,
    start: int = 0,
    state: DecodeState | None = None,
) -> AttendTo:
    """A window or compressed layer's attention: a prefill chunk from `start`, or a decode
    step of `state`."""
    layer_attention = CompressedAttention(attn, s, kind)

    def attend_to(q, kv, index_q, index_k, index_w, gates=None):
        with record_function("attention"):
            if state is None:
                return layer_attention.prefill(cache, layer, start, q, kv, index_q, index_k,
                                               index_w, gates)  # fmt: skip
            return layer_attention.decode(cache, layer, state, q, kv, index_q, index_k,
                                          index_w, gates)  # fmt: skip

    return attend_to
