"""How much device memory a profile needs, checked before anything is allocated.

The estimate is deliberately simple and a little generous: weights, the KV cache, the prompt's
hidden states, and the largest per-chunk temporaries (gathered keys for sparse attention, the
indexer's score rows, the MoE slot buffers). Its job is to turn a mid-run out-of-memory crash
into an up-front error that says how many tokens do fit.
"""

from __future__ import annotations

from workbench.errors import WorkbenchError
from workbench.presets import Preset

GIB = 2**30
HEADROOM = 2 * GIB  # CUDA context, allocator slack, cuBLAS workspaces
INDEXER_QUERY_BLOCK = 512  # kernels.attention.indexer_scores' default query_block


def estimate_bytes(preset: Preset, prompt_tokens: int, chunk: int, streams: int = 1) -> int:
    """Bytes a profile of `prompt_tokens` in chunks of `chunk` needs on one device."""
    s = preset.rank_shapes()
    distinct = min(preset.distinct_weight_sets, preset.layers)
    weights = distinct * s.weight_bytes_per_layer() + s.vocab * s.hidden * 2
    cache = (prompt_tokens + streams) * s.cache_bytes_per_token(preset.layers)
    prompt = prompt_tokens * s.hidden * 2
    per_chunk_token = (
        s.top_k * (s.hidden * 4 + s.expert_intermediate * 2 * 2)  # MoE slot buffers
        + (s.index_topk + s.window) * s.head_dim * 2 * 2  # gathered latent keys, scores
        + prompt_tokens * 4 * 3  # indexer score row, masked copy, top-k temporaries
        + s.hidden * 2 * 12  # hidden-size activations alive at once
    )
    # The indexer scores one block of queries against every key at once: dots, relu, fp32.
    indexer_block = INDEXER_QUERY_BLOCK * s.index_heads * prompt_tokens * (2 + 2 + 4)
    return weights + cache + prompt + indexer_block + chunk * per_chunk_token + HEADROOM


def tokens_that_fit(preset: Preset, free_bytes: int, chunk: int | None, streams: int = 1) -> int:
    """The largest prompt that `estimate_bytes` says fits in `free_bytes` (0 if none)."""
    lo, hi = 0, 1 << 22
    while lo < hi:
        mid = (lo + hi + 1) // 2
        need = estimate_bytes(preset, mid, min(chunk or mid, mid), streams)
        lo, hi = (mid, hi) if need <= free_bytes else (lo, mid - 1)
    return lo


def out_of_memory_error(
    preset: Preset, prompt_tokens: int, chunk: int | None, free_bytes: int, streams: int = 1
) -> WorkbenchError:
    """The error to raise when a profile does not fit: what it needs and what would fit."""
    need = estimate_bytes(
        preset, prompt_tokens, min(chunk or prompt_tokens, prompt_tokens), streams
    )
    fit = tokens_that_fit(preset, free_bytes, chunk, streams)
    return WorkbenchError(
        f"out of GPU memory: a {prompt_tokens}-token profile of preset '{preset.name}' needs "
        f"about {need / GIB:.1f} GiB and {free_bytes / GIB:.1f} GiB is free; this preset fits "
        f"about {fit} prompt tokens with prefill_chunk={chunk}. Use fewer tokens, a smaller "
        "prefill_chunk, or free the GPU."
    )
