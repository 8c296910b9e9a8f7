"""HTML reports open offline in a real headless Chromium: no console errors, no requests
leaving the file, every figure drawn. A screenshot is saved under test-artifacts/."""

import os
import re
import shutil
from pathlib import Path

import pytest
from helpers import CHROMIUM, ROOT, SCREENSHOTS, chromium_missing, open_in_chromium

import workbench

pytestmark = pytest.mark.skipif(
    chromium_missing(), reason=f"{CHROMIUM} not installed (apt-get install chromium)"
)


def _h200_runs() -> list[workbench.ProfileResult]:
    """The committed single-process 33,863-token H200 profiles of the stock kernel on bf16
    experts (the pair that differs only in CUDA graphs), CUDA-graph run first."""
    runs = [workbench.load(p) for p in (ROOT / "raw").glob("profile-dsv4-flash-tp2-stock-bf16-*")]
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


# ---- the seed report's tables: no sideways scrolling, human headers, long tables collapsed ---
SNAKE_CASE = re.compile(r"[a-z0-9]_[a-z0-9]", re.IGNORECASE)
SHOWN_ROWS = 15  # rows a table shows before the rest fold into "N more rows"
MEASURE_TABLES = """() => Array.from(document.querySelectorAll('table.data')).map(t => {
    const box = t.parentElement;
    return {
        overflow: Math.max(t.scrollWidth - t.clientWidth, box.scrollWidth - box.clientWidth),
        right: Math.max(t.getBoundingClientRect().right, box.getBoundingClientRect().right),
        page: document.body.getBoundingClientRect().right,
        width: t.getBoundingClientRect().width,
        hidden: t.closest('details:not([open])') !== null,
        rows: Array.from(t.querySelectorAll('tbody tr')).length,
        headers: Array.from(t.querySelectorAll('thead th')).map(h => h.innerText.trim()),
        caption: ((box === document.body ? t : box).previousElementSibling || {}).innerText || ''};
})"""


def measure_tables(page_path: Path) -> tuple[list[dict], bool]:
    """Every data table on a page in headless Chromium (shown or folded in a closed <details>,
    measured with every <details> opened): how far it overflows its box, its header texts, its
    rows and whether it is folded away; and whether the page itself scrolls sideways."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        folded = page.evaluate(MEASURE_TABLES)
        page.evaluate("() => document.querySelectorAll('details').forEach(d => d.open = true)")
        opened = page.evaluate(MEASURE_TABLES)
        sideways = page.evaluate(
            "() => document.documentElement.scrollWidth > document.documentElement.clientWidth"
        )
        browser.close()
    return [{**o, "hidden": f["hidden"]} for f, o in zip(folded, opened)], sideways


def test_seed_report_tables_fit_the_page_with_human_headers(tmp_path):
    from workbench.analysis.collection import collect
    from workbench.report.seed_report import build

    page = build(collect([ROOT / "raw", ROOT / "ncu"])).write(tmp_path / "report.html")
    tables, sideways = measure_tables(page)
    assert len(tables) > 20
    wide = [(t["caption"][:60], t["overflow"]) for t in tables
            if t["overflow"] > 0 or t["right"] > t["page"] + 1]  # fmt: skip
    assert wide == [] and not sideways, f"{len(wide)} tables scroll sideways: {wide}"
    snake = sorted({h for t in tables for h in t["headers"] if SNAKE_CASE.search(h)})
    assert snake == [], f"raw column names as headers: {snake}"
    long = [(t["caption"][:60], t["rows"]) for t in tables
            if not t["hidden"] and t["rows"] > SHOWN_ROWS]  # fmt: skip
    assert long == [], f"long tables shown whole: {long}"
