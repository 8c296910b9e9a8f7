"""Weight formats: quantiser round trips, the packed layouts kernels rely on, and validation."""

import pytest
import torch

from kernels.dense.formats import quantize_fp8 as dense_quantize_fp8
from kernels.moe.formats import (
    FORMATS,
    MoeWeights,
    as_moe_weights,
    dequantize_fp8,
    dequantize_int4,
    int4_codes,
    int4_values,
    pack_int4,
    quantize_fp8,
    quantize_int4,
    unpack_int4,
)


def weights(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=gen)
    w[..., 0, :] *= 50  # one outlier row: block scales must keep the other rows accurate
    return w.to(torch.bfloat16)


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("shape", [(3, 80, 72), (2, 256, 256)])
def test_fp8_round_trip_is_within_e4m3_rounding(shape, block):
    w = weights(*shape)
    values, scales = quantize_fp8(w, block)
    assert values.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32
    assert scales.shape == (shape[0], -(-shape[1] // block), -(-shape[2] // block))
    back = dequantize_fp8(values, scales, block)
    scale_of = scales.repeat_interleave(block, 1).repeat_interleave(block, 2)
    scale_of = scale_of[:, : shape[1], : shape[2]]
    # E4M3 keeps 3 mantissa bits: half a step is 2^-4 relative; subnormals step 2^-9 * scale.
    bound = w.float().abs() * 2**-4 + scale_of * 2**-10
    assert ((back - w.float()).abs() <= bound * (1 + 1e-6)).all()
    assert (back - w.float()).norm() / w.float().norm() < 0.05


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("shape", [(3, 80, 72), (2, 16, 129)])  # K pads to whole 16-value runs
def test_int4_round_trip_is_within_half_a_step(shape, group):
    w = weights(*shape)
    packed, scales = quantize_int4(w, group)
    assert packed.dtype == torch.uint8 and packed.shape == (*shape[:2], 8 * -(-shape[2] // 16))
    assert scales.dtype == torch.bfloat16 and scales.shape == (*shape[:2], -(-shape[2] // group))
    back = dequantize_int4(packed, scales, shape[2], group)
    step = scales.float().repeat_interleave(group, -1)[..., : shape[2]]
    assert ((back - w.float()).abs() <= step * 0.5 * (1 + 2**-6)).all()


def test_int4_packing_pairs_each_value_with_the_one_8_further_in_its_run():
    w = torch.arange(-7.0, 8.0).repeat(2)[:20].reshape(1, 1, 20)  # absmax 7 -> scale 1, q == w
    packed, scales = quantize_int4(w, 32)
    assert scales.flatten().tolist() == [1.0]
    code = [int(q) + 8 for q in w.flatten().tolist()] + [8] * 12  # K pads to 32 with q = 0
    runs = [code[:16], code[16:]]
    want = [run[i] | run[i + 8] << 4 for run in runs for i in range(8)]
    assert packed.flatten().tolist() == want
    assert torch.equal(unpack_int4(packed)[..., :20], torch.tensor(code[:20]).view(1, 1, 20))


def test_int4_codes_pack_and_unpack_losslessly():
    codes, scales = int4_codes(weights(2, 8, 100), 32)
    assert codes.shape == (2, 8, 112) and int(codes.min()) >= 1 and int(codes.max()) <= 15
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)
    exact = int4_values(codes, scales, 100, 32)
    per_k = scales.float().repeat_interleave(32, -1)[..., :100]
    assert exact.dtype == torch.float32 and torch.equal(exact, (codes[..., :100] - 8.0) * per_k)
    assert torch.equal(dequantize_int4(pack_int4(codes), scales, 100, 32), exact)


def test_zero_blocks_get_unit_scales():
    _, fp8_scales = quantize_fp8(torch.zeros(1, 16, 16), 16)
    _, int4_scales = quantize_int4(torch.zeros(1, 1, 16), 16)
    assert fp8_scales.tolist() == [[[1.0]]] and int4_scales.float().tolist() == [[[1.0]]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_moe_weights_dequantize_to_the_quantised_values(fmt):
    gate_up, down = weights(4, 80, 72), weights(4, 72, 40, seed=1)
    moe = MoeWeights.quantize(gate_up, down, fmt, block=32)
    assert (moe.hidden, moe.inter) == (72, 40)
    deq_gate_up, deq_down = moe.dequantize()
    assert deq_gate_up.shape == gate_up.shape and deq_down.shape == down.shape
    if fmt == "bf16":
        assert deq_gate_up is gate_up and deq_down is down
    else:
        error = (deq_gate_up - gate_up.float()).norm() / gate_up.float().norm()
        assert 0 < error < (0.05 if fmt == "fp8" else 0.2)


def test_as_moe_weights_accepts_every_documented_form():
    gate_up, down = weights(2, 32, 16), weights(2, 16, 16)
    for form in (as_moe_weights(gate_up, down), as_moe_weights((gate_up, down))):
        assert form.fmt == "bf16" and form.gate_up is gate_up and form.down is down
    moe = MoeWeights("bf16", gate_up, down)
    assert as_moe_weights(moe) is moe
    with pytest.raises(ValueError, match="not with MoeWeights"):
        as_moe_weights(moe, down)
    with pytest.raises(ValueError, match="weights must be MoeWeights"):
        as_moe_weights(gate_up)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda g, d: MoeWeights.quantize(g, d, "int8"), "unknown weight format 'int8'"),
        (lambda g, d: MoeWeights("nf4", g, d), "use one of bf16, fp8, int4"),
        (lambda g, d: MoeWeights.quantize(g, d, "fp8", block=96), "block=96 must be a power"),
        (lambda g, d: quantize_int4(g, 8), "group=8 must be a power of two >= 16"),
        (lambda g, d: MoeWeights.quantize(g, d, "int4", block=16), "quantise with block >= 32"),
        (lambda g, d: MoeWeights("fp8", g, d), "must be torch.float8_e4m3fn"),
        (lambda g, d: MoeWeights("bf16", g, d, gate_up_scale=g), "take no scales"),
        (lambda g, d: MoeWeights("bf16", g[0], d), "must be 3-D"),
        (
            lambda g, d: MoeWeights("int4", g.to(torch.uint8), d.to(torch.uint8)),
            "need 3-D gate_up_scale",
        ),
    ],
)
def test_bad_formats_are_rejected(build, message):
    with pytest.raises(ValueError, match=message):
        build(weights(2, 32, 16), weights(2, 16, 16))


@pytest.mark.parametrize("quantize", [quantize_fp8, dense_quantize_fp8])
def test_fp8_blocks_too_large_for_the_folded_scale_are_refused(quantize):
    """The W8A16 kernels fold 2**120 into each block scale (kernels.dequant): a scale above
    2**7 would overflow fp32, so the quantisers refuse it and say how to fix it."""
    w = torch.ones(128, 128)
    quantize(w * 448 * 2**7)  # the largest block absmax that still fits
    with pytest.raises(ValueError, match="above 128 .* Scale the weights down"):
        quantize(w * 448 * 2**8)
