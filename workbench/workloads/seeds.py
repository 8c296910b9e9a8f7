"""One seed rule for every workload: a named stream per (seed, what, key...).

Each input of a problem (the expert weights, the routing of T tokens, the activations of T
tokens) draws from its own generator, seeded from the user's `seed` and a key naming the input.
So an input does not depend on what was drawn before it (the order variants run in, the token
counts a sweep visits), and the same `(seed, key)` gives bit-identical tensors in any tool.
"""

from __future__ import annotations

import hashlib

import torch

SEED_BITS = 63  # torch.Generator.manual_seed takes a non-negative int64


def derive(seed: int, *key: object) -> int:
    """A seed for the input named `key` under the user's `seed`: stable across processes,
    machines and Python versions (a hash of the text, not Python's salted `hash`)."""
    text = repr((int(seed), *key)).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


def generator(device: torch.device | str, seed: int, *key: object) -> torch.Generator:
    """A torch generator on `device` for the input named `key` (see `derive`)."""
    return torch.Generator(device=torch.device(device)).manual_seed(derive(seed, *key))


def randn(
    shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, seed: int, *key: object
) -> torch.Tensor:
    """Standard normal values for the input named `key`, drawn in fp32 and cast to `dtype`, so
    runs in different dtypes see the same values up to that rounding."""
    gen = generator(device, seed, *key)
    return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def serving_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU, as served; fp32 for the Triton interpreter's CPU stand-in."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32
