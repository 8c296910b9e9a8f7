"""`workbench report` on the terminal: CPU runs kept out of GPU tables, damaged inputs said and
counted in the exit status, and default folders that are not there skipped with a note.

Exit statuses: 0 the pages are written (damaged artifacts met while scanning a folder are
warned about, one line each); 1 the pages are written but an artifact named on the command
line could not be read (or a folder named holds none), or nothing that was met could be read;
2 usage errors (no output, a named path that does not exist, no artifacts folder at all).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import ROOT

import workbench
from workbench.analysis.profile import ProfileResult
from workbench.cli import main
from workbench.report.seed_tables import profile_columns

EAGER = ROOT / "raw" / "profile-dsv4-flash-tp2-stock-bf16-33863t-20261129T121148"  # H200, eager
BENCH = ROOT / "raw" / "bench-attention-dsv4-flash-tp2-20261129T172033"  # a small H200 run


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the quick start writes on a machine without a GPU: a `tiny` run of the torch
    references, eager, like the H200 eager run beside it."""
    out = tmp_path_factory.mktemp("raw")
    return workbench.profile(700, 3, prefill_chunk=256, out=out, progress=False).path


def _section(text: str, title: str) -> str:
    """A Markdown section's text, from its heading to the next heading of its level."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_cpu_runs_stay_out_of_the_gpu_tables(cpu_run, tmp_path, capsys):
    md, html = tmp_path / "r.md", tmp_path / "r.html"
    assert main(["report", str(EAGER), str(cpu_run), "--markdown", str(md),
                 "--html", str(html)]) == 0  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    skipped = [line for line in err if "skipped 1 CPU run" in line]
    assert len(skipped) == 1 and "--include-cpu" in skipped[0], err
    profiles = _section(md.read_text(), "Kernel profiles in the server")
    assert cpu_run.name not in profiles and "CPU" not in profiles.split("\n> ")[0]
    assert "skipped 1 CPU run" in md.read_text()
    page = html.read_text()
    section = page[page.index('id="kernel-profiles-in-the-server"') : page.index('id="nsight')]
    assert "skipped 1 CPU run" in page and "tiny" not in section and "CPU" not in section


def test_include_cpu_gives_cpu_runs_a_section_of_their_own(cpu_run, tmp_path, capsys):
    md = tmp_path / "r.md"
    assert main(["report", str(EAGER), str(cpu_run), "--markdown", str(md),
                 "--include-cpu"]) == 0  # fmt: skip
    assert "skipped" not in capsys.readouterr().err
    text = md.read_text()
    assert cpu_run.name not in _section(text, "Kernel profiles in the server")
    cpu = _section(text, "CPU runs")
    assert cpu_run.name in cpu and "CPU, tiny" in cpu and "not GPU kernel times" in cpu
    assert "on the GPU machine" not in cpu  # no "absent: run this on the GPU" notes there


def _run(meta: dict) -> ProfileResult:
    kernels = pd.DataFrame(columns=["phase", "rank"])
    return ProfileResult(meta=meta, kernels=kernels)


def test_profile_labels_tell_runs_apart_by_device_preset_and_tp():
    def meta(gpu: str, preset: str, tp: int | None = None) -> dict:
        params = {"moe": "stock", "cuda_graphs": False, "preset": preset, "tp": tp,
                  "prompt_tokens": 33863}  # fmt: skip
        return {"device": "cuda", "environment": {"gpu": {"name": gpu}}, "params": params}

    runs = [_run(meta(gpu, preset, tp)) for gpu, preset, tp in (
        ("NVIDIA H200", "dsv4-flash-tp2", None), ("NVIDIA H100", "dsv4-flash-tp2", None),
        ("NVIDIA H200", "small", None), ("NVIDIA H200", "small", 2))]  # fmt: skip
    _, labels = profile_columns(runs)
    assert len(set(labels)) == 4, labels
    assert any("H100" in label for label in labels) and any("small" in label for label in labels)
    assert any("TP2" in label for label in labels)
    _, alike = profile_columns(runs[:1])  # one run: nothing to tell apart, the short label
    assert alike == ["stock MoE, eager"]


def test_an_unreadable_artifact_named_on_the_command_line_fails(tmp_path, capsys):
    broken = tmp_path / "profile-broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    page = tmp_path / "r.html"
    assert main(["report", str(broken), str(BENCH), "--html", str(page)]) == 1
    err = capsys.readouterr().err
    assert f"skipped {broken}: " in err and "not valid JSON" in err
    assert page.is_file()  # what could be read is still reported


def test_damage_met_while_scanning_a_folder_is_a_warning(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copytree(BENCH, raw / BENCH.name)
    (raw / "logs").mkdir()
    (raw / "logs" / "capture-log.txt").write_text("not an artifact")
    (raw / "sweep-broken").mkdir()
    (raw / "sweep-broken" / "run.json").write_text("{not json")
    assert main(["report", str(raw), "--markdown", str(tmp_path / "r.md")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "skipped" in line] == [
        f"workbench report: skipped {raw / 'sweep-broken'}: " + err[0].split(": ", 2)[2]
    ]  # one line for the damaged run, none for the logs


def test_nothing_readable_fails(tmp_path, capsys):
    (tmp_path / "sweep-broken").mkdir()
    (tmp_path / "sweep-broken" / "run.json").write_text("{not json")
    assert main(["report", str(tmp_path), "--markdown", str(tmp_path / "r.md")]) == 1
    assert "could be read" in capsys.readouterr().err


def test_default_folders_that_are_not_there_are_skipped_with_a_note(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "raw").mkdir()
    shutil.copytree(BENCH, tmp_path / "raw" / BENCH.name)
    assert main(["report", "--markdown", "r.md"]) == 0
    assert "no ncu here" in capsys.readouterr().err
    text = (tmp_path / "r.md").read_text()
    assert "`workbench report raw --markdown r.md`" in text and BENCH.name in text
    assert main(["report", "raw", "ncu", "--markdown", "r.md"]) == 2  # named: an error
    assert "ncu does not exist" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "raw")
    assert main(["report", "--markdown", "r.md"]) == 2
    assert "neither raw nor ncu" in capsys.readouterr().err


def test_a_named_folder_without_artifacts_fails(tmp_path, capsys):
    """`workbench report docs ...`: a folder named on the command line that holds nothing the
    report reads is a mistake to say, not an empty section to pass over."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("not an artifact")
    assert main(["report", str(notes), str(BENCH), "--markdown", str(tmp_path / "r.md")]) == 1
    assert f"skipped {notes}: holds no run directory or Nsight Compute report" in (
        capsys.readouterr().err
    )


def test_a_profile_ab_s_breakdown_shows_where_its_change_went(tmp_path):
    """A profile A/B that recorded each phase's categories and idle time gets a table of
    them beside its ratio (here the committed PDL A/B, given a breakdown by hand)."""
    run = tmp_path / "ab-profile"
    shutil.copytree(ROOT / "raw" / "ab-profile-20261204T212709", run)
    rows = [json.loads(line) for line in (run / "rows.jsonl").read_text().splitlines()]
    for row in rows:
        dense = 2.6 if row["arm"] == "b" else 2.4
        for phase in row["by_phase"].values():
            phase["step_parts_ms"] = {"Dense GEMM": dense, "MoE": 9.0, "Total": dense + 9.0,
                                      "Gaps between kernels": 0.5}  # fmt: skip
    (run / "rows.jsonl").chmod(0o644)
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.md"
    assert main(["report", str(run), "--markdown", str(out)]) == 0
    text = out.read_text()
    assert "Where the change went: profile A/B: a = dense_pdl=False; b = dense_pdl=True" in text
    assert "| decode | 33,863 | Dense GEMM | 2.40 | 2.60 | 0.200 | 8.3 |" in text
