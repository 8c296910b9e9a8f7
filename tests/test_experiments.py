"""Sweeps and A/B runs end to end at small shapes under the Triton interpreter (workers are
spawned processes), and the "did not help" table from rows written by hand. No timing is
asserted beyond its statistics being consistent."""

import subprocess
import sys

import pandas as pd
import pytest
from helpers import QUICK, SMALL, write_sweep

from workbench.artifacts import read_meta
from workbench.capture import experiments as ex
from workbench.capture.workers import ROWS_FILE, read_rows
from workbench.errors import ArtifactError, WorkbenchError


def test_a_small_sweep_gives_checked_rows_with_intervals_and_resumes(tmp_path):
    args = {"run_dir": tmp_path, "variant": "stock", "fmt": "bf16", "repeats": QUICK,
            "workers": 2, "progress": False, "timeout_s": 120, **SMALL}  # fmt: skip
    result = ex.sweep("moe", "num_stages", [1, 2], [3], **args)
    table = result.table()
    assert list(table.columns) == ex.SWEEP_COLUMNS
    assert list(table["value"]) == [1, 2] and set(table["status"]) == {"ok"}
    assert (table["ci_low"] <= table["ms"]).all() and (table["ms"] <= table["ci_high"]).all()
    assert (table["q1"] <= table["q3"]).all()
    # At least min_n samples, unless the time budget ran out first (a loaded CI machine).
    stopped = {row["value"]: row["stopped"] for row in read_rows(tmp_path)}
    assert all(
        n >= QUICK["min_n"] or stopped[v] == "budget" for v, n in zip(table["value"], table["n"])
    )
    assert (table["rel_error"] < 1e-3).all()
    meta = read_meta(tmp_path)
    assert meta["kind"] == "sweep" and meta["environment"]["torch"]
    lines = (tmp_path / ROWS_FILE).read_text()
    again = ex.sweep("moe", "num_stages", [1, 2], [3], **args)  # resumes: nothing to run
    assert (tmp_path / ROWS_FILE).read_text() == lines
    assert again.table().equals(table)
    assert len(result.figure().data) == 4  # a band and a line per value
    page = result.to_html(tmp_path / "sweep.html", baseline_value=1).read_text()
    assert "Things that did not help" in page and "num_stages=1 -&gt; 2" in page


def test_ab_reports_the_ratio_with_its_interval(tmp_path):
    result = ex.ab({"num_stages": 1}, {"num_stages": 2}, [3], run_dir=tmp_path, variant="stock",
                   fmt="bf16", repeats=QUICK, workers=2, progress=False, **SMALL)  # fmt: skip
    row = result.table().iloc[0]
    assert row["status_a"] == row["status_b"] == "ok"
    assert row["ci_low"] <= row["ratio"] <= row["ci_high"]
    assert row["ratio"] == pytest.approx(row["ms_b"] / row["ms_a"])
    assert row["significant"] in (True, False)
    with pytest.raises(ArtifactError, match="not a 'sweep'"):
        ex.load_sweep(tmp_path)


def test_profile_ab_compares_whole_settings_per_phase(tmp_path):
    # The seed's dense A/B through profile(), on the tiny CPU model: a prefill row and a decode
    # row, each with both arms' step spans as samples and tokens per second.
    result = ex.ab({"dense": "bf16"}, {"dense": "hybrid", "hybrid_m": 128}, [48],
                   kernel="profile", run_dir=tmp_path, workers=2, progress=False,
                   preset="tiny", decode_tokens=5, prefill_chunk=8, device="cpu")  # fmt: skip
    table = result.table().set_index("phase")
    assert list(table.index) == ["prefill", "decode"]
    assert (table[["status_a", "status_b"]] == "ok").all().all()
    rows = result.rows.set_index(["phase", "arm"])
    assert len(rows.loc[("prefill", "a"), "samples_ms"]) == 6  # 48 tokens in chunks of 8
    assert len(rows.loc[("decode", "b"), "samples_ms"]) == 5
    for phase, row in table.iterrows():
        assert row["ci_low"] <= row["ratio"] <= row["ci_high"], phase
        assert row["tokens_per_s_a"] > 0 and row["tokens_per_s_b"] > 0
    assert read_meta(tmp_path)["params"]["phases"] == ["prefill", "decode"]
    with pytest.raises(WorkbenchError, match="supports kernel 'moe' or 'profile'"):
        ex.ab({}, {}, [1], kernel="dense", run_dir=tmp_path / "x")
    with pytest.raises(WorkbenchError, match="phases='decod': give one or more of prefill"):
        ex.ab({}, {}, [1], kernel="profile", run_dir=tmp_path / "y", phases="decod")


def test_a_failed_profile_arm_stands_for_each_of_its_phases():
    rows = pd.DataFrame([
        {"arm": "a", "tokens": 64, "phases": ["prefill", "decode"], "status": "ok",
         "by_phase": {"prefill": {"ms": 5.0}, "decode": {"ms": 1.0}}},
        {"arm": "b", "tokens": 64, "phases": ["prefill", "decode"], "status": "timeout",
         "by_phase": None},
    ])  # fmt: skip
    expanded = ex._phase_rows(rows).set_index(["arm", "phase"])
    assert expanded.loc[("a", "decode"), "ms"] == 1.0
    assert list(expanded.loc["b", "status"]) == ["timeout", "timeout"]


def test_profile_ab_arms_with_different_steps_compare_unpaired():
    rows = [{"arm": "a", "phase": "decode", "tokens": 64, "status": "ok", "ms": 1.0,
             "samples_ms": [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]},
            {"arm": "b", "phase": "decode", "tokens": 64, "status": "ok", "ms": 2.0,
             "samples_ms": [2.0, 2.1, 1.9, 2.0]}]  # fmt: skip
    line = ex.AbResult({"kind": "ab"}, pd.DataFrame(rows)).table().iloc[0]
    assert line["ratio"] == pytest.approx(2.0) and line["significant"]


def test_did_not_help_gives_effect_ranges_and_failures(tmp_path):
    write_sweep(tmp_path, [(1, 1, "ok", 1.0), (1, 512, "ok", 2.0),
                            (2, 1, "ok", 0.9), (2, 512, "ok", 2.5),
                            (4, 1, "spills", 1.2), (4, 512, "spills", 2.2),
                            (8, 1, "ok", 1.1), (8, 512, "timeout", None)])  # fmt: skip
    table = ex.load_sweep(tmp_path).did_not_help(1).set_index("change")
    assert table.loc["rows=1 -> 2", "effect"] == "between 10% faster and 25% slower"
    assert table.loc["rows=1 -> 2", "failures"] == ""
    assert table.loc["rows=1 -> 4", "effect"] == "between 10% slower and 20% slower"
    assert table.loc["rows=1 -> 4", "failures"] == "spills at rows=4"
    assert table.loc["rows=1 -> 8", "effect"] == "10% slower"
    assert table.loc["rows=1 -> 8", "failures"] == "timeout (deadlock?) at rows=8 (tokens 512)"


def test_a_sweep_loads_without_torch(tmp_path):
    write_sweep(tmp_path, [(1, 1, "ok", 1.0), (2, 1, "ok", 0.5)])
    code = (
        "import sys\nfrom workbench.capture.experiments import load_sweep\n"
        f"t = load_sweep({str(tmp_path)!r}).table()\n"
        "assert len(t) == 2 and 'torch' not in sys.modules and 'triton' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
