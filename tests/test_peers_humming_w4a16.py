"""The humming_w4a16 peer without humming's kernels: the workbench's INT4 read as humming's
weight schema (codes and scales unpacked by each side's documented rule and compared with a
plain quantiser), and `prepare` through a stand-in `humming.layer` that records what it is
handed and multiplies by the numbers humming's dequantisation would give. On the GPU box the
`gpu` test runs the real peer against the product on the INT4 it holds, and checks humming's
own dequantisation of the converted tensors against it."""

import sys
import types

import pytest
import torch
from helpers import HummingStandIn

from kernels.dense import DenseWeights
from kernels.dense.reference import linear_reference
from kernels.moe.formats import int4_codes
from workbench import peers
from workbench.peers import humming_w4a16
from workbench.workloads.checks import relative_error, tolerance


def _weights(n: int, k: int, seed: int = 0, device: str | torch.device = "cpu") -> DenseWeights:
    gen = torch.Generator().manual_seed(seed)
    master = (torch.randn(n, k, generator=gen) * k**-0.5).to(device)
    return DenseWeights.quantize(master, "fp8", 128)


def _humming_codes(words: torch.Tensor) -> torch.Tensor:
    """humming's packed weight (N, K/8) int32 as codes (N, K): code k at bits 4*(k % 8) of
    word k // 8 (pack_weight.cuh's common_pack_weight for 4 bits)."""
    unsigned = words.to(torch.int64) & 0xFFFFFFFF
    return ((unsigned[..., None] >> (4 * torch.arange(8))) & 15).flatten(-2)


def _plain_codes(packed: torch.Tensor) -> torch.Tensor:
    """The peer's packed INT4 (N, K/2) uint8 as codes (N, K): even k in the low nibble."""
    as_int = packed.to(torch.int64)
    return torch.stack((as_int & 15, as_int >> 4), dim=-1).flatten(-2)


def _plain_int4(w: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """q in [-7, 7] and bf16 scales, group by group in a loop: absmax / 7 rounded to bf16
    (1 for an all-zero group), q = round(w / scale)."""
    n, k = w.shape
    q = torch.empty(n, k, dtype=torch.int64)
    scales = torch.empty(n, k // group, dtype=torch.bfloat16)
    for row in range(n):
        for g in range(k // group):
            part = w[row, g * group : (g + 1) * group].float()
            absmax = part.abs().max()
            scale = (absmax / 7 if absmax > 0 else torch.tensor(1.0)).to(torch.bfloat16)
            scales[row, g] = scale
            q[row, g * group : (g + 1) * group] = (part / scale.float()).round().clamp(-7, 7)
    return q, scales


@pytest.mark.parametrize(("n", "k"), [(5, 256), (64, 384), (192, 128)])
def test_the_workbench_int4_is_humming_uint4_words_and_group_scales(n, k):
    weights = _weights(n, k, seed=n + k)
    w = weights.dequantize()
    w[0, :128] = 0  # an all-zero group: scale 1, every code the offset 8
    weights = DenseWeights("bf16", w)  # what the peer quantises: these values as they are
    packed, scales = humming_w4a16.int4_weights(weights)
    tensors = humming_w4a16.humming_tensors(packed, scales)
    assert set(tensors) == {"weight", "weight_scale"}
    weight, weight_scale = tensors["weight"], tensors["weight_scale"]
    # the shapes and dtypes HummingWeightSchema.get_tensors_attrs declares for uint4, group 128
    assert weight.dtype == torch.int32 and weight.shape == (n, k * 4 // 32)
    assert weight_scale.dtype == torch.bfloat16 and weight_scale.shape == (n, k // 128)
    assert weight.data_ptr() == packed.data_ptr()  # a view: no copy, no reordering
    codes = _humming_codes(weight)
    assert torch.equal(codes, _plain_codes(packed))
    assert int(codes.min()) >= 1 and int(codes.max()) <= 15  # humming's sign-magnitude recode
    q, plain_scales = _plain_int4(w)
    assert torch.equal(codes - 8, q)  # uint4 without a zero point: code - 8
    assert torch.equal(weight_scale, plain_scales)
    assert (codes[0, :128] == 8).all() and weight_scale[0, 0] == 1
    held = humming_w4a16.holds(weights)
    assert held.dtype == torch.float32 and held.shape == (n, k)
    assert torch.equal(held, q.float() * plain_scales.float().repeat_interleave(128, dim=1))


def test_the_peer_quantises_the_weight_it_is_handed_and_holds_that():
    fp8 = _weights(64, 256, seed=1)
    packed, scales = humming_w4a16.int4_weights(fp8)
    want_codes, want_scales = int4_codes(fp8.dequantize(), 128)
    assert torch.equal(_plain_codes(packed), want_codes) and torch.equal(scales, want_scales)
    held = humming_w4a16.holds(fp8)
    assert torch.equal(held, humming_w4a16.holds(fp8))  # the same numbers every time
    error = relative_error(held, fp8.dequantize())
    assert 2e-2 < error < 0.2  # INT4's rounding: why the check needs what the peer holds
    assert humming_w4a16.weight_bytes(fp8) == 64 * 128 + 64 * 2 * 2
    with pytest.raises(ValueError, match="K=200, not a multiple of 128"):
        humming_w4a16.int4_weights(DenseWeights.quantize(torch.randn(64, 200), "fp8", 128))


def test_the_registry_checks_it_as_w4a16_against_what_it_holds():
    peer = peers.PEERS["humming_w4a16"]
    assert peer.workloads == ("dense",) and peer.adapter("moe") is None
    assert peer.variant == "w4a16-group128" and peer.scheme == "w4a16"
    assert tolerance("dense", peer.scheme) == 1e-2
    assert peer.prepare is humming_w4a16.prepare and peer.holds is humming_w4a16.holds
    assert peer.weight_bytes is humming_w4a16.weight_bytes
    assert peer.available is peers.PEERS["humming"].available  # one install, one answer


class _StandInLayer(HummingStandIn):
    """Records what the adapter gives humming's HummingLayer and computes what it would: the
    product on (code - 8) times the group scales, read from the int32 words by humming's bit
    order (humming's numbers, not its kernels); it pads N itself, so the output is (M, N)."""

    made: list = []

    def __init__(self, shape_n, shape_k, weight_config, pad_n_to_multiple, torch_dtype):
        self._built((shape_n, shape_k, dict(weight_config), pad_n_to_multiple, torch_dtype))

    def __call__(self, x):
        self.calls.append(tuple(x.shape))
        codes = _humming_codes(self.tensors["weight"]).float() - 8
        scales = self.tensors["weight_scale"].float().repeat_interleave(128, dim=1)
        return (x.float() @ (codes * scales).T).to(torch.bfloat16)


@pytest.mark.parametrize("n", [64, 192])  # the indexer's N=64, and N not a multiple of 128
def test_prepare_loads_humming_schema_and_computes_the_int4_product(monkeypatch, n):
    module = types.ModuleType("humming.layer")
    module.HummingLayer = _StandInLayer
    monkeypatch.setitem(sys.modules, "humming", types.ModuleType("humming"))
    monkeypatch.setitem(sys.modules, "humming.layer", module)
    _StandInLayer.made.clear()
    weights = _weights(n, 384, seed=n)
    linear = humming_w4a16.prepare(weights)
    (layer,) = _StandInLayer.made
    config = {"quant_method": "humming", "b_dtype": "uint4", "bs_dtype": "bfloat16",
              "weight_scale_group_size": 128}  # fmt: skip
    assert layer.config == (n, 384, config, 128, torch.bfloat16)
    assert layer.transformed and layer.calls == [(1, 384)]  # the JIT warm-up, in prepare
    packed, scales = humming_w4a16.int4_weights(weights)
    assert torch.equal(layer.tensors["weight"], packed.view(torch.int32))
    assert torch.equal(layer.tensors["weight_scale"], scales)
    x = torch.randn(3, 384, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    y = linear(x)
    assert y.shape == (3, n) and y.dtype == torch.bfloat16
    assert relative_error(y, linear_reference(x, humming_w4a16.holds(weights))) < 1e-2
    assert relative_error(y, linear_reference(x, weights)) > 2e-2  # not the FP8 it was handed


@pytest.mark.gpu
def test_the_real_peer_computes_the_int4_product_it_holds():
    """humming-kernels on the GPU: its own dequantisation of the converted tensors is the INT4
    the peer holds, exactly, and the peer's output is the product on it within W4A16's bound,
    at N=192 and the indexer's N=64 (both padded to 128 rows inside humming), K=1280."""
    peer = peers.PEERS["humming_w4a16"]
    ok, why = peer.available()
    if not ok:
        pytest.skip(why)
    from humming.schema import BaseWeightSchema

    for n in (192, 64):
        weights = _weights(n, 1280, seed=n, device="cuda")
        held = peer.holds(weights)
        schema = BaseWeightSchema.from_config(dict(humming_w4a16.WEIGHT_CONFIG))
        tensors = humming_w4a16.humming_tensors(*humming_w4a16.int4_weights(weights))
        assert torch.equal(schema.dequant_tensors(tensors).float(), held), n
        linear = peer.prepare(weights)
        for m in (1, 20):
            x = torch.randn(m, 1280, generator=torch.Generator().manual_seed(m))
            x = x.to("cuda", torch.bfloat16)
            y = linear(x)
            assert y.shape == (m, n) and y.dtype == torch.bfloat16, (n, m)
            bound = tolerance("dense", peer.scheme)
            assert relative_error(y, linear_reference(x, held)) < bound, (n, m)
