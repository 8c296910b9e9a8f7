"""The Gluon bf16 MoE kernels (kernels/moe/bf16_wgmma.py) that moe_flat runs at prefill sizes
on sm_90: the table of row tiles they read and the widening of FP8 and INT4 experts to bf16
(Triton kernels, so the interpreter runs them), when moe_flat takes them and its refusals, and
on a GPU, their results against the Triton kernels' at ragged routings with few programs (the
ring then runs across items and experts), in each expert format."""

import pytest
import torch
from helpers import expert_problem, relative_error

from kernels.moe import MoeWeights, moe_flat, moe_reference
from kernels.moe import bf16_wgmma as module
from kernels.moe import flat as flat_module
from kernels.moe.flat import FlatLayout
from kernels.moe.routing import MoeShape
from kernels.moe.w8a8_wgmma import row_table
from kernels.moe.widen import WIDEN_MIN_ROWS, widened

EXPERTS, TOP_K, HIDDEN, INTER = 6, 2, 256, 256  # one 256-wide down item, two gate/up items
ROUTINGS = {
    "uniform": torch.stack(
        [
            torch.randperm(EXPERTS, generator=torch.Generator().manual_seed(t))[:TOP_K]
            for t in range(150)
        ]
    ),  # fmt: skip  # 300 rows: three row tiles of most experts, the last partly filled
    "empty-experts": torch.tensor([[0, 2], [5, 0], [2, 5], [0, 5], [5, 2]]),  # 1, 3, 4: none
    "one-expert": torch.tensor([[4, 4]] * 140),  # 280 rows: three tiles of one expert
    "one-token": torch.tensor([[3, 1]]),
}


def problem(ids: torch.Tensor, device, seed=0):
    """(x bf16, ids, routing weights, bf16 experts) for topk_ids `ids`."""
    x, route, gate_up, down = expert_problem(ids, EXPERTS, HIDDEN, INTER, seed)
    weights = MoeWeights.quantize(gate_up.to(device), down.to(device), "bf16")
    return x.to(device), ids.to(torch.int32).to(device), route.to(device), weights


@pytest.mark.parametrize("case", ["uniform", "one-expert", "empty-experts", "top-3"])
def test_the_row_table_names_each_tiles_expert_rows_and_weights(case, device):
    ids = torch.tensor([[0, 5, 2], [1, 2, 3]] * 70) if case == "top-3" else ROUTINGS[case]
    x, ids, route, _ = problem(ids, device)
    top_k = ids.shape[1]
    shape = MoeShape(tokens=x.shape[0], hidden=HIDDEN, experts=EXPERTS, inter=INTER, top_k=top_k)
    layout = FlatLayout.of(ids, route, shape, module.ROWS)
    row_weights, tile_info = row_table(layout, shape)
    slots = layout.sorted_slots.long()
    assert torch.equal(row_weights, route.reshape(-1).float()[slots])
    counts, offsets = layout.counts.tolist(), layout.offsets.tolist()
    table = [
        [expert, offsets[expert] + first, min(module.ROWS, counts[expert] - first)]
        for expert in range(EXPERTS)
        for first in range(0, counts[expert], module.ROWS)
    ]
    assert tile_info[: len(table), :3].tolist() == table


def test_moe_flat_takes_the_gluon_kernels_where_they_run_and_pay(device, monkeypatch):
    """On sm_90 (stood in for here), at prefill sizes without Triton options: bf16 experts from
    32 rows an active expert, FP8 and INT4 ones (widened) from WIDEN_MIN_ROWS."""
    ran = []
    monkeypatch.setattr(flat_module, "supported", lambda _device: True)
    monkeypatch.setattr(module, "moe_bf16_wgmma", lambda x, *a, **k: ran.append(1) or x)
    prefill = problem(ROUTINGS["one-expert"], device)  # 280 rows on one expert
    decode = problem(ROUTINGS["one-token"], device)
    moe_flat(*prefill)
    assert ran == [1]
    moe_flat(*decode)  # decode sizes: the Triton kernels stream the weights
    moe_flat(*prefill, block_m=64)  # a Triton tile option
    moe_flat(*prefill, schedule="ticket")
    moe_flat(*prefill, wgmma=False)
    assert ran == [1]
    moe_flat(*decode, wgmma=True)  # asked for: runs at any size
    assert ran == [1, 1]
    x, *rest = prefill
    wide = torch.empty(x.shape[0], x.shape[1] + 1, dtype=x.dtype, device=x.device)[:, 1:]
    wide.copy_(x)  # x's values, its rows 2 bytes off 16-byte alignment
    assert torch.equal(wide, x) and wide.data_ptr() % 16
    moe_flat(wide, *rest)  # the Triton kernels read any strides
    assert ran == [1, 1]
    with pytest.raises(ValueError, match="x's rows contiguous and 16-byte aligned"):
        moe_flat(wide, *rest, wgmma=True)
    for tokens, widens in ((WIDEN_MIN_ROWS * EXPERTS // TOP_K, True), (150, False)):
        ids = torch.arange(tokens * TOP_K).reshape(tokens, TOP_K) % EXPERTS  # evenly spread
        x, ids, route, weights = problem(ids, device)
        for fmt in ("fp8", "int4"):
            before = len(ran)
            moe_flat(x, ids, route, MoeWeights.quantize(weights.gate_up, weights.down, fmt))
            assert len(ran) == before + widens
    moe_flat(x, ids, route, weights)  # 50 rows an expert: enough for bf16 experts
    assert len(ran) == 5


def test_the_gluon_kernels_are_refused_where_they_cannot_run(device):
    x, ids, route, weights = problem(ROUTINGS["one-token"], device)
    with pytest.raises(ValueError, match="must be True, False or None"):
        moe_flat(x, ids, route, weights, wgmma="yes")
    fp8 = MoeWeights.quantize(weights.gate_up, weights.down, "fp8")
    message = "wgmma=True needs .*bf16 activations and bf16, FP8 or INT4 experts.*no Triton tile"
    with pytest.raises(ValueError, match=message):
        moe_flat(x.float(), ids, route, fp8, block_n=64, wgmma=True)
    if device.type == "cpu":
        with pytest.raises(ValueError, match=r"needs an sm_90 \(Hopper\) GPU; pass wgmma=None"):
            moe_flat(x, ids, route, weights, wgmma=True)
    for stages, lag, what in ((5, 0, "num_stages must be from 2 to 4"), (4, 3, "lag must be")):
        with pytest.raises(ValueError, match=what):
            module.check_ring(stages, lag)


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
@pytest.mark.parametrize(("block", "hidden"), [(128, 256), (32, 200)])  # 200: a partial block
def test_widened_weights_are_the_values_the_kernels_multiply_by(fmt, block, hidden, device):
    """Each weight is its FP8 value times its block scale, or its INT4 code less 8 times its
    group scale, rounded once to bf16: on a GPU to nearest, exactly; the interpreter's bf16
    conversion truncates, so on the CPU within a bf16 step."""
    gen = torch.Generator().manual_seed(1)
    gate_up = torch.randn(3, 2 * 96, hidden, generator=gen).to(device)
    down = torch.randn(3, hidden, 96, generator=gen).to(device)
    weights = MoeWeights.quantize(gate_up, down, fmt, block)
    for projection, exact in zip(("gate_up", "down"), weights.dequantize(), strict=True):
        wide = widened(weights, projection)
        assert wide.dtype == torch.bfloat16 and wide.shape == exact.shape
        if device.type == "cuda":
            assert torch.equal(wide, exact.to(torch.bfloat16))
        else:
            assert ((wide.float() - exact).abs() <= exact.abs() * 2**-7).all()
    assert widened(MoeWeights("bf16", gate_up, down), "down") is down


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_widening_leaves_the_experts_without_rows_unwritten(fmt, device, monkeypatch):
    """Given the rows an expert, only the experts with rows are widened (the others are never
    read); here the new tensor starts as NaN, so an unwritten row shows."""
    gen = torch.Generator().manual_seed(2)
    gate_up = torch.randn(3, 2 * 96, 256, generator=gen).to(device)
    down = torch.randn(3, 256, 96, generator=gen).to(device)
    weights = MoeWeights.quantize(gate_up, down, fmt)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    counts = torch.tensor([5, 0, 1], dtype=torch.int32, device=device)
    wide = widened(weights, "gate_up", counts)
    assert wide[1].isnan().all()
    everywhere = widened(weights, "gate_up")
    assert torch.equal(wide[[0, 2]], everywhere[[0, 2]]) and not everywhere.isnan().any()


def test_widening_without_the_memory_says_how_much_and_what_to_do(monkeypatch):
    weights = MoeWeights.quantize(torch.randn(2, 256, 128), torch.randn(2, 128, 128), "fp8")

    def full(*shape, **options):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(torch, "empty", full)
    with pytest.raises(torch.OutOfMemoryError, match=r"gate_up .* 0\.0 GiB .* wgmma=False"):
        widened(weights, "gate_up")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
@pytest.mark.parametrize("case", ["uniform", "one-expert"])
def test_widened_experts_on_the_gluon_kernels_match_the_triton_ones(case, fmt):
    """FP8 (W8A16) and INT4 (W4A16) experts widened to bf16 for the Gluon kernels, against the
    Triton kernels that dequantise each tile, and against the reference on their values."""
    x, ids, route, weights = problem(ROUTINGS[case], torch.device("cuda"))
    quantised = MoeWeights.quantize(weights.gate_up, weights.down, fmt)
    gluon = moe_flat(x, ids, route, quantised, wgmma=True)
    triton_kernels = moe_flat(x, ids, route, quantised, wgmma=False)
    assert relative_error(gluon, triton_kernels) < 1e-2
    assert relative_error(gluon, moe_reference(x, ids, route, quantised)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(ROUTINGS))
@pytest.mark.parametrize("programs", [1, 3, None])
def test_the_gluon_kernels_match_the_triton_ones(case, programs):
    """4 K steps an item (H / 64 in gate/up, I / 64 in down) and 4 slots: one program's ring
    holds steps of two items; three leave a remainder of items; gate/up's load warps gather
    the rows of whole, partial and one-row tiles (280 rows as 128 + 128 + 24, 100, one)."""
    x, ids, route, weights = problem(ROUTINGS[case], torch.device("cuda"))
    gluon = moe_flat(x, ids, route, weights, num_programs=programs, wgmma=True)
    triton_kernels = moe_flat(x, ids, route, weights, num_programs=programs, wgmma=False)
    assert relative_error(gluon, triton_kernels) < 5e-3
    assert relative_error(gluon, moe_reference(x, ids, route, weights)) < 1e-2
