"""The fused glue kernels against their torch references: RMSNorm with and without the
residual add before it, and SiLU-and-multiply, at the shapes the model feeds them (hidden,
low-rank and latent widths, one decode row and a prefill chunk's worth), in bf16 on the GPU
and fp32 under the interpreter."""

import pytest
import torch
import torch.nn.functional as F
from helpers import relative_error

from kernels.glue import rms_norm_fused, silu_mul_fused
from kernels.norm import rms_norm


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@pytest.mark.parametrize(("rows", "width"), [(1, 5120), (37, 512), (5, 1000)])
def test_rms_norm_matches_the_reference(rows, width, device):
    gen = torch.Generator().manual_seed(width)
    x = (torch.randn(rows, width, generator=gen) * 3).to(device, _dtype(device))
    weight = torch.rand(width, generator=gen).to(device, _dtype(device))
    out = rms_norm_fused(x, weight)
    assert out.dtype == x.dtype and out.shape == x.shape
    bound = 1e-2 if device.type == "cuda" else 1e-6
    assert relative_error(out, rms_norm(x, weight)) < bound


def test_the_residual_sum_is_stored_and_normalised_as_the_reference_rounds_it(device):
    gen = torch.Generator().manual_seed(3)
    x, attn = (torch.randn(2, 7, 640, generator=gen).to(device, _dtype(device)) for _ in "ab")
    weight = torch.rand(640, generator=gen).to(device, _dtype(device))
    summed, normed = rms_norm_fused(x, weight, residual=attn)
    assert torch.equal(summed, x + attn)  # one rounding of the sum, in x's dtype
    bound = 1e-2 if device.type == "cuda" else 1e-6
    assert normed.shape == x.shape and relative_error(normed, rms_norm(x + attn, weight)) < bound


def test_silu_mul_matches_the_reference_and_is_one_launch(device):
    gen = torch.Generator().manual_seed(4)
    gate_up = (torch.randn(9, 2 * 1152, generator=gen) * 4).to(device, _dtype(device))
    gate, up = gate_up.float().chunk(2, dim=-1)
    expected = (F.silu(gate) * up).to(gate_up.dtype)
    out = silu_mul_fused(gate_up)
    assert out.shape == (9, 1152) and out.dtype == gate_up.dtype
    assert relative_error(out, expected) < (1e-2 if device.type == "cuda" else 1e-6)


def test_bad_shapes_name_the_problem():
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match="does not match x's last dimension 64"):
        rms_norm_fused(x, torch.ones(32))
    with pytest.raises(ValueError, match="residual"):
        rms_norm_fused(x, torch.ones(64), residual=torch.randn(3, 32))
    with pytest.raises(ValueError, match="must be \\(M, 2I\\)"):
        silu_mul_fused(torch.randn(3, 5))
