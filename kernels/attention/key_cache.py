"""The FP8 key cache the indexer reads, as DeepSeek serves it: keys quantised once, when a
token is written, to E4M3 with one power-of-two scale a key, stored beside the token's latent
KV row (`write_cache`: one launch a layer and step). `quantized_key` and `cache_token` are the
same steps for kernels that write the caches themselves (the FP8 indexer's decode form writes
the step's own token)."""

import triton
import triton.language as tl
from torch import Tensor

from kernels.attention.formats import QuantizedKeys
from kernels.compiled import launch
from kernels.fp8_quant import pow2_scale, quantize_activations, round_to_e4m3


def quantize_keys(keys: Tensor) -> QuantizedKeys:
    """Per-key FP8 quantisation of (L, d) keys, as `write_cache` stores them."""
    values, scales = quantize_activations(keys, keys.shape[1])
    return QuantizedKeys(values, scales[:, 0].contiguous())


@triton.jit
def quantized_key(key_ptr, DIM: tl.constexpr, DIM_P: tl.constexpr):
    """(FP8 key, its power-of-two scale) of the DIM values at key_ptr, as the cache holds
    keys."""
    d = tl.arange(0, DIM_P)
    key = tl.load(key_ptr + d, mask=d < DIM, other=0.0).to(tl.float32)
    scale, inverse = pow2_scale(tl.max(tl.abs(key), axis=0))
    return round_to_e4m3(key * inverse).to(tl.float8e4nv), scale


@triton.jit
def cache_token(row, k8, scale, latent_ptr, kv_cache_ptr, k8_ptr, ks_ptr, stride_kv_cache,
                stride_k8, DIM: tl.constexpr, DIM_P: tl.constexpr, KV_DIM: tl.constexpr,
                KV_P: tl.constexpr):  # fmt: skip
    """Store a token's quantised key and its latent row (at latent_ptr) at cache `row`."""
    d = tl.arange(0, DIM_P)
    tl.store(k8_ptr + row * stride_k8 + d, k8, mask=d < DIM)
    tl.store(ks_ptr + row, scale)
    c = tl.arange(0, KV_P)
    latent = tl.load(latent_ptr + c, mask=c < KV_DIM)
    tl.store(kv_cache_ptr + row * stride_kv_cache + c, latent, mask=c < KV_DIM)


@triton.jit
def _write_cache_kernel(
    kv_ptr, key_ptr, rows_ptr, first_row, kv_cache_ptr, k8_ptr, ks_ptr,
    stride_kv, stride_key, stride_kv_cache, stride_k8,
    KV_DIM: tl.constexpr, KV_P: tl.constexpr, DIM: tl.constexpr, DIM_P: tl.constexpr,
    ROWS_GIVEN: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + token).to(tl.int64) if ROWS_GIVEN else first_row + token
    k8, scale = quantized_key(key_ptr + token * stride_key, DIM, DIM_P)
    cache_token(row, k8, scale, kv_ptr + token * stride_kv, kv_cache_ptr, k8_ptr, ks_ptr,
                stride_kv_cache, stride_k8, DIM, DIM_P, KV_DIM, KV_P)  # fmt: skip


def write_cache(
    kv_cache: Tensor, keys: QuantizedKeys, rows: int | Tensor, kv: Tensor, index_k: Tensor
) -> None:
    """Store T tokens' latent rows and FP8-quantised indexer keys at cache `rows`: a first
    row (contiguous rows from there) or a (T,) tensor of rows. One launch."""
    tokens = kv.shape[0]
    if index_k.shape[0] != tokens or kv.shape[1] != kv_cache.shape[1]:
        raise ValueError(
            f"write_cache expects kv (T, {kv_cache.shape[1]}) and index_k (T, d); got "
            f"{tuple(kv.shape)} and {tuple(index_k.shape)}"
        )
    if kv.stride(1) != 1 or index_k.stride(1) != 1 or kv_cache.stride(1) != 1:
        raise ValueError("write_cache needs rows contiguous along the last dim.")
    given = isinstance(rows, Tensor)
    launch(
        _write_cache_kernel, (tokens,), kv, index_k, rows if given else kv, 0 if given else rows,
        kv_cache, keys.values, keys.scales, kv.stride(0), index_k.stride(0), kv_cache.stride(0),
        keys.values.stride(0), KV_DIM=kv.shape[1], KV_P=triton.next_power_of_2(kv.shape[1]),
        DIM=index_k.shape[1], DIM_P=triton.next_power_of_2(index_k.shape[1]), ROWS_GIVEN=given,
    )  # fmt: skip
