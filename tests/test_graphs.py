"""Graph-replayed kernels: attribution by position, the fallback to names, and idle time."""

from pathlib import Path

import pandas as pd
import pytest

import workbench
from workbench.analysis.graphs import GRAPH_POSITION, attribute_graph_replays, signature_of
from workbench.analysis.tables import graph_start_wait_us, idle_between_kernels_us
from workbench.analysis.trace import KERNEL_DTYPES, with_schema
from workbench.artifacts import read_table


def _table(rows: list[dict]) -> pd.DataFrame:
    base = {c: None for c in KERNEL_DTYPES} | {"graph": False, "phase": "decode"}
    return with_schema(pd.DataFrame([base | r for r in rows]))


SIGNATURE = signature_of(
    _table(
        [
            {"name": "gemm", "category": "Dense GEMM", "layer": 0, "start_us": 0, "dur_us": 1},
            {"name": "moe_k", "category": "MoE", "layer": 0, "start_us": 2, "dur_us": 1},
            {"name": "gemm", "category": "Dense GEMM", "layer": 1, "start_us": 4, "dur_us": 1},
        ]
    ).assign(source="range")
)


def _replay(correlation: int, names: list[str], t0: float) -> list[dict]:
    return [
        {
            "name": n,
            "category": "Other",
            "source": "default",
            "graph": True,
            "step": correlation,
            "correlation": correlation,
            "start_us": t0 + i,
            "dur_us": 0.5,
        }
        for i, n in enumerate(names)
    ]


def test_replays_that_match_take_category_and_layer_by_position():
    kernels = _table(
        _replay(7, ["gemm", "moe_k", "gemm"], 0) + _replay(8, ["gemm", "moe_k", "gemm"], 10)
    )
    out, summary = attribute_graph_replays(kernels, SIGNATURE)
    assert out["category"].tolist() == ["Dense GEMM", "MoE", "Dense GEMM"] * 2
    assert out["layer"].tolist() == [0, 0, 1] * 2
    assert set(out["source"]) == {GRAPH_POSITION}
    assert summary == {
        "graph_kernels": 6,
        "matched_by_position": 6,
        "replays": 2,
        "replays_fully_matched": 2,
        "signature_kernels": 3,
    }


def test_a_graph_that_differs_falls_back_to_names_with_a_warning():
    kernels = _table(_replay(7, ["gemm", "other_k", "gemm"], 0))
    with pytest.warns(UserWarning, match="2 of 3 graph-replayed kernels matched"):
        out, summary = attribute_graph_replays(kernels, SIGNATURE)
    assert out["source"].tolist() == [GRAPH_POSITION, "default", GRAPH_POSITION]
    assert out["category"].tolist() == ["Dense GEMM", "Other", "Dense GEMM"]
    assert summary["replays_fully_matched"] == 0


def test_eager_kernels_are_left_alone():
    kernels = _table(
        [{"name": "gemm", "category": "MoE", "source": "range", "start_us": 0, "dur_us": 1}]
    )
    out, summary = attribute_graph_replays(kernels, SIGNATURE)
    assert out.equals(kernels) and summary["graph_kernels"] == 0


def test_idle_time_merges_overlapping_kernels():
    rows = pd.DataFrame({"start_us": [0.0, 5.0, 6.0, 20.0], "dur_us": [10.0, 2.0, 6.0, 1.0]})
    assert idle_between_kernels_us(rows) == 8.0  # busy [0, 12) and [20, 21)
    assert idle_between_kernels_us(rows.iloc[:0]) == 0.0


def test_the_wait_before_a_steps_graph_is_the_gap_after_its_eager_kernels():
    # Two input copies, then the graph 40 us after the later one ends.
    step = pd.DataFrame({"start_us": [0.0, 2.0, 43.0, 50.0], "dur_us": [1.0, 1.0, 5.0, 5.0],
                         "graph": [False, False, True, True]})  # fmt: skip
    assert graph_start_wait_us(step) == 40.0
    assert graph_start_wait_us(step.assign(graph=False)) == 0.0  # eager: no graph to wait for
    assert graph_start_wait_us(step.iloc[2:]) == 0.0  # nothing ahead of the graph


# ---- on the real H200 fixture: 2 layers, 4 decode steps replayed from one CUDA graph ----
FIXTURE = Path(__file__).parent / "fixtures" / "h200-graphs-2layers"


@pytest.fixture(scope="module")
def graph_run():
    run = workbench.load(FIXTURE)
    signature = read_table(FIXTURE, run.meta, "graph_signature")
    raw = workbench.load_trace(FIXTURE / "trace.json.gz")
    return run, signature, raw


def test_real_replays_match_the_eager_signature_in_full(graph_run):
    run, signature, raw = graph_run
    kernels, summary = attribute_graph_replays(raw.kernels, signature)
    assert summary["replays"] == summary["replays_fully_matched"] == 4
    assert (
        summary["matched_by_position"]
        == summary["graph_kernels"]
        == int(raw.kernels["graph"].sum())
    )
    decode = kernels[kernels["phase"] == "decode"]
    assert set(decode.loc[decode["graph"], "source"]) == {GRAPH_POSITION}
    assert set(decode.loc[decode["graph"], "layer"].dropna()) == {0, 1}
    # The saved run holds exactly this attribution. It was saved before `waited_us` existed:
    # one kernel, cuBLAS's split-K reduce, started under PDL before its GEMM ended and now
    # starts where the GEMM ended; every other start and duration is as saved.
    waited = (raw.kernels["waited_us"] > 0).to_numpy()
    assert run.kernels["waited_us"].isna().all() and waited.sum() == 1
    assert "splitKreduce" in raw.kernels.loc[waited, "name"].iloc[0]
    later = ["rank", "waited_us", "start_us", "dur_us"]
    assert kernels.drop(columns=later).equals(run.kernels.drop(columns=later))
    times = ["start_us", "dur_us"]
    assert kernels.loc[~waited, times].equals(run.kernels.loc[~waited, times])


def test_a_graph_that_differs_from_its_signature_falls_back_to_names(graph_run):
    _, signature, raw = graph_run
    changed = signature.copy()
    changed.loc[10:29, "name"] = "a_kernel_the_eager_step_never_ran"
    with pytest.warns(UserWarning, match=r"of \d+ graph-replayed kernels matched"):
        kernels, summary = attribute_graph_replays(raw.kernels, changed)
    assert 0 < summary["matched_by_position"] < summary["graph_kernels"]
    unmatched = kernels[kernels["graph"] & (kernels["source"] != GRAPH_POSITION)]
    assert len(unmatched) == summary["graph_kernels"] - summary["matched_by_position"]
    assert set(unmatched["source"]) <= {"kernel", "default"}


def test_an_external_view_of_graph_replays_rests_on_names(graph_run):
    _, _, raw = graph_run  # read as an external trace: no signature
    replayed = raw.kernels[raw.kernels["graph"]]
    assert len(replayed) > 0 and set(replayed["source"]) <= {"kernel", "default"}
    assert "replayed from CUDA graphs, by name" in raw.decode_caption()
    assert raw.attribution().sum().sum() == len(raw.kernels)
