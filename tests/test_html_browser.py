"""HTML reports open offline in a real headless Chromium: no console errors, no requests
leaving the file, every figure drawn. A screenshot is saved under test-artifacts/."""

import os
import shutil
from pathlib import Path

import pytest
from helpers import CHROMIUM, ROOT, SCREENSHOTS, chromium_missing, open_in_chromium

import workbench

pytestmark = pytest.mark.skipif(
    chromium_missing(), reason=f"{CHROMIUM} not installed (apt-get install chromium)"
)


def _h200_runs() -> list[workbench.ProfileResult]:
    """The committed single-process 33,863-token H200 profiles of the stock kernel, CUDA-graph
    run first."""
    runs = [workbench.load(p) for p in (ROOT / "raw").glob("profile-dsv4-flash-tp2-stock-*")]
    runs = [r for r in runs if not r.meta["params"].get("tp")]  # one process: graphs vs eager
    return sorted(runs, key=lambda r: not r.meta["params"]["cuda_graphs"])


def test_h200_profile_report_renders_offline(tmp_path):
    page = _h200_runs()[0].to_html(tmp_path / "profile.html")
    assert page.stat().st_size < 10 * 2**20
    seen = open_in_chromium(page, SCREENSHOTS / "profile-report.png")
    assert seen["errors"] == [] and seen["remote"] == []
    assert seen["figures"] == 2 and seen["drawn"] == 2
    assert seen["tables"] >= 4
    for heading in ("Prefill", "Decode, per step", "Top kernels", "NVIDIA H200"):
        assert heading in seen["text"]


def test_comparison_report_renders_offline(tmp_path):
    graphs, eager = _h200_runs()
    page = graphs.compare(eager, labels=["CUDA graphs", "eager"]).to_html(tmp_path / "cmp.html")
    seen = open_in_chromium(page, SCREENSHOTS / "compare-report.png")
    assert seen["errors"] == [] and seen["remote"] == []
    assert seen["figures"] == seen["drawn"] == 1
    assert "Gaps between kernels" in seen["text"]


def test_external_trace_report_renders_offline(tmp_path):
    trace = workbench.load_trace(ROOT / "tests/fixtures/hf-mixtral-h200.json.gz", label="mixtral")
    seen = open_in_chromium(trace.to_html(tmp_path / "t.html"), SCREENSHOTS / "trace-report.png")
    assert seen["errors"] == [] and seen["remote"] == []
    assert seen["figures"] == seen["drawn"] == 2


def test_browser_is_available_in_ci():
    if os.environ.get("CI"):
        assert shutil.which("chromium") or Path(CHROMIUM).exists()
