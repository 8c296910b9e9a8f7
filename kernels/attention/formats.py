"""How the indexer's keys are cached: bf16 rows, or FP8 rows with one scale per key."""

from typing import NamedTuple

import torch
from torch import Tensor


class QuantizedKeys(NamedTuple):
    """Indexer keys as the FP8 cache holds them (DeepSeek's serving format)."""

    values: Tensor  # (rows, d) float8_e4m3fn
    scales: Tensor  # (rows,) fp32 powers of two

    def dequantize(self) -> Tensor:
        """(rows, d) fp32: values times their key's scale."""
        return self.values.float() * self.scales[:, None]


def empty_keys(rows: int, dim: int, device: torch.device | str) -> QuantizedKeys:
    """An FP8 key cache of `rows` keys."""
    return QuantizedKeys(
        torch.empty(rows, dim, dtype=torch.float8_e4m3fn, device=device),
        torch.empty(rows, dtype=torch.float32, device=device),
    )


class NewTokens(NamedTuple):
    """A decode step's tokens, to be written into the caches by the kernel that first reads
    them (`indexer_scores_fp8(new=...)`): query q's latent row kv[q] and indexer key
    index_k[q] go to cache row rows[q], its own position."""

    kv_cache: Tensor  # (rows, D) the latent KV cache
    rows: Tensor  # (Q,) int cache rows
    kv: Tensor  # (Q, D)
    index_k: Tensor  # (Q, d) bf16 or fp32, quantised on the way in


SCORE_ROW_ALIGN = 16  # elements: rows start on 64-byte boundaries


def score_rows(num_q: int, length: int, device: torch.device | str) -> Tensor:
    """(num_q, length) fp32, uninitialised, each row starting SCORE_ROW_ALIGN elements after
    the last: Triton specialises a row stride divisible by 16, so the select's loads of a row
    can be 16-byte vectors whatever the context length (33,863 is odd)."""
    stride = -(-length // SCORE_ROW_ALIGN) * SCORE_ROW_ALIGN
    return torch.empty(num_q, stride, dtype=torch.float32, device=device)[:, :length]
