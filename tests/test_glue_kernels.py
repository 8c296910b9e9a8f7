"""The fused glue kernels against their torch references: RMSNorm with and without the
residual add before it, SiLU-and-multiply, the router's top-k with its softmax and RoPE on a
layer's query and key heads, at the shapes the model feeds them (hidden, low-rank and latent
widths, one decode row and a prefill chunk's worth), in bf16 on the GPU and fp32 under the
interpreter."""

import pytest
import torch
import torch.nn.functional as F
from helpers import relative_error

from kernels.glue import rms_norm_fused, rope_fused, router_topk_fused, silu_mul_fused
from kernels.moe import router_topk
from kernels.norm import rms_norm
from kernels.rope import rope_, rope_heads_


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


@pytest.mark.parametrize(
    ("rows", "heads", "head", "idx", "rope_dim", "first"),
    [
        (1, (32, 64), 512, 128, 64, None),  # a decode row of dsv4-flash-tp2, positions on device
        (37, (3, 2), 32, 16, 8, 1000),  # odd head counts, a prefill chunk from position 1000
        (5, (4, 2), 32, 16, 8, None),
    ],
)
def test_rope_turns_every_heads_rotary_part_as_the_reference_does(
    rows, heads, head, idx, rope_dim, first, device
):
    gen = torch.Generator().manual_seed(rows + head)
    dtype = _dtype(device)
    q_all = torch.randn(rows, heads[0] * head + heads[1] * idx, generator=gen).to(device, dtype)
    kv = torch.randn(rows, head, generator=gen).to(device, dtype)
    wide = torch.randn(rows, idx + 40, generator=gen).to(device, dtype)
    index_k = wide[:, 20 : 20 + idx]  # a view inside a wider output, as the model's
    if first is None:
        positions = torch.randint(0, 50_000, (rows,), generator=gen).to(device)
        ref_positions = positions
    else:
        positions, ref_positions = first, torch.arange(first, first + rows, device=device)
    want_q, want_kv, want_wide = q_all.clone(), kv.clone(), wide.clone()
    q, iq = want_q.split([heads[0] * head, heads[1] * idx], 1)
    for x in (q.view(rows, heads[0], head), iq.view(rows, heads[1], idx), want_kv[:, None],
              want_wide[:, None, 20 : 20 + idx]):  # fmt: skip
        rope_(x, ref_positions, rope_dim)
    q_ref, kv_ref, wide_ref = q_all.clone(), kv.clone(), wide.clone()
    rope_heads_(q_ref, heads, kv_ref, wide_ref[:, 20 : 20 + idx], positions, rope_dim)
    for got, want in ((q_ref, want_q), (kv_ref, want_kv), (wide_ref, want_wide)):
        assert torch.equal(got, want)  # the reference with rope_fused's arguments
    rope_fused(q_all, heads, kv, index_k, positions, rope_dim)
    bound = 1e-2 if device.type == "cuda" else 1e-5
    for got, want in ((q_all, want_q), (kv, want_kv), (wide, want_wide)):
        assert relative_error(got, want) < bound
    # only the rotary part of each head moved; the columns around index_k are untouched
    heads_q = q_all[:, : heads[0] * head].view(rows, heads[0], head)
    assert torch.equal(
        heads_q[..., : head - rope_dim], q.view(rows, heads[0], head)[..., :-rope_dim]
    )
    assert torch.equal(wide[:, :20], want_wide[:, :20])
    assert torch.equal(wide[:, 20 + idx :], want_wide[:, 20 + idx :])


def test_rope_makes_a_query_key_product_depend_on_their_distance_only():
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 2, 64, generator=gen, dtype=torch.float64).float().unbind(1)

    def product(m: int, n: int) -> float:
        qm = rope_(q.clone()[:, None], torch.tensor([m]), 64)
        kn = rope_(k.clone()[:, None], torch.tensor([n]), 64)
        return float((qm * kn).sum())

    assert product(7, 3) == pytest.approx(product(1007, 1003), abs=1e-3)  # fp32 angles
    assert product(7, 3) != pytest.approx(product(7, 4), abs=1e-3)
    assert torch.equal(rope_(q.clone()[:, None], torch.tensor([0]), 64)[:, 0], q)  # at 0: as is


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
    q_all, kv, index_k = torch.randn(3, 2 * 32 + 16), torch.randn(3, 32), torch.randn(3, 16)
    with pytest.raises(ValueError, match="do not hold \\(2, 2\\) heads of T rows"):
        rope_fused(q_all, (2, 2), kv, index_k, 0, 8)
    for odd in (7, 12):  # HALF is a tile width: a power of two
        with pytest.raises(ValueError, match=f"rope_dim={odd} must be a power of two"):
            rope_fused(q_all, (2, 1), kv, index_k, 0, odd)
    with pytest.raises(ValueError, match="positions \\(2,\\) do not match the 3 rows"):
        rope_fused(q_all, (2, 1), kv, index_k, torch.zeros(2, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="unit stride"):
        rope_fused(q_all, (2, 1), kv.t().contiguous().t(), index_k, 0, 8)
