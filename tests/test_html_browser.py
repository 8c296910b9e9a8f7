"""HTML reports open offline in a real headless Chromium: no console errors, no requests
leaving the file, every figure drawn. A screenshot is saved under test-artifacts/."""

import os
import shutil
from pathlib import Path

import pytest

import workbench

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).parents[1]
SCREENSHOTS = ROOT / "test-artifacts"

if not Path(CHROMIUM).exists():
    # CI installs Debian's chromium (.ci/run); elsewhere the browser tests need it too.
    pytestmark = pytest.mark.skipif(
        not os.environ.get("CI"), reason=f"{CHROMIUM} not installed (apt-get install chromium)"
    )


def open_in_chromium(page_path: Path, screenshot: Path) -> dict:
    """Load a page from disk; report console errors, non-file requests, figures and SVGs."""
    from playwright.sync_api import sync_playwright

    errors, remote = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "request", lambda r: remote.append(r.url) if not r.url.startswith("file:") else None
        )
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        page.wait_for_function(
            "Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".every(d => d.querySelector('svg.main-svg'))",
            timeout=30_000,
        )
        found = page.evaluate(
            "() => ({figures: document.querySelectorAll('.plotly-graph-div').length,"
            " drawn: Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".filter(d => d.querySelectorAll('svg.main-svg g.trace').length > 0).length,"
            " tables: document.querySelectorAll('table.data').length,"
            " text: document.body.innerText})"
        )
        screenshot.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
        browser.close()
    return {"errors": errors, "remote": remote, **found}


def _h200_runs() -> list[workbench.ProfileResult]:
    """The committed 33,863-token H200 profiles, CUDA-graph run first."""
    runs = [workbench.load(p) for p in (ROOT / "raw").glob("profile-dsv4-flash-tp2-*-33863t-*")]
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
