"""The Gluon INT4 decode kernels (kernels/moe/int4_mma.py) that moe_flat runs for INT4 experts at
decode sizes on sm_90: when moe_flat takes them and its refusals on any machine, and on a GPU,
their results against flat's Triton kernels at routings that split K or not, leave experts
without rows, and give one expert several 8-row tiles. Their SASS is checked on the CPU in
tests/test_dense_wgmma_sass.py (Gluon has no interpreter)."""

import pytest
import torch
from helpers import expert_problem, relative_error

from kernels.moe import MoeWeights, moe_flat, moe_reference
from kernels.moe import flat as flat_module
from kernels.moe import int4_mma as module
from kernels.moe.launch import Tiles
from kernels.moe.routing import MoeShape, validate_moe_inputs

EXPERTS, HIDDEN, INTER = 8, 512, 256  # H: 4 K steps, I: 2; 8 and 4 columns tiles of 64
ODD = 384  # 3 K steps, so a ring of two-step slots ends half way through one
ROUTINGS = {
    "one-token": torch.tensor([[3, 1]]),
    "six-tokens": torch.tensor([[0, 5], [2, 7], [5, 1], [0, 4], [6, 3], [2, 5]]),
    "empty-experts": torch.tensor([[0, 2], [5, 0], [2, 5], [0, 5]]),  # 1, 3, 4, 6, 7: none
    "one-expert": torch.tensor([[4, 1]] * 20),  # 20 rows on expert 4: 8 + 8 + 4
}


def problem(ids: torch.Tensor, device: torch.device, fmt: str = "int4", hidden: int = HIDDEN,
            inter: int = INTER):  # fmt: skip
    """(x bf16, ids, routing weights, experts in `fmt`) for topk_ids `ids`."""
    x, route, gate_up, down = expert_problem(ids, EXPERTS, hidden, inter)
    weights = MoeWeights.quantize(gate_up.to(device), down.to(device), fmt)
    return x.to(device), ids.to(torch.int32).to(device), route.to(device), weights


def test_moe_flat_takes_the_gluon_int4_kernels_at_decode_sizes_only(device, monkeypatch):
    """Where they run (sm_90, stood in for here): INT4 experts at decode sizes, with no Triton
    tile option, num_programs or ticket schedule, and not when int4_gluon=False."""
    ran = []
    monkeypatch.setattr(module, "runs_on", lambda *args: True)
    monkeypatch.setattr(module, "moe_int4_mma", lambda x, *a, **k: ran.append(a[3:]) or x)
    decode = problem(ROUTINGS["six-tokens"], device)
    moe_flat(*decode)
    assert len(ran) == 1
    sms, gate_up_splits, down_splits, (row_weights, tile_info), rings = ran[0]
    assert sms == (flat_module.sm_count(device) or flat_module.CPU_PROGRAMS)  # the CPU's 4
    assert rings == (module.GATE_UP_RING, module.DOWN_RING)
    assert gate_up_splits >= 1 and down_splits >= 1
    # at decode sizes the row table comes with the layout's one launch
    assert row_weights.shape == (ROUTINGS["six-tokens"].numel(),) and tile_info.shape[1] == 4
    moe_flat(*decode, block_n=64)
    moe_flat(*decode, num_programs=3)
    moe_flat(*decode, schedule="ticket")
    moe_flat(*decode, int4_gluon=False)
    moe_flat(*problem(ROUTINGS["six-tokens"], device, "fp8"))
    prefill = torch.arange(64 * 2).reshape(64, 2) % EXPERTS  # 16 rows an expert: prefill
    monkeypatch.setattr(flat_module, "prefill_sized", lambda *args: True)
    moe_flat(*problem(prefill, device))
    assert len(ran) == 1


def test_the_gluon_int4_kernels_are_refused_where_they_cannot_run(device):
    x, ids, route, weights = problem(ROUTINGS["one-token"], device)
    with pytest.raises(ValueError, match="int4_gluon='yes' must be True, False or None"):
        moe_flat(x, ids, route, weights, int4_gluon="yes")
    fp8 = problem(ROUTINGS["one-token"], device, "fp8")[3]
    with pytest.raises(ValueError, match="int4_gluon=True needs INT4 experts at decode sizes"):
        moe_flat(x, ids, route, fp8, int4_gluon=True)
    with pytest.raises(ValueError, match="needs .*no Triton tile options, num_programs or ticket"):
        moe_flat(x, ids, route, weights, num_programs=2, int4_gluon=True)
    if device.type == "cpu":
        with pytest.raises(ValueError, match="needs an sm_90 GPU.*pass int4_gluon=None"):
            moe_flat(x, ids, route, weights, int4_gluon=True)


def test_the_word_layout_covers_the_tile_once_per_spread_value():
    """Each (weight row, word) of a BLOCK_N-row tile sits in exactly one thread, four times
    (the spread the conversion takes), warps stacked 16 rows apart."""
    layout = module.word_layout(module.BLOCK_N, module.NUM_WARPS)
    assert layout.shape == [module.BLOCK_N, module.WORDS, 4]
    bases = layout.reg_bases + layout.lane_bases + layout.warp_bases
    assert len(bases) == (module.BLOCK_N * module.WORDS * 4).bit_length() - 1
    spanned = {tuple(sum(b[d] for b, bit in zip(bases, f"{i:0{len(bases)}b}"[::-1], strict=True)
                         if bit == "1") for d in range(3))
               for i in range(2 ** len(bases))}  # fmt: skip
    assert len(spanned) == 2 ** len(bases)  # every index a distinct element: a bijection
    assert layout.warp_bases == [[16 << w, 0, 0] for w in range(module.NUM_WARPS.bit_length() - 1)]


def test_a_two_step_box_holds_each_step_as_a_one_step_box_does():
    """The two-group descriptor's (plane, step, row, word) view: the words of a weight row's
    step are where the one-step descriptor has them, so each step of a slot is read as one
    step's box is; a box is both planes' two steps."""
    experts, rows, k = 3, 256, 384
    values = torch.randint(0, 256, (experts, rows, k // 2), dtype=torch.uint8)
    one = module.weight_descriptor(values, 2)
    two = module.weight_descriptor(values, 2, groups=2)
    assert two.block_shape == [2, 2, module.BLOCK_N, module.WORDS]
    assert list(two.shape) == [experts * 2, k // module.BLOCK_K, rows // 2, module.WORDS]
    planes = one.base.unflatten(2, (k // module.BLOCK_K, module.WORDS))  # (plane, row, step, w)
    assert torch.equal(two.base, planes.transpose(1, 2))
    assert two.base.data_ptr() == one.base.data_ptr()  # a view: no copy of the experts
    assert two.strides[-1] == 1 and all(stride * 4 % 16 == 0 for stride in two.strides[:-1])


@pytest.mark.parametrize(("ring", "boxes", "problem_text"), [
    (module.Ring(groups=3), 1, "groups=3 must be 1 or 2"),
    (module.Ring(stages=0), 1, "stages=0 must be an integer >= 1"),
    (module.Ring(groups=2, stages=4), 2, "each of 4 programs an SM has; use stages <= 3"),
    (module.Ring(groups=1, stages=7), 2, "use stages <= 6"),  # the blocks' reserved KB
    (module.Ring(groups=2, stages=3, programs_per_sm=5), 2, "each of 5 programs .* <= 2"),
    (module.Ring(programs_per_sm=9), 1, "programs_per_sm=9 must be 1 to 8"),
])  # fmt: skip
def test_rings_the_kernels_cannot_take_are_refused(ring, boxes, problem_text):
    with pytest.raises(ValueError, match=problem_text):
        ring.check(boxes)
    module.Ring(groups=2, stages=3).check(2)  # gate/up's deepest that four programs fit
    module.Ring(groups=2, stages=4).check(1)  # down's slots are half the bytes


@pytest.mark.parametrize(("programs", "registers"), [(1, 255), (3, 168), (4, 128), (5, 96),
                                                     (8, 64)])  # fmt: skip
def test_a_ring_caps_registers_at_what_its_programs_leave(programs, registers):
    """65,536 registers an SM over the programs' 128 threads, rounded down to 8, 255 at most."""
    assert module.Ring(programs_per_sm=programs).max_registers == registers


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize(("gate_up_ring", "down_ring", "hidden"), [
    (module.Ring(groups=2, stages=3), module.Ring(groups=2, stages=4), HIDDEN),
    (module.Ring(), module.Ring(groups=2, stages=2), HIDDEN),
    (module.Ring(groups=2, stages=3), module.Ring(), ODD),  # gate/up's K odd too
    (module.Ring(programs_per_sm=5), module.Ring(groups=2, stages=2, programs_per_sm=5), HIDDEN),
])  # fmt: skip
def test_two_step_ring_slots_give_the_one_step_results(gate_up_ring, down_ring, hidden, splits):
    """Rings of two-step slots, or of five programs an SM (96 registers a thread), against the
    default one-step rings, on experts whose I (and H) is an odd number of steps (the last
    slot half past K), unsplit and split in two (the second split one step: half a slot)."""
    from kernels.moe.flat import FlatLayout  # flat imports int4_mma

    x, ids, route, weights = problem(ROUTINGS["six-tokens"], torch.device("cuda"),
                                     hidden=hidden, inter=ODD)  # fmt: skip
    shape = validate_moe_inputs(x, ids, route, weights)
    layout = FlatLayout.of(ids, route, shape, module.ROWS)
    sms = 2  # programs fewer than the items: they take several, the ring runs across them

    def call(rings):
        return module.moe_int4_mma(x, weights, layout, shape, sms, splits, splits,
                                   rings=rings)  # fmt: skip

    one_step = call((module.Ring(), module.Ring()))
    assert relative_error(call((gate_up_ring, down_ring)), one_step) < 1e-3
    assert relative_error(one_step, moe_reference(x, ids, route, weights)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 2])
def test_down_launched_with_pdl_gives_the_same_output(splits):
    """Down launched with PDL (after the split-K reduce, which lets it launch early, or after
    gate/up) fills its ring before it waits for h: the output is the same, bit for bit, run
    eagerly and replayed from a CUDA graph (which keeps the early launch as an edge)."""
    from kernels.moe.flat import FlatLayout  # flat imports int4_mma

    x, ids, route, weights = problem(ROUTINGS["six-tokens"], torch.device("cuda"))
    shape = validate_moe_inputs(x, ids, route, weights)
    layout = FlatLayout.of(ids, route, shape, module.ROWS)

    def call(down_pdl):
        return module.moe_int4_mma(x, weights, layout, shape, 2, splits, splits,
                                   down_pdl=down_pdl)  # fmt: skip

    expected = call(False)
    assert torch.equal(call(True), expected)
    call(True)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = call(True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("magnitude", [1.0, 1e6, 1e-6])
def test_gate_up_on_fp16_operands_gives_the_bf16_results(splits, magnitude):
    """Gate/up on fp16 operands (`fp16_rows`: each token row scaled by a power of two) against
    bf16 operands, with activations far beyond fp16's range and far below it, unsplit (the
    SiLU in the kernel) and split, on two-step and one-step rings, K an odd number of steps."""
    from kernels.moe.flat import FlatLayout  # flat imports int4_mma

    x, ids, route, weights = problem(ROUTINGS["six-tokens"], torch.device("cuda"),
                                     hidden=ODD, inter=INTER)  # fmt: skip
    x = (x.float() * magnitude).to(torch.bfloat16)
    shape = validate_moe_inputs(x, ids, route, weights)
    layout = FlatLayout.of(ids, route, shape, module.ROWS)
    for rings in ((module.Ring(groups=2, stages=2),) * 2, (module.Ring(),) * 2):

        def call(fp16, rings=rings):
            return module.moe_int4_mma(x, weights, layout, shape, 2, splits, splits,
                                       rings=rings, gate_up_fp16=fp16)  # fmt: skip

        on_fp16, on_bf16 = call(True), call(False)
        assert torch.isfinite(on_fp16).all()
        assert relative_error(on_fp16, on_bf16) < 2e-3
        assert relative_error(on_fp16, moe_reference(x, ids, route, weights)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(ROUTINGS))
def test_the_gluon_int4_kernels_match_flats_triton_ones(case):
    """Against flat's Triton kernels on the same INT4 experts (the same products, other
    summation orders) and against the reference on their values."""
    x, ids, route, weights = problem(ROUTINGS[case], torch.device("cuda"))
    gluon = moe_flat(x, ids, route, weights, int4_gluon=True)
    triton_kernels = moe_flat(x, ids, route, weights, int4_gluon=False)
    assert relative_error(gluon, triton_kernels) < 5e-3
    assert relative_error(gluon, moe_reference(x, ids, route, weights)) < 1e-2


@pytest.mark.parametrize("down_pdl", [False, True])
def test_the_split_k_reduce_lets_down_launch_early_only_where_down_uses_pdl(monkeypatch, down_pdl):
    """run_pipeline passes `down_pdl` to the reduce between gate/up's splits and down
    (LAUNCH_DEPENDENTS), which sm_90 needs; elsewhere down_pdl is never on."""
    import kernels.moe.launch as launch_module

    reduces = []
    monkeypatch.setattr(launch_module, "launch", lambda kernel, grid, *a, **k: reduces.append(k))
    monkeypatch.setattr(launch_module, "combine", lambda y, *a: y)
    shape = MoeShape(tokens=2, hidden=256, experts=4, inter=128, top_k=2)
    tiles = Tiles(block_m=8, block_n=64, block_k=128, split_k=None, num_warps=4, num_stages=4)
    launch_module.run_pipeline(torch.zeros(2, 256, dtype=torch.bfloat16), shape, tiles, 2, 1,
                               lambda *a: None, lambda *a: None, down_pdl=down_pdl)  # fmt: skip
    assert [k["LAUNCH_DEPENDENTS"] for k in reduces] == [down_pdl]
