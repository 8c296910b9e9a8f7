"""The W8A8 MoE path (FP8 activations times FP8 experts) against its torch reference, which
quantises x and silu(gate) * up the way the kernels do, and against the bf16-activation
reference within W8A8's bound; at ragged routings (an expert without rows, one expert taking
every row, one token) and two row-tile heights, and its refusals."""

import pytest
import torch
from helpers import expert_problem, relative_error

from kernels.moe import (
    VARIANTS,
    W8A8_VARIANTS,
    MoeWeights,
    moe_flat,
    moe_flat_w8a8,
    moe_reference,
    moe_w8a8,
    trusted_routing,
)
from kernels.moe.reference import moe_w8a8_reference
from kernels.moe.w8a8_wgmma import down_wgmma
from workbench.workloads.checks import tolerance

EXPERTS, TOP_K, HIDDEN, INTER = 6, 2, 256, 256  # two 128-wide blocks of H and of I


def problem(ids: torch.Tensor, device, seed=0):
    """(x bf16, ids, routing weights, FP8 experts in 128x128 blocks) for topk_ids `ids`."""
    x, route, gate_up, down = expert_problem(ids, EXPERTS, HIDDEN, INTER, seed)
    weights = MoeWeights.quantize(gate_up, down, "fp8")
    moved = MoeWeights("fp8", *(t.to(device) for t in (weights.gate_up, weights.down,
                       weights.gate_up_scale, weights.down_scale)))  # fmt: skip
    return x.to(device), ids.to(torch.int32).to(device), route.to(device), moved


ROUTINGS = {
    "uniform": torch.stack(
        [
            torch.randperm(EXPERTS, generator=torch.Generator().manual_seed(t))[:TOP_K]
            for t in range(37)
        ]
    ),  # fmt: skip
    "empty-experts": torch.tensor([[0, 2], [5, 0], [2, 5], [0, 5], [5, 2]]),  # 1, 3, 4: none
    "one-expert": torch.tensor([[4, 4]] * 40),  # 80 rows: several tiles, one partly filled
    "one-token": torch.tensor([[3, 1]]),
    # 150 rows of experts 0 and 1 (128 + 22: the second tile's last 64 rows hold none), 20 of
    # 2 and 3: the Gluon kernels' warpgroups see items of both kinds
    "two-tiles": torch.tensor([[0, 1]] * 150 + [[2, 3]] * 20),
    # 64 rows of experts 0 and 1 (warpgroup 1 passes over the tile), 65 of 2 and 3 (it holds
    # one row)
    "half-tile-edge": torch.tensor([[0, 1]] * 64 + [[2, 3]] * 65),
}


@pytest.mark.parametrize("case", list(ROUTINGS))
@pytest.mark.parametrize("block_m", [16, 64])
def test_w8a8_moe_matches_its_reference(case, block_m, device):
    x, ids, route, weights = problem(ROUTINGS[case], device)
    out = moe_w8a8(x, ids, route, weights, block_m=block_m, num_warps=4)
    assert out.dtype == x.dtype and out.shape == x.shape
    assert relative_error(out, moe_w8a8_reference(x, ids, route, weights)) < 1e-2
    # against bf16 activations: E4M3's rounding of x and of h, inside the bench's W8A8 bound
    error = relative_error(out, moe_reference(x, ids, route, weights))
    assert 1e-2 < error < tolerance("moe", "w8a8")


def test_w8a8_is_a_variant_that_takes_fp8_experts_only(device):
    assert VARIANTS["w8a8"] is moe_w8a8 and set(W8A8_VARIANTS) == {"w8a8", "flat_w8a8"}
    x, ids, route, weights = problem(ROUTINGS["one-token"], device)
    bf16 = (weights.gate_up.to(x.dtype), weights.down.to(x.dtype))
    with pytest.raises(ValueError, match="FP8 experts in 128x128 blocks; got bf16"):
        moe_w8a8(x, ids, route, bf16)
    gate_up, down = weights.dequantize()
    with pytest.raises(ValueError, match="in blocks of 64"):
        moe_w8a8(x, ids, route, MoeWeights.quantize(gate_up, down, "fp8", 64))
    odd = MoeWeights.quantize(gate_up[:, :, :192], down[:, :192], "fp8")
    with pytest.raises(ValueError, match="H=192, I=256"):
        moe_w8a8(x[:, :192], ids, route, odd)
    with pytest.raises(ValueError, match="block_m=48"):
        moe_w8a8(x, ids, route, weights, block_m=48)


@pytest.mark.gpu
def test_w8a8_moe_at_the_preset_shape_matches_its_reference():
    # dsv4-flash-tp2 per rank: H 4096, I 1024 (TP2), 6 of 384 experts; a prefill piece
    from kernels.moe import last_facts
    from workbench.presets import get_preset
    from workbench.workloads.moe import expert_masters, moe_problem

    s = get_preset("dsv4-flash-tp2").rank_shapes()
    base = expert_masters(s, 0, torch.device("cuda"), torch.bfloat16)
    weights = MoeWeights.quantize(*base, "fp8")
    p = moe_problem(s, 512, "uniform", 0, torch.device("cuda"), torch.bfloat16)
    out = moe_w8a8(*p.args(), weights)
    # gate/up's default 128 x 128 tiles spill 6 bytes on the H200 (Triton 3.6): no more
    assert all(f.n_spills <= 8 for f in last_facts().values()), last_facts()
    assert relative_error(out, moe_w8a8_reference(*p.args(), weights)) < 1e-2


def test_flat_w8a8_runs_w8a8_at_prefill_sizes_and_flat_at_decode(device, monkeypatch):
    import kernels.moe.w8a8 as module

    ran = []
    for name, fn in (("moe_w8a8", moe_w8a8), ("moe_flat", moe_flat)):
        monkeypatch.setattr(
            module, name, lambda *a, _n=name, _f=fn, **k: ran.append(_n) or _f(*a, **k)
        )
    prefill = torch.tensor([[t % EXPERTS, (t + 1) % EXPERTS] for t in range(120)])  # 40 a row
    for case, ids in (("prefill", prefill), ("decode", ROUTINGS["one-token"])):
        x, ids, route, weights = problem(ids, device)
        out = moe_flat_w8a8(x, ids, route, weights)
        want = moe_w8a8 if case == "prefill" else moe_flat
        assert relative_error(out, want(x, ids, route, weights)) == 0
    assert ran == ["moe_w8a8", "moe_flat"]
    with pytest.raises(ValueError, match="got bf16 weights"):
        moe_flat_w8a8(x, ids, route, (weights.gate_up.to(x.dtype), weights.down.to(x.dtype)))


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(ROUTINGS))
@pytest.mark.parametrize("programs", [1, 3, None])
def test_the_gluon_kernels_match_the_triton_ones(case, programs):
    """The Gluon gate/up and down projections (kernels/moe/w8a8_gate_up_wgmma.py,
    w8a8_wgmma.py) against the Triton ones: one or three programs make each walk several
    items, so the rings run across items and experts (2 K steps an item, 4 slots), and
    gate/up's load warps gather rows of whole, partial and one-row tiles."""
    x, ids, route, weights = problem(ROUTINGS[case], torch.device("cuda"))
    gluon = moe_w8a8(x, ids, route, weights, num_programs=programs, wgmma=True)
    triton_down = moe_w8a8(x, ids, route, weights, num_programs=programs, wgmma=False)
    assert relative_error(gluon, triton_down) < 1e-3
    assert relative_error(gluon, moe_w8a8_reference(x, ids, route, weights)) < 1e-2


@pytest.mark.gpu
def test_a_trusted_prefill_call_never_syncs_with_the_host():
    """Under trusted_routing a call (the layout by histogram and permutation, W8A8 or flat)
    launches its kernels without reading anything back, so a served prefill's CPU runs ahead
    of its GPU; without it, the range check is a sync. Torch's sync debug mode raises on one."""
    x, ids, route, weights = problem(ROUTINGS["two-tiles"], torch.device("cuda"))
    for call in (moe_w8a8, moe_flat):
        call(x, ids, route, weights)  # compiled first
        torch.cuda.set_sync_debug_mode("error")
        try:
            with trusted_routing():
                call(x, ids, route, weights)
            with pytest.raises(RuntimeError, match="synchronizing"):
                call(x, ids, route, weights)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_the_gluon_kernels_are_refused_where_they_cannot_run(device):
    x, ids, route, weights = problem(ROUTINGS["one-token"], device)
    with pytest.raises(ValueError, match="must be True, False or None"):
        moe_w8a8(x, ids, route, weights, wgmma="yes")
    with pytest.raises(ValueError, match="wgmma=True needs an sm_90 .* block_m=128 and H a"):
        moe_w8a8(x, ids, route, weights, block_m=64, wgmma=True)


def test_the_gluon_down_kernel_refuses_registers_its_load_warp_leaves_no_room_for():
    """Beside down's load warp, setmaxnreg can give each consumer warpgroup 232 registers at
    most; Triton would give warpgroup 0 fewer than asked, so more is refused up front."""
    empty = torch.empty(0)
    with pytest.raises(ValueError, match="consumer_regs must be a multiple of 8 from 24 to 232"):
        down_wgmma(*[empty] * 9, programs=1, consumer_regs=240)
