"""Notebooks run headless (nbclient) on the CPU from artifacts, with no error output, and one
exported to HTML opens offline in a real headless Chromium with every figure drawn.

01 reads the committed H200 profiles (on a GPU it profiles live, so it is skipped there); 02
reads the committed ncu reports (skipped until they are committed; without them it must stop
with the capture command); 03 reads a real sweep and A/B run made here at a tiny shape, and the
committed ones once they exist.
"""

import time

import pytest
import torch
from helpers import (
    CHROMIUM,
    ROOT,
    SCREENSHOTS,
    chromium_missing,
    open_in_chromium,
    outputs,
    printed,
    real_reports,
    run_notebook,
)
from nbclient.exceptions import CellExecutionError

from workbench.analysis.ncu_catalog import NcuCatalog
from workbench.cli import main
from workbench.report.html import write_atomic
from workbench.report.notebook_export import PLOTLY, WIDGET_VIEW, to_html

NOTEBOOKS = ROOT / "notebooks"
ON_GPU = torch.cuda.is_available()
COMMITTED_SWEEPS = sorted((ROOT / "raw").glob("sweep-*/")) + sorted((ROOT / "raw").glob("ab-*/"))
TIMES: dict[str, float] = {}


def _run(name: str) -> object:
    begun = time.perf_counter()
    notebook = run_notebook(NOTEBOOKS / name)
    TIMES[name] = time.perf_counter() - begun
    assert not outputs(notebook, "error")
    assert not [o for o in outputs(notebook, "stream") if o.get("name") == "stderr"
                and "Traceback" in o.get("text", "")]  # fmt: skip
    return notebook


def test_every_notebook_has_a_test():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == [
        "01-kernel-time.ipynb", "02-ncu.ipynb", "03-experiments.ipynb",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def kernel_time():
    """01 executed once, for its own checks and for the export."""
    if ON_GPU:
        pytest.skip("on a GPU the notebook profiles live, minutes per run")
    return _run("01-kernel-time.ipynb")


def test_kernel_time_notebook(kernel_time):
    text = printed(kernel_time)
    runs = len(list((ROOT / "raw").glob("profile-dsv4-flash-tp2-*-33863t-*/")))
    assert f"Showing {runs} runs from the committed H200 artifacts" in text
    assert "425856 of 425856 replayed kernels attributed by position" in text
    assert len([o for o in outputs(kernel_time) if PLOTLY in o.get("data", {})]) == 2
    assert [o for o in outputs(kernel_time) if WIDGET_VIEW in o.get("data", {})]


@pytest.mark.skipif(not real_reports(), reason="no Nsight Compute report committed under ncu/")
def test_ncu_notebook_from_the_committed_reports():
    notebook = _run("02-ncu.ipynb")
    text = printed(notebook)
    assert f"Showing {len(real_reports())} Nsight Compute reports" in text
    assert "the seed's table below is for stock" in text
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs(notebook))
    for tokens in NcuCatalog.load(real_reports()).tokens("stock"):  # the seed's: 6 and 4096
        assert f"{tokens} tokens, gate_up" in html
    assert "model-decode-step-stock-T1-analysed.ncu-rep.xz: 134 launches of 28 kernels" in text
    assert "_stock_down_kernel" in html  # the step's longest kernel, first in its table
    assert len([o for o in outputs(notebook) if PLOTLY in o.get("data", {})]) == 5


def test_ncu_notebook_without_reports_names_the_capture(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_NCU_REPORTS", str(tmp_path / "*.ncu-rep"))
    with pytest.raises(CellExecutionError, match="workbench ncu moe stock --tokens 6 4096"):
        run_notebook(NOTEBOOKS / "02-ncu.ipynb")


def test_experiments_notebook_from_a_real_cpu_sweep(experiments_dir, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RAW", str(experiments_dir))
    notebook = _run("03-experiments.ipynb")
    assert f"Showing 1 sweeps and 1 A/B runs from {experiments_dir}" in printed(notebook)
    plain = "".join(o.get("data", {}).get("text/plain", "") for o in outputs(notebook))
    assert "num_stages=1 -> 2" in plain  # the "did not help" table
    assert "ratio" in plain and "significant" in plain  # the A/B table
    assert len([o for o in outputs(notebook) if PLOTLY in o.get("data", {})]) == 1
    assert [o for o in outputs(notebook) if WIDGET_VIEW in o.get("data", {})]


@pytest.mark.skipif(not COMMITTED_SWEEPS, reason="no sweep or A/B run committed under raw/")
def test_experiments_notebook_from_the_committed_runs(monkeypatch):
    monkeypatch.delenv("WORKBENCH_RAW", raising=False)
    assert f"from {ROOT / 'raw'}" in printed(_run("03-experiments.ipynb"))


@pytest.mark.skipif(chromium_missing(), reason=f"{CHROMIUM} not installed")
def test_exported_notebook_opens_offline(kernel_time, tmp_path):
    page = write_atomic(tmp_path / "01.html", to_html(kernel_time, "01-kernel-time"))
    seen = open_in_chromium(page, SCREENSHOTS / "notebook-01-kernel-time.png")
    assert seen["errors"] == [] and seen["remote"] == []
    figures = len([o for o in outputs(kernel_time) if PLOTLY in o.get("data", {})])
    assert seen["figures"] == seen["drawn"] == figures
    assert page.read_text().count("plotly.js v") == 1  # inlined once
    assert "Interactive controls (ipywidgets) need a running kernel" in seen["text"]
    assert "Prefill and decode by category" in seen["text"]


def test_notebooks_take_under_three_minutes_together():
    if not TIMES:
        pytest.skip("no notebook ran")
    assert sum(TIMES.values()) < 180, TIMES


def test_export_command_writes_a_page_without_remote_scripts(tmp_path, capsys):
    page = tmp_path / "02.html"
    assert main(["export-notebook", str(NOTEBOOKS / "02-ncu.ipynb"), "--html", str(page)]) == 0
    said = capsys.readouterr()
    assert f"notebook: {page}" in said.out and "add --execute" in said.err
    html = page.read_text()
    assert "<script src=" not in html and "cdnjs" not in html and "unpkg" not in html
    assert "NcuExplorer" in html  # the code cells, unexecuted
    assert "without results" in html and "--execute" in html  # and the page says so
    assert main(["export-notebook", str(tmp_path / "no.ipynb"), "--html", str(page)]) == 2
    assert "does not exist" in capsys.readouterr().err
