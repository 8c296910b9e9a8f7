"""humming: humming-kernels' dense W8A16 GEMM (FP8 E4M3 weights, bf16 activations), the seed's
"Humming" backend, loaded the way a DeepSeek-style FP8 checkpoint loads into it.

The smallest path through its public API: a `humming.layer.HummingLayer` whose weight schema
is the checkpoint format `{"quant_method": "fp8", "weight_block_size": [128, 128]}` (bf16
activations by default), loaded with the workbench's E4M3 values as `weight` and its fp32
128x128 block scales as `weight_scale_inv`, then `transform()`. Humming itself converts that
to its group-scale form (each block scale repeated over the block's 128 rows and cast to bf16,
exact for the workbench's power-of-two scales) and repacks the weight, so the check compares it
with the same dequantised FP8 weights as the workbench's W8A16.

Two things differ from a plain call. humming sizes the block-scale parameter as floor(N/128)
rows, so a projection whose N is not a multiple of 128 (the fused `qkv_a`, N=1984) is
zero-padded to whole blocks and its output sliced back (`y[:, :N]`, a view). And its kernels
JIT-compile through NVRTC on first use (seconds per shape): `prepare` runs one call, which
compiles the kernels of every M range humming's heuristics pick for this shape.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.dense import DenseWeights
from workbench.peers.availability import jit_peer_available

VERSION = "0.1.19"
BLOCK = 128
INSTALL = (
    f"pip install humming-kernels=={VERSION} (the `peers` extra); on a box without a registry, "
    "python3 scripts/fetch_peer_wheels.py here and install .whl/ there (docs/peers.md)"
)


def available() -> tuple[bool, str]:
    """Whether humming-kernels imports and has a GPU to compile for (bf16 needs SM80+)."""
    return jit_peer_available(
        "humming-kernels", ("humming", "humming.layer"), INSTALL, 8, "humming's bf16 activations"
    )


def _forward(layer: torch.nn.Module, n: int, x: Tensor) -> Tensor:
    y = layer(x)
    return y if y.shape[1] == n else y[:, :n]


def prepare(weights: DenseWeights) -> Callable[[Tensor], Tensor]:
    """The peer's linear(x) for one weight: a transformed HummingLayer, its kernels compiled."""
    from humming.layer import HummingLayer

    if weights.fmt != "fp8" or weights.block != BLOCK:
        raise ValueError(
            f"humming takes FP8 weights in {BLOCK}x{BLOCK} blocks, got {weights.fmt} with "
            f"block {weights.block}; quantise with DenseWeights.quantize(w, 'fp8', {BLOCK})."
        )
    (n, k), device = weights.values.shape, weights.values.device
    rows = weights.scales.shape[0] * BLOCK  # whole blocks: humming's scales are floor(N/128)
    values = F.pad(weights.values.view(torch.uint8), (0, 0, 0, rows - n))
    layer = HummingLayer(
        shape_n=rows,
        shape_k=k,
        weight_config={"quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK]},
        torch_dtype=torch.bfloat16,
    ).to(device)
    layer.load_from_tensors(
        {"weight": values.view(torch.float8_e4m3fn), "weight_scale_inv": weights.scales}
    )
    layer.transform()
    linear = partial(_forward, layer, n)
    linear(torch.zeros(1, k, dtype=torch.bfloat16, device=device))  # JIT-compile now
    return linear
