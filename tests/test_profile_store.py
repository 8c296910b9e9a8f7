"""Profile runs answer `show` and `report` from the tables and facts stored beside their kernel
table (`analysis.profile_store`), exactly as the kernel table would, without reading it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import ROOT, assert_stored_answers_are_computed

import workbench
from workbench.analysis import profile
from workbench.analysis.collection import collect
from workbench.analysis.profile_store import backfill
from workbench.artifacts import read_meta
from workbench.cli import main

COMMITTED = sorted((ROOT / "raw").glob("profile-*"))
FIXTURES = Path(__file__).parent / "fixtures"


def test_the_committed_profiles_are_there():
    assert len(COMMITTED) >= 4


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_stored_answers_equal_the_computed_ones(path):
    """Each committed run (two single-process, two tensor-parallel whose stored means differ
    from the merged-rank prefill.csv and decode.csv) answers the same from either source."""
    assert_stored_answers_are_computed(path)


@pytest.fixture
def no_kernel_reads(monkeypatch):
    """Make reading any profile's kernel table fail the test."""

    def read(run):
        raise AssertionError(f"read the kernel table of {run.path}")

    monkeypatch.setattr(profile.ProfileResult, "kernels", property(read))


def test_show_of_the_committed_runs_reads_no_kernel_table(no_kernel_reads, capsys):
    assert main(["show", *map(str, COMMITTED)]) == 0
    for path in COMMITTED:
        assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Decode, per step" in out and "Rank skew at collectives" in out


def test_a_report_of_the_profiles_reads_no_kernel_table(no_kernel_reads, tmp_path, capsys):
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    argv = ["report", *map(str, COMMITTED), "--html", str(html), "--markdown", str(md)]
    assert main(argv) == 0, capsys.readouterr().err
    assert html.is_file() and md.is_file()
    runs = collect(COMMITTED).of("profile")
    assert len(runs) == len(COMMITTED)
    assert not any(run.ranks and run.rank_skew().empty for run in runs)
    assert all(run._kernels is None for run in runs)  # the lazy table was never filled


def test_the_kernel_table_is_read_when_a_method_needs_it():
    run = workbench.load(FIXTURES / "h200-model-2layers")
    assert run._kernels is None and "not read" in repr(run)
    top = run.top_kernels(3)
    assert run._kernels is not None and len(top) == 3


def test_a_run_without_a_summary_computes_from_its_kernels(tmp_path):
    """Runs written before the summary (the test fixtures) still load, from their kernels; and
    `backfill` gives them the summary, after which they answer the same without them."""
    path = shutil.copytree(FIXTURES / "h200-model-2layers", tmp_path / "run")
    assert profile.SUMMARY not in read_meta(path)
    old = workbench.load(path)
    text = old.text()
    assert old._kernels is not None
    assert backfill(path) == ["run.json"]  # one process: prefill.csv is the answer
    assert backfill(path) == []
    # Its decode.csv predates the gaps row: not the answer, so decode() still computes.
    assert read_meta(path)[profile.SUMMARY]["tables"] == {"prefill": "prefill"}
    assert_stored_answers_are_computed(path, lazy_only=False)
    assert workbench.load(path).text() == text


def test_replaced_kernels_are_answered_from_the_new_rows(tmp_path):
    path = shutil.copytree(FIXTURES / "h200-model-2layers", tmp_path / "run")
    backfill(path)
    run = workbench.load(path)
    run.kernels = run.kernels[run.kernels["phase"] == "prefill"]
    assert run.phases == ["prefill"]
    with pytest.raises(workbench.ArtifactError, match="no 'decode' kernels"):
        run.decode()
