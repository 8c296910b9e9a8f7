"""RMSNorm torch reference, the normalisation that sits in front of attention and the MoE."""

import torch
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """Normalise the last dimension by its root mean square, then scale by `weight`.

    Computed in fp32 because the mean of squares over thousands of bf16 values loses
    precision; the result is returned in x.dtype like a fused kernel would store it.
    """
    x32 = x.float()
    inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x32 * inv_rms * weight.float()).to(x.dtype)
