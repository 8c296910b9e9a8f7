"""The notebook explorers: changing a control re-draws their FigureWidgets in place."""

from pathlib import Path

import pytest
from helpers import stand_in_reports, write_sweep

import workbench
from workbench.analysis.ncu_catalog import NcuCatalog
from workbench.widgets import NcuExplorer, ProfileExplorer, SweepExplorer

RAW = Path(__file__).parents[1] / "raw"


@pytest.fixture(scope="module")
def explorer():
    runs = [workbench.load(p) for p in sorted(RAW.glob("profile-dsv4-flash-tp2-stock-*"))]
    runs = [r for r in runs if not r.meta["params"].get("tp")]  # one process: graphs vs eager
    return ProfileExplorer(
        {("graphs" if r.meta["params"]["cuda_graphs"] else "eager"): r for r in runs}
    )


def test_controls_redraw_the_same_figures(explorer):
    bars, timeline = explorer.bars, explorer.timeline
    explorer.run.value, explorer.phase.value = "graphs", "prefill"
    prefill = list(bars.data[0].y)
    assert list(bars.data[0].x) == ["MoE", "Dense GEMM", "Sparse attention", "All-reduce", "Other"]
    assert prefill[0] == pytest.approx(explorer.runs["graphs"].prefill().loc["MoE", "time_ms"])

    explorer.phase.value = "decode"
    assert explorer.metric.value == "mean_ms"
    assert list(bars.data[0].y)[0] == pytest.approx(
        explorer.runs["graphs"].decode().loc["MoE", "mean_ms"]
    )
    explorer.run.value = "eager"
    explorer.step.value = 7
    assert explorer.bars is bars and explorer.timeline is timeline  # updated, not replaced
    assert "Decode step 7" in timeline.layout.title.text
    assert sum(len(t.x) for t in timeline.data) == len(
        explorer.runs["eager"].kernels.query("phase == 'decode' and step == 7")
    )


def test_ncu_explorer_redraws_in_place():
    explorer = NcuExplorer(NcuCatalog(stand_in_reports()))
    stalls, hotspots, compare = explorer.stalls, explorer.hotspots, explorer.compare
    assert explorer.variant.value == "stock" and explorer.tokens.options == ("6", "4096")
    assert [label for label, _ in explorer.launch.options] == [
        "6 tokens, gate_up",
        "6 tokens, down",
    ]
    assert list(stalls.data[0].y)[-1] == "barrier"  # most cycles per issue, drawn on top
    assert "6 tokens, gate_up" in stalls.layout.title.text

    explorer.tokens.value = "4096"
    explorer.launch.value = 1
    explorer.metric.value = "share_pct"
    assert "4096 tokens, down (stock): stalls, share_pct" in stalls.layout.title.text
    assert sum(stalls.data[0].x) == pytest.approx(100.0)
    assert list(hotspots.data[0].y)[-1] == "stock.py:40"  # hottest line on top

    explorer.variant.value = "flat"
    assert explorer.tokens.options == ("6",) and explorer.tokens.value == "6"
    explorer.summary_row.value = "Duration (us)"
    bars = {bar.name: list(bar.y) for bar in compare.data}
    assert bars == {"stock": [41.0, 20.5], "flat": [pytest.approx(32.8), pytest.approx(16.4)]}
    assert (explorer.stalls, explorer.hotspots, explorer.compare) == (stalls, hotspots, compare)


def test_sweep_explorer_redraws_in_place(tmp_path):
    write_sweep(tmp_path, [(1, 1, "ok", 1.0), (1, 512, "ok", 2.0),
                           (2, 1, "ok", 0.9), (2, 512, "ok", 2.5),
                           (4, 1, "spills", 1.2), (4, 512, "timeout", None)])  # fmt: skip
    explorer = SweepExplorer({"rows sweep": workbench.load_sweep(tmp_path)})
    bars, bands = explorer.bars, explorer.bands
    assert explorer.tokens.options == (1, 512) and explorer.tokens.value == 1
    assert list(bars.data[0].x) == ["rows=1", "rows=2", "rows=4"]
    assert list(bars.data[0].y) == [1.0, 0.9, 1.2]
    assert list(bars.data[0].marker.color) == ["#1f77b4", "#1f77b4", "#ff7f0e"]  # ok, spills
    assert len(bands.data) == 6  # a band and a line per value

    explorer.tokens.value = 512
    explorer.metric.value = "change_pct"
    assert list(bars.data[0].y)[:2] == [0.0, pytest.approx(25.0)]
    assert list(bars.data[0].text) == ["", "", "timeout"]
    assert "change_pct at 512 tokens" in bars.layout.title.text
    assert explorer.bars is bars and explorer.bands is bands


def test_sweep_explorer_reads_a_real_sweep(experiments_dir):
    sweeps = {p.name: workbench.load_sweep(p) for p in experiments_dir.glob("sweep-*")}
    explorer = SweepExplorer(sweeps)
    explorer.tokens.value = 17
    rows = explorer.rows()
    assert list(explorer.bars.data[0].y) == pytest.approx(list(rows["ms"]))
    assert explorer.bars.data[0].error_y.array is not None


TP_RUNS = sorted(RAW.glob("profile-dsv4-flash-tp2-*-tp2-*"))


@pytest.mark.skipif(not TP_RUNS, reason="no tensor-parallel profile committed under raw/")
def test_the_timeline_of_a_tensor_parallel_run_shows_one_rank():
    run = workbench.load(TP_RUNS[0])
    explorer = ProfileExplorer({"tp": run})
    explorer.step.value = 3
    assert "Decode step 3, rank 0" in explorer.timeline.layout.title.text
    rank0 = run.kernels.query("phase == 'decode' and step == 3 and rank == 0")
    assert sum(len(t.x) for t in explorer.timeline.data) == len(rank0)
