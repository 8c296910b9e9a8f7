"""Torch references of the dense GEMMs: the cuBLAS baseline and the fp32 products every FP8
kernel is checked against.

`linear` is the `bf16` variant itself (torch.matmul, i.e. cuBLAS on the GPU). The others define
the numbers: `linear_reference` is the fp32 product on the weights as a kernel sees them (so a
test sees kernel error only), and `quantize_activations_reference` is the W8A8 path's per-token,
per-K-block activation quantisation, whose dequantised values `w8a8_reference` multiplies.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.dense.formats import FP8_MAX, DenseWeights, pow2_scales


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """Return x @ weight.T for weight stored (out_features, in_features), as nn.Linear does."""
    return torch.matmul(x, weight.T)


def linear_reference(x: Tensor, weights: DenseWeights | Tensor) -> Tensor:
    """x @ W.T in fp32 on W as the kernels see it (dequantised FP8 values, or as stored)."""
    w = weights.dequantize() if isinstance(weights, DenseWeights) else weights
    return torch.matmul(x.float(), w.float().T)


def quantize_activations_reference(x: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """(values float8_e4m3fn (M, K), scales fp32 (M, cdiv(K, block))) of activations x.

    One power-of-two scale per token and K block (the weights' block edge), so a W8A8 MMA over
    one block applies one activation scale per row and one weight scale per column.
    """
    m, k = x.shape
    blocks = F.pad(x.float(), (0, -k % block)).unflatten(1, (-1, block))  # (M, KB, block)
    scales = pow2_scales(blocks.abs().amax(dim=-1))
    values = (blocks / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).flatten(1)[:, :k]
    return values.to(torch.float8_e4m3fn).contiguous(), scales.contiguous()


def w8a8_reference(x: Tensor, weights: DenseWeights) -> Tensor:
    """The fp32 product of quantised activations and quantised weights: W8A8's exact answer."""
    values, scales = quantize_activations_reference(x, weights.block)
    x_q = values.float() * scales.repeat_interleave(weights.block, dim=1)[:, : x.shape[1]]
    return torch.matmul(x_q, weights.dequantize().T)
