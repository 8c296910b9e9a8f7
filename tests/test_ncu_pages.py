"""`workbench ncu-report` on the committed reports: pages a reader can scroll (ncu's rule messages
wrapped at a readable width, each launch's rules folded into its own block, the overview first),
the diff against a baseline in the text and on the page (launches paired without select(),
numbers rounded), and source files named as a reader knows them rather than by the capture
machine's paths. The page tests measure the pages in a real headless Chromium.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import CHROMIUM, ROOT, SCREENSHOTS, chromium_missing

from workbench.cli import main

NCU = ROOT / "ncu"
KERNEL = NCU / "moe-stock-T6-fmtfp8.ncu-rep.xz"  # six launches of one MoE call
FLAT = NCU / "moe-flat-T6-fmtfp8.ncu-rep.xz"  # five launches, some of other names
STEP = NCU / "model-decode-step-stock-T1-analysed.ncu-rep.xz"  # a decode step: 134 launches
# Page heights with every <details> closed, in CSS pixels at a 1300 px wide window. Before the
# rules were folded per launch: 38,208 (KERNEL) and 457,411 (STEP).
KERNEL_PAGE_MAX = 15_000
STEP_PAGE_MAX = 25_000
CAPTURE_PATHS = re.compile(r"/\.snap/|site-packages/|/root/|/opt/torch")
DECIMAL = re.compile(r"\d[\d,]*\.\d+")


def unrounded(text: str) -> list[str]:
    """Numbers with more than 3 significant digits after their integer part, a percentage's one
    decimal aside (pandas prints 0.096 as -0.096000 and 410.75 as 410.750000)."""
    found = []
    for number in DECIMAL.findall(text):
        whole, _, fraction = number.replace(",", "").partition(".")
        digits = (whole + fraction).lstrip("0")
        if len(fraction) > 1 and len(digits) > max(3, len(whole.lstrip("0"))):
            found.append(number)
    return found


pytestmark = pytest.mark.skipif(
    not all(p.is_file() for p in (KERNEL, FLAT, STEP)), reason="the committed ncu/ reports"
)
needs_chromium = pytest.mark.skipif(
    chromium_missing(), reason=f"{CHROMIUM} not installed (apt-get install chromium)"
)


def measure(page_path: Path, screenshot: Path) -> dict:
    """Open a page in headless Chromium: its height with every <details> closed and open, the
    narrowest wrapped prose cell (a rule message) once open, the blocks, the text and errors."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        page.wait_for_function(
            "Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".every(d => d.querySelector('svg.main-svg'))",
            timeout=30_000,
        )
        closed = page.evaluate("document.documentElement.scrollHeight")
        text = page.evaluate("document.body.innerText")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot))
        blocks = page.evaluate("document.querySelectorAll('details').length")
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        opened = page.evaluate("document.documentElement.scrollHeight")
        narrowest = page.evaluate(
            "Math.min(...Array.from(document.querySelectorAll('table.wrap td:last-child'))"
            ".map(td => td.getBoundingClientRect().width))"
        )
        browser.close()
    return {"closed": closed, "open": opened, "narrowest": narrowest, "blocks": blocks,
            "text": text, "errors": errors}  # fmt: skip


def run(capsys: pytest.CaptureFixture, *argv: str | Path) -> str:
    code = main(["ncu-report", *map(str, argv)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


@needs_chromium
def test_kernel_report_page_is_short_and_its_rules_readable(tmp_path, capsys):
    page = tmp_path / "kernel.html"
    run(capsys, KERNEL, "--html", page)
    seen = measure(page, SCREENSHOTS / "ncu-kernel-report.png")
    assert seen["errors"] == []
    assert seen["closed"] < KERNEL_PAGE_MAX, f"page is {seen['closed']} px tall"
    assert seen["narrowest"] > 250, "rule messages squeezed into a narrow column"
    assert seen["blocks"] >= 6  # a block per launch with rules
    rules = seen["text"].split("ncu rules", 2)[-1]
    assert rules.index("rules to act on") < rules.index("_counts_kernel @ wb:moe:stock:T=6:")
    body = page.read_text().split("<body>", 1)[1].split('id="capture"')[0]  # not the command
    assert "kernels/moe/stock.py" in body and not CAPTURE_PATHS.search(body)


@needs_chromium
def test_decode_step_page_is_short(tmp_path, capsys):
    page = tmp_path / "step.html"
    run(capsys, STEP, "--html", page)
    seen = measure(page, SCREENSHOTS / "ncu-decode-step-report.png")
    assert seen["errors"] == []
    assert seen["closed"] < STEP_PAGE_MAX, f"page is {seen['closed']} px tall"
    assert seen["narrowest"] > 250
    assert "All 134 launches" in seen["text"] and "The other 126 launches" in seen["text"]


@needs_chromium
def test_flat_against_stock_in_text_and_on_the_page(tmp_path, capsys):
    page = tmp_path / "diff.html"
    out = run(capsys, FLAT, "--baseline", KERNEL, "--html", page)
    diff = out.split("Change from baseline", 1)[1]
    assert "_flat_gate_up_kernel @ wb:moe:flat:T=6, against _stock_gate_up_kernel" in diff
    only_stock = "Only in moe-stock-T6-fmtfp8.ncu-rep.xz (not compared): "
    assert "_offsets_serial_kernel" in diff.split(only_stock, 1)[1].split("\n", 1)[0]
    only_flat = "Only in moe-flat-T6-fmtfp8.ncu-rep.xz (not compared): "
    assert "_small_layout_kernel" in diff.split(only_flat, 1)[1].split("\n", 1)[0]
    assert unrounded(diff) == [], "the diff prints unrounded floats"
    seen = measure(page, SCREENSHOTS / "ncu-diff-report.png")
    assert seen["errors"] == [] and seen["closed"] < KERNEL_PAGE_MAX
    assert "Change from moe-stock-T6-fmtfp8.ncu-rep.xz" in seen["text"]
    assert "_flat_down_kernel @ wb:moe:flat:T=6, against _stock_down_kernel" in seen["text"]
    assert unrounded(seen["text"].split("Change from", 1)[1].split("Warp stalls")[0]) == []


def test_select_narrows_the_report_and_its_baseline(capsys):
    out = run(capsys, FLAT, "--baseline", KERNEL, "--select", "gate_up")
    diff = out.split("Change from baseline", 1)[1]
    assert "_flat_gate_up_kernel @ wb:moe:flat:T=6" in diff and "down_kernel" not in diff
    assert "Only in" not in diff
    assert main(["ncu-report", str(FLAT), "--baseline", str(KERNEL), "--select", "nope"]) == 2
    assert "no launch label matches 'nope'" in capsys.readouterr().err
