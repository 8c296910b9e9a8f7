"""The peer adapters: the registry, what an absent peer says, and everything of cublas_fp8,
deepgemm and humming that runs without their GPU kernels (deepgemm's MoE layout by its slot
positions) (cuBLAS's scale layouts and padding checked by
emulating the GEMM it is given; humming's conversion through a stand-in module that records
what the adapter hands its public API). On the GPU box (WORKBENCH_GPU_TESTS=1, with the peers
installed: plans/peers.toml) the `gpu` test runs each real peer against its scheme's
exact product, and the quantiser tests run compiled."""

import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from helpers import HummingStandIn

from kernels.dense import DenseWeights
from kernels.dense.reference import (
    linear_reference,
    quantize_activations_reference,
    w8a8_reference,
)
from kernels.moe import MoeWeights, moe_reference
from workbench import peers
from workbench.errors import WorkbenchError
from workbench.peers import cublas_fp8, deepgemm, humming_kernels, placeholders
from workbench.workloads.checks import relative_error, tolerance

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU says")


def _weights(n: int, k: int, seed: int = 0, device: str | torch.device = "cpu") -> DenseWeights:
    gen = torch.Generator().manual_seed(seed)
    master = (torch.randn(n, k, generator=gen) * k**-0.5).to(device)
    return DenseWeights.quantize(master, "fp8", 128)


def test_registry_names_the_bench_rows_and_placeholders_never_run():
    assert peers.peer_names("dense") == [
        "cublas_fp8", "humming", "humming_w4a16", "deepgemm", "marlin",
    ]  # fmt: skip
    assert peers.peer_names("moe") == ["humming", "deepgemm", "marlin", "vllm_fused_moe"]
    for name in ("marlin", "vllm_fused_moe"):
        peer = peers.PEERS[name]
        ok, why = peer.available()
        assert not ok and "docs/peers.md" in why
        assert peer.adapter("dense") is None and peer.adapter("moe") is None
    for name in ("humming", "deepgemm"):  # real adapters for both workloads
        assert all(peers.PEERS[name].adapter(w) for w in ("dense", "moe"))
    with pytest.raises(WorkbenchError, match="unknown peers \\['cutlass'\\]"):
        peers.get_peers(["cutlass"], "dense")
    with pytest.raises(WorkbenchError, match="do not run the dense workload"):
        peers.get_peers(["vllm_fused_moe"], "dense")


def test_placeholders_say_what_is_missing(monkeypatch):
    monkeypatch.setattr(placeholders, "_installed", lambda module: False)
    assert placeholders.marlin()[1].startswith(
        "vllm is not installed: its compiled `_C` ops carry Marlin"
    )
    assert "`_moe_C`" in placeholders.vllm_fused_moe()[1] and "336 MB" in placeholders.VLLM_SIZE
    monkeypatch.setattr(placeholders, "_installed", lambda module: module == "vllm")
    assert placeholders.marlin() == (
        False,
        "vllm is importable but the workbench has no adapter for it yet; see docs/peers.md",
    )


@cpu_only
def test_gpu_peers_are_unavailable_on_a_cpu_with_the_reason():
    ok, why = cublas_fp8.available()
    assert not ok and why == "no CUDA GPU: cuBLAS's blockwise FP8 GEMM runs on SM90 (Hopper) only"
    ok, why = humming_kernels.available()
    assert not ok
    assert ("humming-kernels is not installed" in why and "fetch_peer_wheels.py" in why) or (
        why.startswith("no CUDA GPU")
    )
    ok, why = deepgemm.available()
    assert not ok
    assert ("DeepGEMM is not installed" in why and "vllm/third_party/deep_gemm" in why) or (
        why.startswith("no CUDA GPU")
    )


def test_deepgemm_takes_only_deepseek_blocks():
    with pytest.raises(ValueError, match="128x128 blocks, got fp8 with block 32"):
        deepgemm.prepare(DenseWeights.quantize(torch.randn(64, 256), "fp8", 32))
    w = torch.randn(4, 256, 128), torch.randn(4, 128, 128)
    with pytest.raises(ValueError, match="MoeWeights.quantize\\(w_gate_up, w_down, 'fp8', 128\\)"):
        deepgemm.prepare_moe(MoeWeights.quantize(*w, "int4", 128))


def test_deepgemm_slot_positions_lay_experts_out_padded_without_a_sync():
    """Each slot's row in the per-expert layout: sorted by expert, in token order within an
    expert, each expert's run starting at a multiple of the alignment."""
    ids = torch.tensor([[3, 0], [0, 2], [3, 1], [0, 3]])
    order, rank, start = deepgemm.slot_positions(ids, experts=5, align=4)
    flat = ids.reshape(-1)
    assert flat[order].tolist() == [0, 0, 0, 1, 2, 3, 3, 3]
    assert (order // 2).tolist() == [0, 1, 3, 2, 1, 0, 2, 3]  # tokens, in order per expert
    assert rank.tolist() == [0, 1, 2, 0, 0, 0, 1, 2]
    assert start.tolist() == [0, 4, 8, 12, 16]  # expert 4 has none: a zero-length run
    position = start[flat[order]] + rank
    assert len(set(position.tolist())) == flat.numel()  # no two slots share a row


def test_a_torch_without_the_blockwise_api_is_named(monkeypatch):
    monkeypatch.delattr(F, "scaled_mm")
    ok, why = cublas_fp8.available()
    assert not ok and why.startswith(f"torch {torch.__version__} has no ")
    with pytest.raises(WorkbenchError, match=re.escape(f"torch {torch.__version__} has no ")):
        cublas_fp8.prepare(_weights(64, 256))


@cpu_only
def test_cublas_fp8_refusal_names_the_torch_version():
    """On the CPU torch refuses blockwise scaling: prepare's probe call says so, with the
    version, rather than a bare error inside a timed call."""
    version = re.escape(f"torch {torch.__version__} ")
    with pytest.raises(WorkbenchError, match=version + ".*cannot run cuBLAS"):
        cublas_fp8.prepare(_weights(64, 256))
    with pytest.raises(ValueError, match="128x128 blocks"):
        cublas_fp8.prepare(DenseWeights.quantize(torch.randn(64, 256), "fp8", 32))


def test_rows_are_padded_to_at_least_16_and_a_multiple_of_4():
    assert [cublas_fp8.padded_rows(m) for m in (1, 6, 15, 16, 17, 944, 4096)] == [
        16, 16, 16, 16, 20, 944, 4096,
    ]  # fmt: skip


def test_activation_scales_are_outer_dim_major_and_match_the_reference(device):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(6, 384, generator=gen) * torch.logspace(-2, 2, 384)).to(device)
    values, scale_a = cublas_fp8.quantize(x)
    assert values.shape == (16, 384) and scale_a.shape == (16, 3)
    assert scale_a.stride() == (1, 16)  # what cuBLAS's 1x128 scaling reads
    ref_values, ref_scales = quantize_activations_reference(x, 128)
    assert torch.equal(values[:6].float(), ref_values.float())
    assert torch.equal(scale_a[:6], ref_scales)
    assert (values[6:].float() == 0).all() and (scale_a[6:] == 1).all()  # padded rows


def test_weight_scales_pad_k_blocks_to_a_multiple_of_4():
    weights = _weights(320, 1280)  # 3 x 10 blocks: K blocks padded to 12
    scale_b = cublas_fp8.weight_scales(weights.scales)
    assert scale_b.shape == (12, 3) and scale_b.stride() == (1, 12)
    assert torch.equal(scale_b[:10], weights.scales.t()) and (scale_b[10:] == 0).all()


def _emulated_scaled_mm(q, scale_a, w_values, scale_b, block=128):
    """What cuBLAS computes with 1x128 x 128x128 scales: per K block, the FP8 product scaled
    by scale_a[m, kb] and scale_b[kb, n // 128], read through the strides given."""
    m, k = q.shape
    n = w_values.shape[0]
    y = torch.zeros(m, n, device=q.device)
    for kb in range(-(-k // block)):
        cols = slice(kb * block, (kb + 1) * block)
        part = q[:, cols].float() @ w_values[:, cols].float().T
        col_scale = scale_b[kb].repeat_interleave(block)[:n]
        y += part * scale_a[:, kb : kb + 1] * col_scale[None, :]
    return y


def test_the_gemm_cublas_is_given_computes_w8a8(device):
    """The operands cublas_fp8 hands cuBLAS, multiplied as cuBLAS's blockwise mode defines,
    give the W8A8 product of the same quantised activations and weights."""
    weights = _weights(192, 1280, seed=3, device=device)  # N not of 128, K blocks not of 4
    x = torch.randn(5, 1280, generator=torch.Generator().manual_seed(4)).to(device)
    q, scale_a = cublas_fp8.quantize(x)
    y = _emulated_scaled_mm(q, scale_a, weights.values, cublas_fp8.weight_scales(weights.scales))
    x_q = quantize_activations_reference(x, 128)
    x_deq = x_q[0].float() * x_q[1].repeat_interleave(128, dim=1)
    assert relative_error(y[:5], linear_reference(x_deq, weights)) < 1e-6
    assert relative_error(y[:5], linear_reference(x, weights)) < 5e-2  # W8A8's bound


class _StandInLayer(HummingStandIn):
    """Records what the adapter gives humming's HummingLayer and computes what it would: the
    product on the FP8 values times their block scales (humming's numbers, not its kernels)."""

    made: list = []

    def __init__(self, shape_n, shape_k, weight_config, torch_dtype):
        self._built((shape_n, shape_k, weight_config, torch_dtype))

    def __call__(self, x):
        self.calls.append(tuple(x.shape))
        scales = self.tensors["weight_scale_inv"].repeat_interleave(128, 0)
        weight = self.tensors["weight"].float() * scales.repeat_interleave(128, 1)
        return (x.float() @ weight.T).to(torch.bfloat16)


def test_humming_gets_the_checkpoint_format_padded_to_whole_blocks(monkeypatch):
    module = types.ModuleType("humming.layer")
    module.HummingLayer = _StandInLayer
    monkeypatch.setitem(sys.modules, "humming", types.ModuleType("humming"))
    monkeypatch.setitem(sys.modules, "humming.layer", module)
    _StandInLayer.made.clear()
    weights = _weights(64, 256, seed=5)  # the indexer's N=64: half a block
    linear = humming_kernels.prepare(weights)
    (layer,) = _StandInLayer.made
    assert layer.config == (
        128,
        256,
        {"quant_method": "fp8", "weight_block_size": [128, 128]},
        torch.bfloat16,
    )
    assert layer.transformed and layer.calls == [(1, 256)]  # the JIT warm-up, in prepare
    loaded = layer.tensors["weight"]
    assert loaded.dtype == torch.float8_e4m3fn and loaded.shape == (128, 256)
    assert torch.equal(loaded[:64].float(), weights.values.float())
    assert (loaded[64:].float() == 0).all()
    assert layer.tensors["weight_scale_inv"] is weights.scales
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    y = linear(x)
    assert y.shape == (3, 64)
    assert relative_error(y, linear_reference(x, weights)) < 1e-2  # W8A16's bound


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cublas_fp8", "humming", "deepgemm"])
def test_a_gpu_peer_computes_its_scheme(name):
    """Each real peer, where it can run, against the exact product of its scheme: W8A8 on the
    same quantised activations for cublas_fp8, the dequantised weights for humming; N=64 is
    the indexer's half block, M=1 and M=20 go through cuBLAS's row padding."""
    peer = peers.PEERS[name]
    ok, why = peer.available()
    if not ok:
        pytest.skip(why)
    for n, m in ((192, 1), (64, 20)):
        weights = _weights(n, 1280, seed=n, device="cuda")
        x = torch.randn(m, 1280, generator=torch.Generator().manual_seed(m))
        x = x.to("cuda", torch.bfloat16)
        y = peer.prepare(weights)(x)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        exact = w8a8_reference if peer.scheme == "w8a8" else linear_reference
        assert relative_error(y, exact(x, weights)) < 1e-2, (n, m)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["humming", "deepgemm"])
@pytest.mark.parametrize("tokens", [5, 80])  # deepgemm: the masked form, the contiguous one
def test_a_gpu_moe_peer_computes_the_routed_experts(name, tokens):
    """Each real MoE peer, where it can run, against the fp32 reference on the FP8 experts it
    holds, at W8A8's bound for deepgemm (its activations are quantised) and FP8's for humming."""
    peer = peers.PEERS[name]
    ok, why = peer.available()
    if not ok:
        pytest.skip(why)
    gen = torch.Generator().manual_seed(tokens)
    experts, hidden, inter, top_k = 8, 512, 256, 2
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    weights = MoeWeights.quantize(gate_up.cuda(), down.cuda(), "fp8", 128)
    x = torch.randn(tokens, hidden, generator=gen).to("cuda", torch.bfloat16)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    ids = ids.to("cuda", torch.int32)
    route = torch.softmax(torch.randn(tokens, top_k, generator=gen), -1).cuda()
    y = peer.prepare_moe(weights)(x, ids, route)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    bound = tolerance("moe", peer.scheme)  # 8e-2 when x and h are quantised too, else 2e-2
    assert relative_error(y, moe_reference(x, ids, route, weights)) < bound
