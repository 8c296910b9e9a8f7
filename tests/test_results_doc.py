"""`docs/results.md` is generated from the committed artifacts and must stay current; the
Markdown writer's tables are plain GitHub Markdown; `workbench report` takes --html, --markdown
or both, and refuses neither.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT

from workbench.analysis.collection import collect
from workbench.artifacts import write_run
from workbench.cli import main
from workbench.report.markdown import build_markdown, write_markdown
from workbench.report.markdown_page import anchor, markdown_table
from workbench.report.seed_tables import SECTIONS

RESULTS = ROOT / "docs" / "results.md"
PATHS = ("raw", "ncu")
REGENERATE = "run `workbench report raw ncu --markdown docs/results.md` (from the repository root)"


def test_results_doc_is_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerate from raw/ and ncu/ into tmp and compare with the committed file."""
    monkeypatch.chdir(ROOT)  # the document names artifacts by their paths from the root
    fresh = write_markdown(collect(PATHS), tmp_path / "results.md", PATHS, "docs/results.md")
    assert RESULTS.is_file(), f"docs/results.md is missing: {REGENERATE}"
    committed, made = RESULTS.read_text(), fresh.read_text()
    if committed != made:
        lines = difflib.unified_diff(
            committed.splitlines(True), made.splitlines(True), "docs/results.md", "regenerated"
        )
        diff = "".join(list(lines)[:60])
        pytest.fail(f"docs/results.md is stale: {REGENERATE}.\n{diff}")
    for section in SECTIONS:  # every section is there, and its contents link resolves
        assert f"\n## {section.title}\n" in made
        assert f"(#{anchor(section.title)})" in made


def test_markdown_tables_are_github_tables() -> None:
    frame = pd.DataFrame(
        {"ms": [0.12345, float("nan")], "note": ["a|b", "two\nlines"], "n": [33863, 1]},
        index=pd.Index(["x", "y"], name="row"),
    )
    lines = markdown_table(frame, digits={"ms": 3}).splitlines()
    assert lines[0] == "| row | ms | note | n |"
    assert lines[1] == "|---|---:|---|---:|"  # numbers right-aligned, text left
    assert lines[2] == "| x | 0.123 | a\\|b | 33,863 |"
    assert lines[3] == "| y |  | two lines | 1 |"  # a missing value is an empty cell
    plain = markdown_table(pd.DataFrame({"a": [1.0, 2.5]}), digits=1, trim=True)
    assert plain.splitlines()[2:] == ["| 1 |", "| 2.5 |"]  # no row-count index column


def test_report_writes_markdown_html_or_both_and_refuses_neither(
    experiments_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A real sweep and A/B run made here: the Markdown names them, and a section without
    artifacts names the command that makes them."""
    md, html = tmp_path / "out.md", tmp_path / "out.html"
    assert main(["report", str(experiments_dir), "--markdown", str(md), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert f"markdown: {md}" in out and f"report: {html}" in out
    text = md.read_text()
    assert text == build_markdown(collect([experiments_dir]), [experiments_dir], str(md))
    assert "## Things that did not help" in text and "| sweep | change |" in text
    assert "Absent from these artifacts: no profile artifact" in text
    assert "`workbench profile --prompt-tokens 33863" in text
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(experiments_dir)]) == 2
    assert "--html PATH, --markdown PATH or both" in capsys.readouterr().err


def test_readme_headline_table_is_the_generated_one() -> None:
    """The README's headline table is copied from docs/results.md, marked as such: it must
    still be there, verbatim, so the README never shows numbers the artifacts do not."""
    readme = (ROOT / "README.md").read_text().splitlines()
    start = readme.index("<!-- from docs/results.md -->") + 1
    table = []
    for line in readme[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    assert len(table) > 2, "no table after the <!-- from docs/results.md --> marker"
    assert "\n".join(table) in RESULTS.read_text(), (
        "README.md's headline table is not in docs/results.md: copy it again from there"
    )


def test_benchmark_tables_take_each_configuration_from_the_newest_run(tmp_path: Path) -> None:
    """Benchmark tables written by hand in the harnesses' format: a later run that re-measures
    one size replaces those rows and leaves the sizes only the earlier run holds; statuses
    other than ok ride in the time's cell."""

    def moe(ms: float, tokens: tuple[int, ...], status: str = "ok") -> pd.DataFrame:
        return pd.DataFrame(
            [{"kernel": "moe", "variant": v, "weight_dtype": "fp8", "tokens": t,
              "routing": "uniform", "ms": ms, "ratio_to_floor": 2.0, "status": status}
             for v in ("flat", "stock") for t in tokens]
        )  # fmt: skip

    dense = pd.DataFrame(
        [{"kernel": "dense-layer", "variant": v, "scenario": "m=1", "m": 1, "ms": ms,
          "status": "ok"} for v, ms in (("w8a16", 0.03), ("bf16", 0.04))]
    )  # fmt: skip
    old = {"kind": "bench-moe", "environment": {"date": "2026-01-01T00:00:00"}}
    new = {"kind": "bench-moe", "environment": {"date": "2026-01-02T00:00:00"}}
    write_run(tmp_path, "bench-moe-old", old, {"bench": moe(1.0, (6, 4096))})
    write_run(tmp_path, "bench-moe-new", new, {"bench": moe(0.5, (6,), "spills")})
    write_run(tmp_path, "bench-dense-x", {"kind": "bench-dense"}, {"bench": dense})
    text = build_markdown(collect([tmp_path]), [tmp_path])
    assert "| 6 | stock | 0.500 (spills) | 2.00 |" in text  # the newer run's T=6
    assert "| 4,096 | stock | 1.000 | 2.00 |" in text  # only the older run has T=4096
    assert text.index("| 6 | stock |") < text.index("| 6 | flat |")  # the seed's order
    assert "bench-moe-new` (not recorded, commit not recorded, tokens 6;" in text
    dense_row = "| M | bf16 (ms) | bf16 × floor | w8a16 (ms) | w8a16 × floor |"
    assert dense_row in text  # cuBLAS first, whatever order the rows came in
    assert "Accuracy against an fp32 GEMM" not in text  # no error columns: no accuracy table
