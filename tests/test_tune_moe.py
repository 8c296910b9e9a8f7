"""scripts/tune_moe.py's choice of cases and its setting of the Gluon INT4 decode kernels' rings,
on the CPU (the timing itself needs a GPU)."""

import importlib.util
from pathlib import Path

import pytest

from kernels.moe import int4_mma

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tune_moe.py"


@pytest.fixture(scope="module")
def tune_moe():
    spec = importlib.util.spec_from_file_location("tune_moe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_grid_runs_on_any_size_the_cases_name(tune_moe):
    cases = tune_moe.chosen_cases(["int4:1", "int4:64"], "int4-decode-rings", w8a8=False)
    assert [(fmt, tokens) for fmt, tokens, _ in cases] == [("int4", 1), ("int4", 64)]
    assert all(grid is tune_moe.INT4_DECODE_RINGS for _, _, grid in cases)


def test_without_a_grid_the_cases_filter_the_variants_own(tune_moe):
    assert [(f, t) for f, t, _ in tune_moe.chosen_cases(["int4:6"], None, w8a8=False)] == [
        ("int4", 6)
    ]
    assert len(tune_moe.chosen_cases(None, None, w8a8=False)) == len(tune_moe.CASES)


@pytest.mark.parametrize(("names", "grid", "problem"), [
    (["int4:1"], None, "--case int4:1: not a case of this variant .*with --grid any size runs"),
    (["int9:1"], "int4-decode-rings", "--case int9:1: use FMT:TOKENS"),
    (["int4:0"], "int4-decode-rings", "--case int4:0: use FMT:TOKENS"),
    (None, "int4-decode-rings", "--grid needs the cases to run it on"),
])  # fmt: skip
def test_cases_it_cannot_run_are_refused_by_name(tune_moe, names, grid, problem):
    with pytest.raises(ValueError, match=problem):
        tune_moe.chosen_cases(names, grid, w8a8=False)


def rings() -> tuple:
    """The INT4 decode kernels' settings as a call reads them: gate/up's and down's rings,
    whether down launches with PDL, whether gate/up takes fp16 operands."""
    return int4_mma.GATE_UP_RING, int4_mma.DOWN_RING, int4_mma.DOWN_PDL, int4_mma.GATE_UP_FP16


def test_ring_settings_hold_for_the_call_and_are_put_back(tune_moe):
    before = rings()
    with tune_moe.int4_rings({"int4_down": (2, 4), "block_n": 64}) as options:
        assert options == {"block_n": 64}
        assert rings() == (before[0], int4_mma.Ring(groups=2, stages=4), *before[2:])
    assert rings() == before
    with tune_moe.int4_rings({"int4_gate_up": (1, 4, 3)}):
        assert rings()[0].programs_per_sm == 3
    assert rings() == before
    with tune_moe.int4_rings({"int4_down_pdl": True}):
        assert rings()[2] is True
    assert rings() == before
    with tune_moe.int4_rings({"int4_gate_up_fp16": True}) as options:
        assert options == {} and rings()[3] is True
    assert rings() == before
    with pytest.raises(TypeError), tune_moe.int4_rings({"int4_gate_up": (2, 3), "int4_down": 7}):
        pass  # a malformed ring: the one set before it is put back too
    assert rings() == before


def test_the_fp16_grid_alternates_bf16_and_fp16_gate_up(tune_moe):
    """Alternated, bf16 first and last, so the run's drift falls on both settings alike."""
    grid = tune_moe.GRIDS["int4-decode-fp16"]
    assert grid[::2] == [{"int4_gate_up_fp16": False}] * 4
    assert grid[1::2] == [{"int4_gate_up_fp16": True}] * 3
