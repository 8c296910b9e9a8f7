"""The humming MoE peer without humming: what it refuses, its torch glue (the block-aligned
routing humming's indexed GEMM reads, the interval lookup that picks the M tile, the combine)
against plain references, and the whole call through a stand-in humming that computes what
humming's indexed GEMM and input kernel are documented to (scheduler.cuh: a tile's rows are
read at id // top_k and written at id; ids past T*top_k are skipped), so a padding that does not
match the kernel's tile, or a wrong activation order, shows as a wrong result here."""

from __future__ import annotations

import enum
import json
import re
import sys
import types

import pytest
import torch

from kernels.moe import MoeWeights, moe_reference, router_topk
from workbench.peers import humming_moe
from workbench.workloads.checks import relative_error

BIG = 1 << 30


def _weights(experts: int, hidden: int, inter: int, fmt: str = "fp8", block: int = 128):
    gen = torch.Generator().manual_seed(experts + hidden + inter)
    w_gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    w_down = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    return MoeWeights.quantize(w_gate_up, w_down, fmt, block)


def _routing(tokens: int, experts: int, top_k: int, seed: int) -> tuple[torch.Tensor, ...]:
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed))
    return router_topk(logits, top_k)


def test_available_names_humming_kernels_when_it_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "humming", None)  # import humming raises ImportError
    ok, why = humming_moe.available()
    assert not ok
    assert why.startswith("humming-kernels is not installed") and "humming-kernels==" in why


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        (_weights(2, 256, 128, "int4"), "got int4 with block 128"),
        (_weights(2, 256, 128, "fp8", 64), "got fp8 with block 64"),
        (_weights(2, 256, 128, "bf16"), "got bf16 with block 128"),
    ],
)
def test_prepare_refuses_weights_humming_cannot_take(monkeypatch, weights, match):
    monkeypatch.setitem(sys.modules, "humming", None)  # refused before humming is imported
    with pytest.raises(ValueError, match=match) as err:
        humming_moe.prepare(weights)
    assert "MoeWeights.quantize(w_gate_up, w_down, 'fp8', 128)" in str(err.value)


def test_prepare_refuses_partial_scale_blocks(monkeypatch):
    monkeypatch.setitem(sys.modules, "humming", None)
    with pytest.raises(ValueError, match="multiples of 128; got H=192, I=128"):
        humming_moe.prepare(_weights(2, 192, 128))


def _aligned_by_loop(ids: torch.Tensor, experts: int, tile: int) -> tuple[list[int], list[int]]:
    """The padded slot ids and tile experts, built the obvious way: expert by expert."""
    flat = ids.reshape(-1).tolist()
    sorted_ids, tile_experts = [], []
    for expert in range(experts):
        mine = [slot for slot, e in enumerate(flat) if e == expert]
        tiles = -(-len(mine) // tile)
        sorted_ids += mine + [len(flat)] * (tiles * tile - len(mine))
        tile_experts += [expert] * tiles
    return sorted_ids, tile_experts


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "tile"),
    [(1, 1, 8, 8), (1, 6, 384, 16), (5, 2, 8, 8), (37, 6, 8, 16), (300, 6, 16, 64), (9, 3, 4, 1)],
)
def test_align_blocks_matches_the_loop(tokens, top_k, experts, tile):
    ids, _ = _routing(tokens, experts, top_k, seed=tokens * top_k)
    ids[0] = torch.arange(top_k)  # expert 0 always has a slot, the last ones often none
    slots = humming_moe.sort_slots(ids, torch.arange(experts + 1))
    sorted_ids, expert_ids, padded = humming_moe.align_blocks(slots, tile)
    want_ids, want_experts = _aligned_by_loop(ids, experts, tile)
    n = int(padded[0])
    assert padded.dtype == sorted_ids.dtype == expert_ids.dtype == torch.int32
    assert padded.shape == (1,) and n == len(want_ids)
    assert sorted_ids[:n].tolist() == want_ids
    assert expert_ids[: n // tile].tolist() == want_experts
    # the tail the kernel never reaches: padding ids, and experts that exist
    assert (sorted_ids[n:] == tokens * top_k).all() and sorted_ids.numel() % tile == 0
    assert expert_ids.numel() == sorted_ids.numel() // tile
    assert ((expert_ids >= 0) & (expert_ids < experts)).all()


def test_align_blocks_capacity_holds_the_worst_padding():
    """Every slot on its own expert: each short of a tile by tile - 1, the bound exactly."""
    ids = torch.arange(12).reshape(6, 2)
    slots = humming_moe.sort_slots(ids, torch.arange(13))
    sorted_ids, expert_ids, padded = humming_moe.align_blocks(slots, 16)
    assert int(padded[0]) == sorted_ids.numel() == 12 * 16
    assert expert_ids.tolist() == list(range(12))
    assert sorted_ids.view(12, 16)[:, 0].tolist() == list(range(12))


def test_the_tile_is_the_one_of_hummings_interval():
    """humming's launcher takes the interval with min < M <= max; the padding must too."""
    table = [[0, 4, {"block_shape": [8, 64, 64]}], [4, 96, {"block_shape": [16, 128, 64]}]]
    table.append([96, BIG, {"block_shape": [64, 128, 64]}])
    tuning = humming_moe.tuning_from_table(table)
    assert [tuning.tile(m) for m in (1, 4, 5, 96, 97, 203178)] == [8, 8, 16, 16, 64, 64]
    assert json.loads(tuning.table) == table


class _Mma(enum.Enum):
    WGMMA = "wgmma"


def test_the_table_goes_back_to_humming_as_json():
    table = [[0, BIG, {"block_shape": (48, 128, 64), "mma_type": _Mma.WGMMA}]]
    table[0][2]["num_stages"] = torch.tensor(4)  # a scalar a heuristic computed
    tuning = humming_moe.tuning_from_table(table)
    want = {"block_shape": [48, 128, 64], "mma_type": "wgmma", "num_stages": 4}
    assert json.loads(tuning.table) == [[0, BIG, want]]
    assert tuning.tiles == (48,)
    with pytest.raises(TypeError, match="cannot pass object back to humming"):
        humming_moe.tuning_from_table([[0, BIG, {"block_shape": [8], "x": object()}]])


def test_combine_weights_and_sums_each_tokens_slots():
    gen = torch.Generator().manual_seed(1)
    out = torch.randn(7 * 3, 64, generator=gen).to(torch.bfloat16)
    route = torch.rand(7, 3, generator=gen)
    y = humming_moe.combine(out, route)
    want = (out.float().view(7, 3, 64) * route[..., None]).sum(1)
    assert y.shape == (7, 64) and y.dtype == torch.bfloat16
    assert relative_error(y, want) < 5e-3  # bf16 routing weights and output


class _StandInLayer:
    """humming's HummingLayer as far as the adapter uses it, computing the indexed GEMM on the
    dequantised experts in fp32 and rounding the output to bf16, as humming's kernel does."""

    made: list = []

    def __init__(self, *, shape_n, shape_k, weight_config, num_experts, torch_dtype):
        self.config = (shape_n, shape_k, weight_config, num_experts, torch_dtype)
        self.calls: list[tuple] = []
        _StandInLayer.made.append(self)

    def load_from_tensors(self, tensors):
        self.tensors = tensors

    def transform(self):
        self.humming_config = ("layer", self.config[0], self.config[1])

    def __call__(
        self, x, *, sorted_ids, expert_ids, num_tokens_padded, top_k, compute_config,
        tuning_config,
    ):  # fmt: skip
        assert json.loads(compute_config) == {"gemm_type": "indexed"}
        rows = x.shape[0] * top_k
        table = json.loads(tuning_config)
        tile = next(int(c["block_shape"][0]) for lo, hi, c in table if lo < rows <= hi)
        self.calls.append((tuple(x.shape), top_k, tile))
        scales = self.tensors["weight_scale_inv"].repeat_interleave(128, 1)
        weight = self.tensors["weight"].float() * scales.repeat_interleave(128, 2)
        out = torch.full((rows, weight.shape[1]), float("nan"), dtype=torch.bfloat16)
        padded = int(num_tokens_padded[0])
        assert padded % tile == 0
        for block in range(padded // tile):
            ids = sorted_ids[block * tile : (block + 1) * tile].long()
            ids = ids[ids < rows]
            expert = weight[int(expert_ids[block])]
            out[ids] = (x[ids // top_k].float() @ expert.T).to(torch.bfloat16)
        return out


def _stand_in_heuristics(layer_config, *, gemm_type, device):
    """Different tiles for the two layers, and two intervals for gate/up, so each call pads
    twice and a tile mix-up shows."""
    assert gemm_type == "indexed" and device == torch.device("cpu")
    if layer_config[2] == 256:  # gate/up, K = H (down has K = I = 128)
        return [
            [0, 4, {"block_shape": (8, 64, 64), "mma_type": _Mma.WGMMA}],
            [4, BIG, {"block_shape": (16, 64, 64), "mma_type": _Mma.WGMMA}],
        ]
    return [[0, BIG, {"block_shape": (32, 64, 64)}]]


def _stand_in_process_input(config, inputs, *, activation_type, activation_impl, use_pdl):
    """humming's binary_split: a = the first half of each row, b = the second, and the impl
    string evaluated as the CUDA expression it is."""
    assert config == ("layer", 256, 128) and activation_type == "binary_split" and not use_pdl
    a, b = inputs.float().chunk(2, dim=-1)
    expression = re.sub(r"(\d\.\d*)f\b", r"\1", activation_impl).replace("expf", "torch.exp")
    return eval(expression, {"torch": torch, "a": a, "b": b}).to(inputs.dtype), None, None


@pytest.fixture
def stand_in_humming(monkeypatch):
    modules = {
        "humming": types.ModuleType("humming"),
        "humming.layer": types.ModuleType("humming.layer"),
        "humming.tune": types.ModuleType("humming.tune"),
        "humming.forward": types.ModuleType("humming.forward"),
    }
    modules["humming.layer"].HummingLayer = _StandInLayer
    modules["humming.tune"].get_heuristics_config = _stand_in_heuristics
    modules["humming.forward"].may_process_input = _stand_in_process_input
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    _StandInLayer.made.clear()
    return _StandInLayer.made


def test_humming_gets_both_projections_in_the_checkpoint_format(stand_in_humming):
    weights = _weights(8, 256, 128)
    humming_moe.prepare(weights)
    gate_up, down = stand_in_humming
    schema = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    assert gate_up.config == (256, 256, schema, 8, torch.bfloat16)
    assert down.config == (256, 128, schema, 8, torch.bfloat16)
    assert gate_up.tensors["weight"] is weights.gate_up
    assert gate_up.tensors["weight_scale_inv"] is weights.gate_up_scale
    assert down.tensors["weight"] is weights.down
    assert down.tensors["weight_scale_inv"] is weights.down_scale
    # the JIT warm-up in prepare: one token, one slot, through both GEMMs
    assert gate_up.calls == [((1, 256), 1, 8)] and down.calls == [((1, 128), 1, 32)]


@pytest.mark.parametrize(("tokens", "top_k"), [(1, 2), (2, 2), (5, 2), (37, 6)])
def test_the_call_computes_the_reference(stand_in_humming, tokens, top_k):
    weights = _weights(8, 256, 128)
    moe = humming_moe.prepare(weights)
    gate_up, down = stand_in_humming
    x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(tokens)).bfloat16()
    ids, route = _routing(tokens, 8, top_k, seed=tokens + 100)
    y = moe(x, ids, route)
    assert y.shape == (tokens, 256) and y.dtype == torch.bfloat16
    assert relative_error(y, moe_reference(x, ids, route, weights)) < 1e-2
    rows = tokens * top_k
    assert gate_up.calls[-1] == ((tokens, 256), top_k, 8 if rows <= 4 else 16)
    assert down.calls[-1] == ((rows, 128), 1, 32)


def test_the_call_checks_shapes_without_reading_the_device(stand_in_humming):
    moe = humming_moe.prepare(_weights(8, 256, 128))
    ids, route = _routing(3, 8, 2, seed=0)
    with pytest.raises(ValueError, match=r"x must be bf16 \(T, H=256\).*bfloat16 \(3, 128\)"):
        moe(torch.zeros(3, 128, dtype=torch.bfloat16), ids, route)
    with pytest.raises(ValueError, match=r"got torch.float32 \(3, 256\)"):
        moe(torch.zeros(3, 256), ids, route)
    with pytest.raises(ValueError, match="ids and route must both be"):
        moe(torch.zeros(3, 256, dtype=torch.bfloat16), ids, route[:, :1])
