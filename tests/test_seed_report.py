"""`workbench report`: every seed table the artifacts support, rebuilt on one offline page, and
every one they do not support marked absent with the command that makes its artifacts; checked
in a real headless Chromium (no console errors, no request leaving the file, every figure drawn).
"""

import pandas as pd
import pytest
from helpers import (
    CHROMIUM,
    ROOT,
    SCREENSHOTS,
    chromium_missing,
    open_in_chromium,
    stand_in_reports,
)

from workbench.analysis.collection import NOT_RECORDED, Artifact, Collection, collect
from workbench.artifacts import write_run
from workbench.cli import main
from workbench.errors import ArtifactError
from workbench.report.seed_report import (
    SECTIONS,
    build,
    coverage,
    dense_ab_table,
    hybrid_ab_table,
)

PROFILES = sorted((ROOT / "raw").glob("profile-dsv4-flash-tp2-*"))


def test_collect_sorts_artifacts_by_kind_and_skips_what_is_not_one(experiments_dir, tmp_path):
    (tmp_path / "capture-log.txt").write_text("not an artifact")
    broken = tmp_path / "profile-broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    found = collect([experiments_dir, tmp_path])
    assert found.kinds() == {"sweep": 1, "ab": 1}
    assert [path for path, _ in found.unread] == [broken]
    assert "not valid JSON" in found.unread[0][1]
    with pytest.raises(ArtifactError, match="does not exist"):
        collect([tmp_path / "nowhere"])


def test_coverage_says_which_seed_tables_are_rebuilt_and_how_to_make_the_rest():
    stock, flat = stand_in_reports()
    found = Collection([Artifact(stock.path, "ncu", stock.meta, stock),
                        Artifact(flat.path, "ncu", flat.meta, flat)])  # fmt: skip
    table = coverage(found)
    assert list(table.index) == [s.title for s in SECTIONS]
    assert table.loc["Nsight Compute on the stock kernel", "status"] == "rebuilt"
    assert table.loc["Nsight Compute on the stock kernel", "artifacts"] == 2
    things = table.loc["Things that did not help", "status"]
    assert things.startswith("absent: run `workbench sweep moe num_stages")
    text = build(found).render()
    assert "6 tokens, gate up" in text and "barrier 1.61" in text
    assert "flat against stock, launch by launch" in text
    assert "a report of one decode step" in text  # absent here: the command to capture it
    assert "NVIDIA H200" in text and "0123456789" in text  # each artifact's metadata


def test_report_of_the_artifacts_renders_offline(experiments_dir, tmp_path, capsys):
    """The committed artifacts (raw/ and ncu/) and a real sweep and A/B run made here (on a
    CPU: in a section of their own)."""
    page_path = tmp_path / "report.html"
    assert main(["report", str(ROOT / "raw"), str(ROOT / "ncu"), str(experiments_dir),
                 "--html", str(page_path), "--include-cpu"]) == 0  # fmt: skip
    assert f"report: {page_path}" in capsys.readouterr().out
    assert page_path.stat().st_size < 10 * 2**20
    html = page_path.read_text()
    assert html.count("plotly.js v") == 1
    found = collect([ROOT / "raw", ROOT / "ncu", experiments_dir])
    if chromium_missing():
        pytest.skip(f"{CHROMIUM} not installed")
    seen = open_in_chromium(page_path, SCREENSHOTS / "seed-report.png")
    assert seen["errors"] == [] and seen["remote"] == []
    assert seen["figures"] == seen["drawn"] == html.count('class="plotly-graph-div"') >= 2
    text = seen["text"]
    for section in SECTIONS:
        assert section.title in text
        present = any(found.kinds().get(kind) for kind in section.kinds)
        absent = f"Absent from these artifacts: no {' or '.join(section.kinds)} artifact."
        assert (absent in text) != present, section.title
    assert "Prefill: summed time (ms)" in text and "5,206" in text  # stock, graphs
    assert "Decode: mean time per step (ms)" in text
    assert "One decode step: profiled time by kernel" in text and "_stock_down_kernel" in text
    cpu = text[text.index("\nCPU runs\n") :]
    assert "num_stages=1 -> 2" in cpu and "num_stages=1 -> 2" not in text[: len(text) - len(cpu)]
    assert "sweep-moe-num_stages" in text
    assert "NVIDIA H200" in text and NOT_RECORDED in html  # sweeps record no environment
    # (in the artifacts table's folded rows: innerText leaves out a closed <details>)
    for profile in PROFILES:
        assert profile.name in text


def test_report_command_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing"), "--html", str(tmp_path / "r.html")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_benchmark_runs_feed_the_kernel_tables(tmp_path):
    """Benchmark tables written by hand in the harnesses' format (their own tests run them)."""
    dense = pd.DataFrame(
        [{"kernel": "dense-layer", "variant": v, "scenario": "m=1", "m": 1, "ms": ms,
          "status": "ok"} for v, ms in (("bf16", 0.04), ("w8a16", 0.03))]
        + [{"kernel": "dense-ab", "variant": v, "scenario": s, "m": 1, "ms": 1.0,
            "tokens_per_s": tps, "status": "ok"}
           for v, s, tps in (("bf16", "decode-1", 90.0), ("bf16", "decode-4", 200.0),
                             ("w8a16", "decode-1", 101.6), ("w8a16", "decode-4", 210.2),
                             ("hybrid", "decode-1", 87.2), ("hybrid", "decode-4", 227.6))]
    )  # fmt: skip
    moe = pd.DataFrame(
        [{"kernel": "moe", "variant": v, "weight_dtype": "fp8", "tokens": t, "routing": "uniform",
          "ms": 0.1 * t, "status": "ok"} for v in ("stock", "flat") for t in (6, 4096)]
    )  # fmt: skip
    write_run(tmp_path, "bench-dense-x", {"kind": "bench-dense"}, {"bench": dense})
    write_run(tmp_path, "bench-moe-x", {"kind": "bench-moe"}, {"bench": moe})
    found = collect([tmp_path])
    assert found.kinds() == {"bench-dense": 1, "bench-moe": 1}
    table = dense_ab_table(dense)
    assert list(table.columns) == ["decode-1", "decode-4"]
    assert table.loc["w8a16", "decode-4"] == 210.2
    hybrid = hybrid_ab_table(dense.assign(error_vs_bf16=0.03), 128)
    assert list(hybrid.columns) == ["W8A16 (default)", "hybrid, W8A16 up to M=128",
                                    "hybrid / default"]  # fmt: skip
    assert hybrid.loc["decode-4", "hybrid / default"] == pytest.approx(227.6 / 210.2)
    page = build(found)
    assert page.figures == 2  # ms against M for the dense layer, against tokens for the MoE
    text = page.render()
    assert "backend table: dense GEMMs of all layers" in text and "210" in text
    assert coverage(found).loc["Dense MXFP8 backend", "status"] == "rebuilt"
    assert coverage(found).loc["Hybrid dense GEMM, controlled A/B", "status"] == "rebuilt"
    assert "hybrid, W8A16 up to M=M" in text  # the run records no hybrid_m here


def test_the_floor_figure_marks_the_floor_and_skips_rows_without_one():
    from workbench.report.experiment_figures import floor_lines

    table = pd.DataFrame({"m": [1, 4, 1, 4], "variant": ["a", "a", "b", "b"],
                          "ratio_to_floor": [2.0, 1.5, None, 3.0]})  # fmt: skip
    fig = floor_lines(table, "t", ("variant",), "m")
    assert [t.name for t in fig.data] == ["a", "b"] and list(fig.data[1].x) == [4]
    assert fig.layout.yaxis.type == "log" and fig.layout.shapes[0].y0 == 1.0
    assert fig.layout.annotations[0].y == 0  # log10 of the floor's 1, on a log axis
