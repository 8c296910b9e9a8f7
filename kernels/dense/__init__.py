"""Dense projections; VARIANTS maps a variant name to a `linear(x, weight)` callable."""

from collections.abc import Callable

from kernels.dense.reference import linear

VARIANTS: dict[str, Callable] = {"bf16": linear}

__all__ = ["VARIANTS", "linear"]
