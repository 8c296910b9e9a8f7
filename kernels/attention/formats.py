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
