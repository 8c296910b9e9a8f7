"""Groups of projections (kernels.dense.grouped) under the interpreter, and on the GPU with
WORKBENCH_GPU_TESTS=1: each one-launch form computes what its members compute one by one, and
a group that cannot run as one launch is refused with the fix."""

import pytest
import torch
from helpers import relative_error

import kernels.dense as dense
from kernels.dense import DenseWeights
from kernels.dense.formats import stacked_stride

GROUPS, N, K = 3, 48, 96


def group_inputs(m, dtype=torch.float32, device="cpu", fmt="fp8", block=32):
    gen = torch.Generator().manual_seed(7)
    masters = [torch.randn(N, K, generator=gen) / K**0.5 for _ in range(GROUPS)]
    masters[1][0] *= 30.0  # an outlier row in one member: its own scales, not the others'
    x = torch.randn(m, GROUPS * K, generator=gen).to(dtype).to(device)
    group = DenseWeights.quantize_group([w.to(dtype).to(device) for w in masters], fmt, block)
    return x.view(m, GROUPS, K), group


def reference(x, group):
    return torch.cat([dense.linear_reference(x[:, g], w) for g, w in enumerate(group)], 1)


def test_quantize_group_stores_the_members_at_one_stride():
    _, group = group_inputs(2)
    assert stacked_stride([w.values for w in group]) == N * K
    assert stacked_stride([w.scales for w in group]) == group[0].scales.numel()
    alone = DenseWeights.quantize(group[1].dequantize(), "fp8", 32)
    assert torch.equal(alone.values.view(torch.uint8), group[1].values.view(torch.uint8))


@pytest.mark.parametrize("m", [1, 5, 40, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_w8a16_group_launch_computes_its_members(m, dtype, device):
    x, group = group_inputs(m, dtype, device)
    out = dense.linear_w8a16_group(x, group)
    assert out.shape == (m, GROUPS * N) and out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert relative_error(out, reference(x, group)) < tolerance
    members = dense.one_by_one(dense.linear_w8a16, x, group)
    assert relative_error(out, members) < tolerance


def test_split_k_groups_keep_their_own_partial_sums_and_counters(device):
    x, group = group_inputs(3, device=device)
    out = dense.linear_w8a16_group(x, group, split_k=3, block_k=32)
    assert relative_error(out, reference(x, group)) < 1e-5
    again = dense.linear_w8a16_group(x, group, split_k=3, block_k=32)
    assert torch.equal(out, again)  # every counter was left at zero for the next GEMM


@pytest.mark.parametrize("m", [2, 64])
def test_each_variants_group_form_matches_its_members(m, device):
    x, group = group_inputs(m, device=device)
    for variant in ("w8a16", "w8a8", "hybrid"):
        linear = dense.VARIANTS[variant]
        grouped = dense.group_linear(
            variant, linear, **({"hybrid_m": 16} if variant == "hybrid" else {})
        )
        reference_of = (
            dense.w8a8_reference
            if variant == "w8a8" or (variant == "hybrid" and m > 16)
            else dense.linear_reference
        )
        want = torch.cat([reference_of(x[:, g], w) for g, w in enumerate(group)], 1)
        # FP8 tensor-core MMAs on the GPU round the W8A8 products' partial sums (as in
        # test_dense_kernels' FP8_MMA_TOLERANCE); W8A16 and the interpreter do not.
        tolerance = 1e-3 if device.type == "cuda" and variant != "w8a16" else 1e-5
        assert relative_error(grouped(x, group), want) < tolerance, variant
    masters = torch.stack([w.dequantize() for w in group]).unbind()
    bf16 = dense.group_linear("bf16", dense.linear)(x, masters)
    assert relative_error(bf16, dense.one_by_one(dense.linear, x, masters)) < 1e-6


def test_a_variant_without_a_group_form_runs_members_one_by_one():
    calls = []

    def linear(x, w):
        calls.append(w)
        return x @ w.T

    x, group = group_inputs(2, fmt="bf16")
    masters = [w.values for w in group]
    out = dense.group_linear("some-peer", linear)(x, masters)
    assert len(calls) == GROUPS and out.shape == (2, GROUPS * N)


def test_groups_that_cannot_run_as_one_launch_name_the_fix():
    x, group = group_inputs(2)
    loose = [DenseWeights.quantize(w.dequantize(), "fp8", 32) for w in group]
    with pytest.raises(ValueError, match="quantize_group"):
        dense.linear_w8a16_group(x, loose)
    with pytest.raises(ValueError, match=r"\(M, G, K\)"):
        dense.linear_w8a16_group(x.flatten(1), group)
    with pytest.raises(ValueError, match="at least one"):
        dense.linear_w8a16_group(x, [])
    with pytest.raises(ValueError, match="torch.stack"):
        dense.group_linear("bf16", dense.linear)(x, [w.dequantize() for w in group])
    with pytest.raises(ValueError, match="one shape"):
        DenseWeights.quantize_group([torch.randn(8, 32), torch.randn(16, 32)])


def test_a_layer_runs_its_output_projection_group_as_one_call():
    from workbench.presets import get_preset, with_overrides
    from workbench.workloads.dense import Layer, activations

    shapes = with_overrides(get_preset("tiny"), o_groups=2).rank_shapes(tp=1)
    layer = Layer(shapes, 1, 32, torch.float32, torch.device("cpu"), 0)
    xs = activations(3, layer.input_widths, 0, torch.device("cpu"), torch.float32)
    single, grouped = [], []
    calls = layer.calls(
        lambda x, w: single.append((x.shape, w.out_features)),
        lambda x, ws: grouped.append((x.shape, len(ws))),
        xs,
        layer.fp8[0],
    )
    for call in calls:
        call()
    o_a = next(p for p in layer.projections if p.count > 1)
    assert grouped == [((3, o_a.count, o_a.k), o_a.count)]
    assert len(single) == len(layer.projections) - 1
    assert stacked_stride([w.values for w in layer.fp8[0]][2 : 2 + o_a.count]) == o_a.n * o_a.k
