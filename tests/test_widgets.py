"""The notebook explorer: changing a control re-draws its FigureWidgets in place."""

from pathlib import Path

import pytest

import workbench
from workbench.widgets import ProfileExplorer

RAW = Path(__file__).parents[1] / "raw"


@pytest.fixture(scope="module")
def explorer():
    runs = [workbench.load(p) for p in sorted(RAW.glob("profile-dsv4-flash-tp2-*"))]
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
