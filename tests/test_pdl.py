"""Programmatic dependent launch of the W8A16 GEMMs (kernels.pdl): off under the interpreter and
on CPUs, the option's checks, and on the GPU a chain of dependent GEMMs replayed in a CUDA
graph, each reading what the one before wrote, equal to the same chain launched without PDL."""

import inspect

import pytest
import torch

import kernels.dense as dense
from kernels import pdl
from kernels.dense import DenseWeights
from kernels.dense.tiles import GemmTiles
from kernels.dense.w8a16 import default_tiles as w8a16_tiles
from kernels.dense.w8a16_wgmma import gemm_w8a16_wgmma

TILES = GemmTiles(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3)


def test_pdl_is_off_under_the_interpreter_and_on_cpus(device):
    # conftest runs the CPU tests under TRITON_INTERPRET.
    assert not pdl.enabled(torch.device("cpu"))
    assert TILES.override(pdl=None).launch_pdl(torch.device("cpu")) is False
    assert TILES.override(pdl=False).launch_pdl(device) is False


def test_overriding_pdl_with_none_asks_for_it_where_available():
    # None is a value of pdl ("where the GPU has it"), not "leave the tiles' own", as it is
    # for the other options.
    assert TILES.override(pdl=None).pdl is None
    assert TILES.override(pdl=None, split_k=None).split_k is None
    assert TILES.override(pdl=True).override(split_k=2).pdl is True


def test_the_w8a16_gemms_hand_pdl_to_the_gluon_kernel_as_given(monkeypatch):
    """linear_w8a16 and its group form pass `pdl` to the Gluon kernel, off when not given, and
    still pick that kernel with it (pdl is not one of the Triton kernel's tile options)."""
    from kernels.dense import w8a16

    seen = []
    monkeypatch.setattr(w8a16, "_takes_wgmma", lambda x, w, wgmma, options: True)
    monkeypatch.setattr(w8a16, "gemm_w8a16_wgmma", lambda *a, pdl: seen.append(pdl))
    x = torch.zeros(64, 256, dtype=torch.bfloat16)
    weights = DenseWeights.quantize(torch.randn(128, 256), "fp8", 128)
    for given in ({}, {"pdl": False}, {"pdl": None}, {"pdl": True}):
        w8a16.linear_w8a16(x, weights, **given)
        w8a16.linear_w8a16_group(x[:, None], [weights], **given)
    assert seen == [False, False, False, False, None, None, True, True]


def test_the_gluon_w8a16_kernel_takes_pdl_beside_wgmma_true(device):
    """pdl with wgmma=True is not a Triton option the Gluon kernel would refuse: the call goes
    on to the kernel's own checks (on a CPU, that it needs an sm_90 GPU)."""
    if device.type == "cuda":
        pytest.skip("the CPU's refusal is what this checks")
    x = torch.zeros(64, 256, dtype=torch.bfloat16)
    weights = DenseWeights.quantize(torch.randn(128, 256), "fp8", 128)
    with pytest.raises(ValueError, match="needs an sm_90"):
        dense.linear_w8a16(x, weights, wgmma=True, pdl=False)


def test_asking_for_pdl_where_there_is_none_names_the_fix():
    with pytest.raises(ValueError, match="pdl=True needs a Hopper or newer GPU.*pdl=None"):
        TILES.override(pdl=True).launch_pdl(torch.device("cpu"))


def test_a_pdl_option_that_is_not_a_bool_is_refused():
    with pytest.raises(ValueError, match="pdl='yes' must be True, False or None"):
        TILES.override(pdl="yes").check()


@pytest.mark.parametrize(
    ("values", "aligned"), [((0, 5120, 1024 * 4096), True), ((0, 72), False), ((8, 128), False)]
)
def test_prefetch_needs_16_byte_aligned_rows(values, aligned):
    assert pdl.prefetchable(*values) is aligned


def _chain(x, weights, **options):
    for w in weights:
        x = dense.linear_w8a16(x, w, **options)
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 32, 64])
def test_dependent_gemms_with_pdl_read_what_the_one_before_wrote(m):
    # Square layers so each output is the next input; a CUDA graph keeps PDL's early launches.
    n = 2048
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [
        DenseWeights.quantize(torch.randn(n, n, device="cuda", generator=gen) / n**0.5, "fp8", 128)
        for _ in range(6)
    ]
    x = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
    _chain(x, weights, pdl=True)  # compiled, and the Gluon kernel's K-ordered copies made
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = _chain(x, weights, pdl=True)  # Triton's decode and middle tiles, then Gluon
    # new inputs each replay: a GEMM that read its input early would read the replay before's
    for _ in range(3):
        x.copy_(torch.randn(m, n, device="cuda", generator=gen))
        graph.replay()
        want = _chain(x, weights, pdl=False)
        if m < dense.w8a16.WGMMA_MIN_M:
            assert torch.equal(got, want)
        else:  # the Gluon kernel: its splits of K add in the order they arrive
            assert (got.float() - want.float()).norm() <= 1e-3 * want.float().norm()


def test_w8a8_refuses_pdl_rather_than_ignoring_it():
    x = torch.randn(4, 256)
    w = DenseWeights.quantize(torch.randn(128, 256), "fp8", 128)
    with pytest.raises(ValueError, match="pdl=True is a W8A16 option"):
        dense.linear_w8a8(x, w, pdl=True)


def test_pdl_is_opt_in_at_every_size():
    # It made the served decode step slower on the H200 (kernels.dense.w8a16's tiles), and so
    # did it on the Gluon kernel (kernels.dense.w8a16_wgmma).
    assert all(w8a16_tiles(m).pdl is False for m in (1, 16, 17, 4096))
    assert inspect.signature(gemm_w8a16_wgmma).parameters["pdl"].default is False
