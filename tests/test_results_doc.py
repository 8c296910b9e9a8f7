"""`docs/results.md` is generated from the committed artifacts and must stay current; the
Markdown writer's tables are plain GitHub Markdown; `workbench report` takes --html, --markdown
or both, and refuses neither.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT, committed_artifacts

from workbench.analysis.collection import collect
from workbench.artifacts import write_run
from workbench.cli import main
from workbench.report.markdown import build_markdown, write_markdown
from workbench.report.markdown_page import anchor, markdown_table
from workbench.report.seed_tables import SECTIONS

RESULTS = ROOT / "docs" / "results.md"
SNAKE_CASE = re.compile(r"[a-z0-9]_[a-z0-9]", re.IGNORECASE)
PATHS = ("raw", "ncu")
REGENERATE = "run `workbench report raw ncu --markdown docs/results.md` (from the repository root)"


def test_results_doc_is_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerate from the artifacts committed in raw/ and ncu/ into tmp and compare with the
    committed file."""
    monkeypatch.chdir(ROOT)  # the document names artifacts by their paths from the root
    tracked = [top.relative_to(ROOT) for top in committed_artifacts()]  # not a user's runs
    fresh = write_markdown(collect(tracked), tmp_path / "results.md", PATHS, "docs/results.md")
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
        {"median (ms)": [0.12345, float("nan")], "note": ["a|b", "two\nlines"],
         "tokens": [33863, 1]},
        index=pd.Index(["x", "y"], name="row"),
    )  # fmt: skip
    lines = markdown_table(frame).splitlines()
    assert lines[0] == "| row | median (ms) | note | tokens |"
    assert lines[1] == "|---|---:|---|---:|"  # numbers right-aligned, text left
    assert lines[2] == "| x | 0.123 | a\\|b | 33,863 |"
    assert lines[3] == "| y |  | two lines | 1 |"  # a missing value is an empty cell
    plain = markdown_table(pd.DataFrame({"b / a": [1.0, 2.5]}))
    assert plain.splitlines()[2:] == ["| 1.00 |", "| 2.50 |"]  # no row-count index column
    rows = pd.DataFrame({"6 tokens": [410.75, 21.63]}, index=["Duration (us)", "DRAM (%)"])
    shown = markdown_table(rows, by_row=True).splitlines()[2:]
    assert shown == ["| Duration (us) | 411 |", "| DRAM (%) | 21.6 |"]  # units by row


def test_results_doc_headers_are_words_with_units() -> None:
    """Every header of every table in docs/results.md: no raw column names (snake_case)."""
    lines = RESULTS.read_text().splitlines()
    headers = [lines[i - 1] for i, line in enumerate(lines) if re.fullmatch(r"\|(-+:?\|)+", line)]
    assert len(headers) > 10
    snake = {h for line in headers for h in line.strip("|").split(" | ") if SNAKE_CASE.search(h)}
    assert snake == set(), snake


def test_report_writes_markdown_html_or_both_and_refuses_neither(
    experiments_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A real sweep and A/B run made here: the Markdown names them, and a section without
    artifacts names the command that makes them."""
    md, html = tmp_path / "out.md", tmp_path / "out.html"
    assert main(["report", str(experiments_dir), "--markdown", str(md), "--html", str(html),
                 "--include-cpu"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"markdown: {md}" in out and f"report: {html}" in out
    text = md.read_text()
    found = collect([experiments_dir])
    assert text == build_markdown(found, [experiments_dir], str(md), include_cpu=True)
    assert "### Things that did not help" in text and "| sweep | change |" in text  # CPU runs
    assert "Absent from these artifacts: no profile artifact" in text
    assert "`workbench profile --prompt-tokens 33863" in text
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(experiments_dir)]) == 2
    assert "--html PATH, --markdown PATH or both" in capsys.readouterr().err


def test_readme_headline_tables_are_the_generated_ones() -> None:
    """The README's headline tables are copied from docs/results.md, each marked as such: they
    must still be there, verbatim, so the README never shows numbers the artifacts do not."""
    readme = (ROOT / "README.md").read_text().splitlines()
    marker = "<!-- from docs/results.md -->"
    starts = [i + 1 for i, line in enumerate(readme) if line == marker]
    assert starts, f"no {marker} marker in README.md"
    for start in starts:
        table = []
        for line in readme[start:]:
            if not line.startswith("|"):
                break
            table.append(line)
        assert len(table) > 2, f"no table after the marker on line {start}"
        assert "\n".join(table) in RESULTS.read_text(), (
            f"README.md's table on line {start + 1} is not in docs/results.md: copy it again"
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
    assert "| 4,096 | stock | 1.00 | 2.00 |" in text  # only the older run has T=4096
    assert text.index("| 6 | stock |") < text.index("| 6 | flat |")  # the seed's order
    assert "bench-moe-new` (not recorded, commit not recorded, tokens 6;" in text
    dense_row = "| M | bf16 (ms) | bf16 × floor | w8a16 (ms) | w8a16 × floor |"
    assert dense_row in text  # cuBLAS first, whatever order the rows came in
    assert "Accuracy against an fp32 GEMM" not in text  # no error columns: no accuracy table


def test_moe_table_names_peers_no_run_loaded_instead_of_a_column_for_them(tmp_path: Path):
    """A peer a run could not load is a row without a weight format or a time: no column
    group of its own (it was `nan (ms)`, which pushed the table past the page); named below
    the table when no run timed it, left out when another run did."""

    def row(kernel: str, fmt: str | None, ms: float | None, status: str = "ok") -> dict:
        return {"kernel": kernel, "variant": "flat" if kernel == "moe" else kernel,
                "weight_dtype": fmt, "tokens": 6, "routing": "uniform", "ms": ms,
                "ratio_to_floor": None if ms is None else 1.5, "status": status}  # fmt: skip

    old = pd.DataFrame([row("moe", "fp8", 0.25), row("humming", "fp8", 1.2)])
    new = pd.DataFrame([row("moe", "int4", 0.5), row("humming", None, None, "missing-peer"),
                        row("marlin", None, None, "missing-peer")])  # fmt: skip
    write_run(tmp_path, "bench-moe-old", {"kind": "bench-moe",
              "environment": {"date": "2026-01-01T00:00:00"}}, {"bench": old})  # fmt: skip
    write_run(tmp_path, "bench-moe-new", {"kind": "bench-moe",
              "environment": {"date": "2026-01-02T00:00:00"}}, {"bench": new})  # fmt: skip
    newest = pd.DataFrame([row("marlin", None, None, "error: RuntimeError")])
    write_run(tmp_path, "bench-moe-newest", {"kind": "bench-moe",
              "environment": {"date": "2026-01-03T00:00:00"}}, {"bench": newest})  # fmt: skip
    text = build_markdown(collect([tmp_path]), [tmp_path])
    assert "nan" not in text.split("**MoE, uniform routing**")[1].split("\n\n")[1]
    assert "| 6 | humming (peer) | 1.20 | 1.50 |" in text  # the older run's time stays
    assert "Peers no run measured: `marlin` (error" in text  # the newest run's reason


def test_moe_section_without_a_bench_table_says_so(tmp_path: Path) -> None:
    write_run(tmp_path, "bench-moe-empty", {"kind": "bench-moe"}, {})
    text = build_markdown(collect([tmp_path]), [tmp_path])
    assert "Absent from these artifacts: a benchmark table in the bench-moe runs" in text


def test_the_seed_headline_table_takes_the_design_preset_at_the_seed_prompt_only() -> None:
    """A served-configuration profile of another preset (dsv4-flash-hf-tp2) or another prompt
    length (46,000 tokens) is not a column of the seed's headline table, whatever its path
    sorts after."""
    from types import SimpleNamespace

    from workbench.analysis.collection import Artifact, Collection
    from workbench.report.sections_profiles import SERVED, served_runs

    def profile(name: str, preset: str, prompt: int = 33863) -> Artifact:
        params = {**SERVED, "preset": preset, "moe": "stock", "prompt_tokens": prompt}
        return Artifact(Path(name), "profile", {}, SimpleNamespace(meta={"params": params}))

    design = profile("raw/profile-a-design", "dsv4-flash-tp2")
    other = profile("raw/profile-z-published", "dsv4-flash-hf-tp2")
    longer = profile("raw/profile-z-longer", "dsv4-flash-tp2", 46000)
    assert served_runs(Collection([design, other, longer])) == {"stock": design}


def test_dense_tables_come_from_the_newest_whole_run_and_newer_runs_stand_alone(
    tmp_path: Path,
) -> None:
    """A later dense run that skipped the A/B scenarios and timed peers: the backend and layer
    tables still come from the whole run, and the later run gets a table of its own (its
    ratios within it), where a peer that was not installed is named, not hidden."""

    def row(kernel: str, variant: str, ms: float | None, status: str = "ok", **more) -> dict:
        return {"kernel": kernel, "variant": variant, "scenario": "m=1", "m": 1, "ms": ms,
                "status": status, **more}  # fmt: skip

    old = pd.DataFrame(
        [
            row("dense-layer", "w8a16", 0.2),
            row("dense-ab", "w8a16", 1.0, scenario="decode-1", tokens_per_s=101.6),
        ]
    )
    new = pd.DataFrame([row("dense-layer", "w8a16", 0.125, ratio_to_floor=5.3),
                        row("cublas_fp8", "w8a8-block128", 0.238, ratio_to_floor=10.2),
                        row("deepgemm", "w8a8-block128", None, "missing-peer")])  # fmt: skip
    dated = {"kind": "bench-dense", "environment": {"date": "2026-01-01T00:00:00"}}
    write_run(tmp_path, "bench-dense-old", dated, {"bench": old})
    write_run(tmp_path, "bench-dense-new", {**dated, "environment": {"date": "2026-01-02"}},
              {"bench": new})  # fmt: skip
    text = build_markdown(collect([tmp_path]), [tmp_path])
    assert "| w8a16 | 102 |" in text and "bench-dense-old`" in text  # the backend table
    layer = text.index("All dense projections of one TP2-rank layer")
    assert text.index("| 1 | 0.200 |", layer) < text.index("bench-dense-old`", layer)
    newer = text.index("A newer run without the A/B table")
    assert "| M | w8a16 (ms) | cublas fp8 (ms) |" in text[newer:]
    assert "| 1 | 0.125 | 0.238 |" in text[newer:] and "bench-dense-new`" in text[newer:]
    assert "Peers not measured in that run: `deepgemm` (missing-peer)." in text
