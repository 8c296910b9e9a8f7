"""Every Triton MoE scheduler in every weight format against moe_reference.

The reference runs on the dequantised weights, so these tests see kernel error only, never
quantisation error. Shapes are small and ragged (H=72, I=40 against 32/64-wide tiles) so the
interpreter finishes quickly while every tile has a masked edge, and the quantisation block
(32) is smaller than H and I so several scale blocks meet inside one column tile.
"""

import sys

import pytest
import torch
import triton
from conftest import GPU_TESTS
from helpers import relative_error

from kernels import moe
from kernels.compiled import launch
from kernels.moe import (
    FORMATS,
    VARIANTS,
    W8A8_VARIANTS,
    MoeWeights,
    last_facts,
    moe_flat,
    moe_multirow,
    moe_padded,
    moe_reference,
    moe_stock,
)
from kernels.moe.launch import SILU_COLS, SILU_ROWS
from kernels.moe.tiles import FOLD_ROWS, silu_reduce_kernel

EXPERTS, TOP_K, HIDDEN, INTER, QBLOCK = 8, 2, 72, 40, 32
TILES = {"block_n": 64, "block_k": 32}  # 2 column tiles of H, 3 K tiles of H, 2 of I
SCHEDULERS = {
    "stock": (moe_stock, {}),
    "multirow-1": (moe_multirow, {"rows": 1}),
    "multirow-2": (moe_multirow, {"rows": 2}),
    "multirow-4": (moe_multirow, {"rows": 4}),
    "flat-static": (moe_flat, {"schedule": "static"}),
    "flat-ticket": (moe_flat, {"schedule": "ticket"}),
    "padded": (moe_padded, {}),
}
PER_BLOCK_M = {"flat-static", "flat-ticket", "padded"}  # take block_m; stock/multirow do not


def routing(case, gen):
    """(tokens, topk_ids (T, K) int32) for a named routing case."""
    if case == "one-token":
        return 1, torch.tensor([[5, 2]])
    if case == "empty-experts":  # experts 1, 3-6 get nothing
        return 5, torch.tensor([[0, 2], [7, 0], [2, 7], [0, 7], [7, 2]])
    if case == "one-expert":  # 74 rows on expert 6: several row tiles of every height
        return 37, torch.stack([torch.full((37,), 6), torch.full((37,), 6)], dim=1)
    if case == "skewed":  # about 90% of the slots on experts 3 and 4
        probs = torch.full((EXPERTS,), 0.1 / (EXPERTS - 2))
        probs[3:5] = 0.45
        return 37, torch.multinomial(probs, 37 * TOP_K, replacement=True, generator=gen).view(
            37, TOP_K
        )
    assert case == "uniform"
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(37)])
    return 37, ids


def make_problem(case, fmt, device, seed=0):
    """(x bf16, topk_ids, topk_weights, MoeWeights in fmt) on `device`."""
    gen = torch.Generator().manual_seed(seed)
    tokens, ids = routing(case, gen)
    x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16)
    w_gate_up = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5
    w_down = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER**0.5
    topk_weights = torch.softmax(torch.randn(tokens, TOP_K, generator=gen), dim=-1)
    weights = MoeWeights.quantize(
        w_gate_up.to(torch.bfloat16).to(device),
        w_down.to(torch.bfloat16).to(device),
        fmt,
        block=QBLOCK,
    )
    return x.to(device), ids.to(torch.int32).to(device), topk_weights.to(device), weights


def check(name, problem, **options):
    """Run scheduler `name` and compare it with the reference on the dequantised weights."""
    fn, fixed = SCHEDULERS[name]
    x, ids, topk_weights, weights = problem
    out = fn(x, ids, topk_weights, weights, **fixed, **TILES, **options)
    assert out.shape == x.shape and out.dtype == x.dtype
    want = moe_reference(x, ids, topk_weights, *weights.dequantize())
    # The interpreter truncates fp32 -> bf16 (h, the slot rows and the output) where torch
    # and the GPU round to nearest: up to 0.0102 here (INT4, one token). The GPU keeps 1e-2.
    loose = weights.fmt == "int4" and not GPU_TESTS
    assert relative_error(out, want) < (1.5e-2 if loose else 1e-2)


@pytest.mark.parametrize("case", ["one-token", "empty-experts", "one-expert", "skewed"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", SCHEDULERS)
def test_matches_reference(device, name, fmt, case):
    check(name, make_problem(case, fmt, device))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", SCHEDULERS)
def test_split_k_matches_reference(device, name, fmt):
    # split_k=3 splits H into 3 K tiles and I (2 K tiles) into 2: the split is capped.
    check(name, make_problem("uniform", fmt, device, seed=1), split_k=3)


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
@pytest.mark.parametrize("name", SCHEDULERS)
def test_default_tiles_take_weights_in_blocks_under_128(device, name, fmt):
    # the decode defaults read 128-deep K tiles; blocks of 32 shrink them to one scale block
    fn, fixed = SCHEDULERS[name]
    x, ids, topk_weights, weights = make_problem("uniform", fmt, device, seed=4)
    out = fn(x, ids, topk_weights, weights, **fixed)
    want = moe_reference(x, ids, topk_weights, *weights.dequantize())
    loose = fmt == "int4" and not GPU_TESTS  # as in check()
    assert relative_error(out, want) < (1.5e-2 if loose else 1e-2)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("name", "module"), [("flat-static", moe.flat), ("padded", moe.padded),
                                              ("stock", moe.stock)])  # fmt: skip
@pytest.mark.parametrize(("hidden", "inter", "even"), [(64, 32, True), (HIDDEN, INTER, False)])
def test_schedulers_drop_their_k_masks_only_where_every_k_tile_is_full(
    device, monkeypatch, fmt, name, module, hidden, inter, even
):
    # H=64 and I=32 are whole 32-deep K tiles: the GEMMs launch with EVEN_K and no K masks
    # (16-byte copies of INT4 bytes on the GPU); H=72, I=40 end in partial tiles and keep them
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "HIDDEN", hidden)
    monkeypatch.setattr(this, "INTER", inter)
    flags = []

    def recording_launch(kernel, grid, *args, **constants):
        if kernel.fn.__name__.endswith(("_gate_up_kernel", "_down_kernel")):
            flags.append(constants["EVEN_K"])
        return launch(kernel, grid, *args, **constants)

    monkeypatch.setattr(module, "launch", recording_launch)
    check(name, make_problem("skewed", fmt, device, seed=6))
    assert flags == [even, even]  # gate/up, then down


@pytest.mark.parametrize("fmt", FORMATS)
def test_flat_decode_runs_down_on_a_launch_of_its_own(device, monkeypatch, fmt):
    # down's decode width, stages and programs may differ from gate/up's; its block_m and
    # block_k may not (the row tiles and K tiles are shared)
    monkeypatch.setitem(moe.flat.DECODE_DOWN_OPTIONS, fmt, {"block_n": 32, "num_stages": 2})
    monkeypatch.setitem(moe.flat.DECODE_DOWN_PROGRAMS_PER_SM, fmt, 1)
    x, ids, topk_weights, weights = make_problem("skewed", fmt, device, seed=5)
    out = moe_flat(x, ids, topk_weights, weights)
    want = moe_reference(x, ids, topk_weights, *weights.dequantize())
    loose = fmt == "int4" and not GPU_TESTS  # as in check()
    assert relative_error(out, want) < (1.5e-2 if loose else 1e-2)
    monkeypatch.setitem(moe.flat.DECODE_DOWN_OPTIONS, fmt, {"block_k": 16})
    with pytest.raises(ValueError, match="down's tiles must share gate/up's block_m and block_k"):
        moe_flat(x, ids, topk_weights, weights)


# up to 10 splits: flat's gate/up splits its K ten ways at T=1 on the H200
@pytest.mark.parametrize("splits", [2, 4, 5, 10])
def test_silu_reduce_sums_every_split_of_gate_and_up(device, splits):
    rows, inter = 7, 100  # ragged against the reduce's 4 x 64 tiles
    gen = torch.Generator().manual_seed(splits)
    part = torch.randn(splits, rows, 2 * inter, generator=gen).to(device)
    h = torch.empty(rows, inter, device=device)
    grid = (triton.cdiv(rows, SILU_ROWS), triton.cdiv(inter, SILU_COLS))
    launch(silu_reduce_kernel, grid, part, h, rows, inter, splits, part.stride(0),
           part.stride(1), h.stride(0), BLOCK_R=SILU_ROWS, BLOCK_C=SILU_COLS)  # fmt: skip
    gate, up = part.sum(0).split(inter, dim=1)
    assert torch.allclose(h, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_split_k_two_with_swapped_operands(device, name):
    check(name, make_problem("skewed", "int4", device, seed=2), split_k=2, swap_ab=True)


@pytest.mark.parametrize("block_m", [64, 128])  # 128: INT4 folds its scales (tiles.FOLD_ROWS)
@pytest.mark.parametrize("fmt", ["fp8", "int4"])
@pytest.mark.parametrize("name", sorted(PER_BLOCK_M))
def test_tall_blocks_with_swapped_operands(device, name, fmt, block_m):
    check(name, make_problem("one-expert", fmt, device, seed=3), block_m=block_m, swap_ab=True)


@pytest.mark.parametrize("swap_ab", [False, True])
@pytest.mark.parametrize("block_m", [16, FOLD_ROWS.value])
@pytest.mark.parametrize("name", ["flat-static", "padded"])
def test_int4_multiplies_the_exact_values_or_in_tall_tiles_bf16_rounded_ones(
    device, name, block_m, swap_ab
):
    # fp32 activations and the 'ieee' MMA leave only reassociation: what each tile multiplies
    # by shows. Short tiles scale the product by the exact q * s; tiles of FOLD_ROWS rows fold
    # s into the weights in bf16, so the reference takes q * s rounded to bf16.
    fn, fixed = SCHEDULERS[name]
    x, ids, topk_weights, weights = make_problem("one-expert", "int4", device, seed=6)
    out = fn(x.float(), ids, topk_weights, weights, **fixed, **TILES, block_m=block_m,
             swap_ab=swap_ab)  # fmt: skip
    exact = weights.dequantize()
    rounded = tuple(w.to(torch.bfloat16).float() for w in exact)
    folded = block_m >= FOLD_ROWS.value
    want = moe_reference(x.float(), ids, topk_weights, *(rounded if folded else exact))
    other = moe_reference(x.float(), ids, topk_weights, *(exact if folded else rounded))
    assert relative_error(out, want) < 1e-5
    assert relative_error(out, other) > 1e-4  # the two references are told apart


@pytest.mark.parametrize("programs", [1, 3])
def test_flat_with_few_programs(device, programs):
    # one program walks every item; three leave a remainder of items in the static stride
    check("flat-static", make_problem("uniform", "bf16", device, seed=4), num_programs=programs)


@pytest.mark.parametrize("fn", [moe_flat, moe_padded, moe_stock])
def test_default_options(device, fn):
    x, ids, topk_weights, weights = make_problem("uniform", "bf16", device, seed=5)
    out = fn(x, ids, topk_weights, weights)  # default tiles, automatic split for flat
    want = moe_reference(x, ids, topk_weights, weights)
    assert relative_error(out, want) < 1e-2


@pytest.mark.parametrize("name", [n for n in VARIANTS if n not in {"reference", *W8A8_VARIANTS}])
def test_legacy_positional_weights(device, name):
    """workbench/model.py calls VARIANTS[name](x, ids, weights, w_gate_up, w_down)."""
    x, ids, topk_weights, weights = make_problem("one-token", "bf16", device, seed=6)
    out = VARIANTS[name](x, ids, topk_weights, weights.gate_up, weights.down)
    tupled = VARIANTS[name](x, ids, topk_weights, (weights.gate_up, weights.down))
    assert torch.equal(out, tupled)
    assert relative_error(out, moe_reference(x, ids, topk_weights, weights)) < 1e-2


def test_registries():
    assert set(VARIANTS) == {
        "stock",
        "multirow",
        "flat",
        "padded",
        "w8a8",
        "flat_w8a8",
        "reference",
    }
    assert VARIANTS["flat"] is moe_flat and VARIANTS["reference"] is moe_reference
    assert FORMATS == ("bf16", "fp8", "int4") and moe.FORMATS is FORMATS


def test_facts_name_every_launch_of_the_last_call(device):
    moe_flat(*make_problem("one-token", "fp8", device), **TILES, split_k=2)
    facts = last_facts()
    assert list(facts) == [
        "small_layout_kernel",  # one token: the routing layout in one launch
        "flat_gate_up_kernel",
        "silu_reduce_kernel",
        "flat_down_kernel",
        "combine_kernel",
    ]
    for fact in facts.values():
        values = (fact.n_regs, fact.n_spills, fact.shared_bytes)
        if device.type == "cuda":
            assert all(isinstance(v, int) for v in values) and 0 < fact.n_regs <= 255
        else:  # the interpreter compiles nothing
            assert values == (None, None, None)
    with pytest.raises(ValueError):
        moe_padded(*make_problem("one-token", "bf16", device), split_k=0)
    assert last_facts() == facts  # a rejected call leaves the last facts alone


@pytest.mark.parametrize(
    ("fn", "options", "message"),
    [
        (moe_multirow, {"rows": 3}, r"rows=3 must be one of \(1, 2, 4\)"),
        (moe_stock, {"split_k": 0}, "split_k=0 must be an integer >= 1; 1 means no split"),
        (moe_flat, {"split_k": 0}, "split_k=0 must be"),
        (moe_padded, {"block_m": 24}, "block_m=24 must be a power of two >= 16"),
        (moe_flat, {"block_n": 48}, "block_n=48 must be a power of two"),
        (moe_multirow, {"block_k": 8}, "block_k=8 must be a power of two >= 16"),
        (moe_flat, {"block_k": 64}, "block_k=64 must divide the fp8 block 32"),
        (moe_flat, {"schedule": "dynamic"}, r"schedule='dynamic' must be one of"),
        (moe_flat, {"num_programs": 0}, "num_programs=0 must be an integer >= 1"),
        (moe_stock, {"groups": 0}, "groups=0 must be an integer >= 1"),
        (moe_padded, {"num_warps": 3}, "num_warps=3 must be one of"),
        (moe_stock, {"num_stages": 0}, "num_stages=0 must be an integer >= 1"),
    ],
)
def test_rejects_bad_options(fn, options, message):
    with pytest.raises(ValueError, match=message):
        fn(*make_problem("one-token", "fp8", "cpu"), **{**TILES, **options})


def test_rejects_mismatched_scales():
    x, ids, topk_weights, weights = make_problem("one-token", "fp8", "cpu")
    scales = (weights.gate_up_scale[:, :1], weights.down_scale)
    bad = MoeWeights("fp8", weights.gate_up, weights.down, *scales, QBLOCK)
    with pytest.raises(ValueError, match=r"fp8 scales must be \(8, 3, 3\)"):
        moe_flat(x, ids, topk_weights, bad)


@pytest.mark.parametrize("fn", [moe_flat, moe_padded])
def test_fp32_activations_and_weights(device, fn):
    """fp32 takes the 'ieee' MMA path: no TF32 rounding, so the error is fp32 reassociation."""
    x, ids, topk_weights, weights = make_problem("skewed", "bf16", device, seed=7)
    w_gate_up, w_down = weights.gate_up.float(), weights.down.float()
    out = fn(x.float(), ids, topk_weights, w_gate_up, w_down, **TILES, split_k=2)
    assert out.dtype == torch.float32
    want = moe_reference(x.float(), ids, topk_weights, w_gate_up, w_down)
    assert relative_error(out, want) < 1e-5


def test_int4_prefill_tiles_put_the_weights_first_in_128_row_tiles():
    # INT4 prefill: weights as the MMA's first operand, unpacked and scaled in registers, in
    # every scheduler with prefill tiles; decode keeps each scheduler's own tiles.
    from kernels.moe import flat, padded
    from kernels.moe.launch import INT4_PREFILL_TILES
    from kernels.moe.routing import MoeShape

    prefill = MoeShape(tokens=33_863, hidden=4096, experts=384, inter=1152, top_k=6)
    decode = MoeShape(tokens=6, hidden=4096, experts=384, inter=1152, top_k=6)
    assert INT4_PREFILL_TILES.swap_ab and INT4_PREFILL_TILES.block_m == 128
    for module in (flat, padded):
        assert module.default_tiles(prefill, "int4") == INT4_PREFILL_TILES, module.__name__
        assert not module.default_tiles(prefill, "fp8").swap_ab, module.__name__
    for fmt in ("bf16", "fp8", "int4"):  # one scale block a K tile at decode
        assert padded.default_tiles(decode, fmt) == padded.DECODE_TILES
    assert padded.DECODE_TILES.block_k == 128
    assert flat.default_tiles(decode, "int4") == flat.DECODE_TILES["int4"]


def test_flat_runs_several_programs_an_sm_at_decode_only():
    # one 8-warp program an SM was latency-bound at decode (12.5% occupancy)
    from kernels.moe import flat
    from kernels.moe.routing import MoeShape

    prefill = MoeShape(tokens=33_863, hidden=4096, experts=384, inter=1152, top_k=6)
    decode = MoeShape(tokens=6, hidden=4096, experts=384, inter=1152, top_k=6)
    assert flat.default_programs(decode, "int4", 132) == 264
    assert flat.default_programs(decode, "fp8", 132) == 396
    assert flat.default_programs(decode, "bf16", 132) == 264
    for fmt in ("bf16", "fp8", "int4"):
        assert flat.default_programs(prefill, fmt, 132) == 132
