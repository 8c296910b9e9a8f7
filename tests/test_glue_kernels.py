"""The fused glue kernels against their torch references: RMSNorm with and without the
residual add before it, SiLU-and-multiply and the router's top-k with its softmax, at the
shapes the model feeds them (hidden, low-rank and latent widths, one decode row and a prefill
chunk's worth), in bf16 on the GPU and fp32 under the interpreter."""

import pytest
import torch
import torch.nn.functional as F
from helpers import relative_error

from kernels.glue import rms_norm_fused, router_topk_fused, silu_mul_fused
from kernels.moe import router_topk
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


@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 384, 6), (33, 384, 6), (4, 16, 4)])
def test_router_topk_picks_the_references_experts_and_weights(tokens, experts, top_k, device):
    gen = torch.Generator().manual_seed(experts + tokens)
    # Distinct logits (k/64 for integers k, exact in bf16): torch.topk orders ties its own way.
    order = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])
    logits = ((order - experts // 2) / 64).to(device, _dtype(device))
    ids, weights = router_topk_fused(logits, top_k)
    want_ids, want_weights = router_topk(logits, top_k)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids, want_ids)  # best first, as torch.topk orders them
    assert torch.allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
    assert torch.allclose(weights.sum(1), torch.ones(tokens, device=device))


def test_router_topk_breaks_ties_by_the_lower_expert_id(device):
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0]], device=device)
    ids, weights = router_topk_fused(logits, 3)
    assert ids.tolist() == [[1, 3, 4]]
    assert torch.allclose(weights, torch.full((1, 3), 1 / 3, device=device))


def test_bad_shapes_name_the_problem():
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match="does not match x's last dimension 64"):
        rms_norm_fused(x, torch.ones(32))
    with pytest.raises(ValueError, match="residual"):
        rms_norm_fused(x, torch.ones(64), residual=torch.randn(3, 32))
    with pytest.raises(ValueError, match="must be \\(M, 2I\\)"):
        silu_mul_fused(torch.randn(3, 5))
    with pytest.raises(ValueError, match="1 <= top_k <= E"):
        router_topk_fused(torch.randn(3, 8), 9)
