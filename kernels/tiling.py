"""Checks shared by every tile configuration, MoE and dense: a bad block size should fail with
a message before Triton fails with a compiler error."""

from __future__ import annotations


def check_block_sizes(tiles: object) -> None:
    """block_m, block_n and block_k must be powers of two of at least 16 (tl.arange, tl.dot)."""
    for name in ("block_m", "block_n", "block_k"):
        size = getattr(tiles, name)
        if not isinstance(size, int) or size < 16 or size & (size - 1):
            raise ValueError(
                f"{name}={size!r} must be a power of two >= 16 (tl.arange and tl.dot need "
                "it), e.g. 16, 32, 64 or 128."
            )
