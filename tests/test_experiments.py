"""Sweeps and A/B runs end to end at small shapes under the Triton interpreter (workers are
spawned processes), and the "did not help" table from rows written by hand. No timing is
asserted beyond its statistics being consistent."""

import subprocess
import sys

import pandas as pd
import pytest
from helpers import QUICK, SMALL, write_sweep

import kernels.moe  # noqa: F401 (its kernels defined under the interpreter, before a test unsets it)
from workbench.analysis import experiments as results
from workbench.analysis.tables import GAPS, TOTAL
from workbench.artifacts import ROWS_FILE, read_meta, read_rows
from workbench.capture import experiments as ex
from workbench.capture import memory
from workbench.cli import main
from workbench.errors import ArtifactError, WorkbenchError
from workbench.views.experiments import view_sweep

GIB = 2**30


def test_a_small_sweep_gives_checked_rows_with_intervals_and_resumes(tmp_path):
    args = {"run_dir": tmp_path, "variant": "stock", "fmt": "bf16", "repeats": QUICK,
            "workers": 2, "progress": False, "timeout_s": 120, **SMALL}  # fmt: skip
    result = ex.sweep("moe", "num_stages", [1, 2], [3], **args)
    table = result.table()
    assert list(table.columns) == results.SWEEP_COLUMNS
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
    assert len(view_sweep(result).figure().data) == 4  # a band and a line per value
    page = view_sweep(result).to_html(tmp_path / "sweep.html", baseline_value=1).read_text()
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
        results.load_sweep(tmp_path)


def test_profile_ab_compares_whole_settings_per_phase(tmp_path):
    # The seed's dense A/B through profile(), on the tiny CPU model: a prefill row and a decode
    # row, each with both arms' step spans as samples and tokens per second.
    result = ex.ab({"dense": "bf16"}, {"dense": "hybrid", "hybrid_m": 128}, [48],
                   kernel="profile", run_dir=tmp_path, workers=2, progress=False,
                   preset="tiny", decode_tokens=5, prefill_chunk=8, device="cpu")  # fmt: skip
    table = result.table().set_index("phase")
    assert list(table.index) == ["prefill", "decode"]
    assert (table[["status_a", "status_b"]] == "ok").all().all()
    rows = result.rows.set_index(["phase", "arm", "run"]).sort_index()
    assert len(rows.loc[("prefill", "a")]) == 2  # two profiles an arm, each its own process
    assert len(rows.loc[("prefill", "a", 0), "samples_ms"]) == 6  # 48 tokens in chunks of 8
    assert len(rows.loc[("decode", "b", 1), "samples_ms"]) == 5
    for phase, row in table.iterrows():
        assert row["ci_low"] <= row["ratio"] <= row["ci_high"], phase
        assert row["tokens_per_s_a"] > 0 and row["tokens_per_s_b"] > 0
        runs = [rows.loc[(phase, arm), "samples_ms"].tolist() for arm in "ab"]
        assert row["ratio"] == pytest.approx(sum(map(sum, runs[1])) / sum(map(sum, runs[0])))
    params = read_meta(tmp_path)["params"]
    assert params["phases"] == ["prefill", "decode"] and params["runs"] == 2
    # where the change went: each phase's categories and idle time in both arms
    where = result.where().set_index(["phase", "part"])
    assert set(where.index.get_level_values("phase")) == {"prefill", "decode"}
    assert ("decode", "Dense GEMM") in where.index and ("decode", GAPS) in where.index
    assert (where[["ms_a", "ms_b"]] >= 0).all().all()
    for phase in ("prefill", "decode"):  # the categories add up to the total, per arm
        parts = where.loc[phase]
        kernels = parts.drop(index=[TOTAL, GAPS])
        assert kernels["ms_a"].sum() == pytest.approx(parts.loc[TOTAL, "ms_a"], rel=1e-6)
        assert list(parts.index)[-1] == TOTAL and (parts["runs"] == 2).all()
    change = (where["ms_b"] - where["ms_a"]).to_numpy()
    assert where["change_ms"].to_numpy() == pytest.approx(change)
    with pytest.raises(WorkbenchError, match="supports kernel 'moe' or 'dense' or 'profile'"):
        ex.ab({}, {}, [1], kernel="attention", run_dir=tmp_path / "x")
    with pytest.raises(WorkbenchError, match="phases='decod': give one or more of prefill"):
        ex.ab({}, {}, [1], kernel="profile", run_dir=tmp_path / "y", phases="decod")


def test_a_dense_ab_refuses_what_could_only_fail(tmp_path):
    with pytest.raises(WorkbenchError, match="unknown dense variant 'w9a9'; known: bf16"):
        ex.ab({}, {}, [4], kernel="dense", run_dir=tmp_path / "x", variant="w9a9")
    with pytest.raises(WorkbenchError, match="dense variant 'bf16' takes no parameter split_k"):
        ex.ab({}, {"split_k": 2}, [4], kernel="dense", run_dir=tmp_path / "y", variant="bf16")
    with pytest.raises(WorkbenchError, match="block=0 is below 1"):
        ex.ab({}, {}, [4], kernel="dense", run_dir=tmp_path / "z", block=0)


def test_profile_ab_runs_alternate_arms_so_a_drift_weighs_on_both():
    assert ex.ab_order(1) == [(0, "a"), (0, "b")]
    assert ex.ab_order(3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    for kernel in ("profile", "moe", "dense"):
        with pytest.raises(WorkbenchError, match="runs=0 must be an integer >= 1"):
            ex.ab({}, {}, [8], kernel=kernel, runs=0)


def test_runs_that_disagree_widen_the_profile_ab_interval():
    # Two pairs of runs of the same steps: within each pair b is steadily 8% slower or 3%
    # faster. One pair alone is "significant"; both together are not.
    steps = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.03, 0.97]
    rows = [{"arm": arm, "run": r, "phase": "decode", "tokens": 64, "status": "ok",
             "ms": 1.0 * f, "samples_ms": [v * f for v in steps]}
            for r, fb in enumerate((1.08, 0.97)) for arm, f in (("a", 1.0), ("b", fb))]  # fmt: skip
    line = results.AbResult({"kind": "ab"}, pd.DataFrame(rows)).table().iloc[0]
    assert line["ratio"] == pytest.approx((1.08 + 0.97) / 2)
    assert line["ci_low"] < 1 < line["ci_high"] and not line["significant"]
    first = results.AbResult({"kind": "ab"}, pd.DataFrame(rows[:2])).table().iloc[0]
    assert first["ratio"] == pytest.approx(1.08) and first["significant"]


def test_a_failed_profile_arm_stands_for_each_of_its_phases():
    rows = pd.DataFrame([
        {"arm": "a", "tokens": 64, "phases": ["prefill", "decode"], "status": "ok",
         "by_phase": {"prefill": {"ms": 5.0}, "decode": {"ms": 1.0}}},
        {"arm": "b", "tokens": 64, "phases": ["prefill", "decode"], "status": "timeout",
         "by_phase": None},
    ])  # fmt: skip
    expanded = results._phase_rows(rows).set_index(["arm", "phase"])
    assert expanded.loc[("a", "decode"), "ms"] == 1.0
    assert list(expanded.loc["b", "status"]) == ["timeout", "timeout"]


def _profile_run(arm: str, run: int, dense: float, moe: float, gaps: float) -> dict:
    return {"arm": arm, "run": run, "phase": "decode", "tokens": 64, "status": "ok", "ms": 1.0,
            "samples_ms": [1.0, 1.0], "step_parts_ms": {"Dense GEMM": dense, "MoE": moe,
            TOTAL: dense + moe, GAPS: gaps}}  # fmt: skip


def test_where_a_profile_ab_change_went():
    rows = [
        _profile_run("a", 0, 2.40, 5.0, 0.10),
        _profile_run("b", 0, 2.60, 5.0, 0.02),
        _profile_run("a", 1, 2.38, 5.1, 0.12),
        _profile_run("b", 1, 2.62, 5.1, 0.04),
    ]
    where = results.AbResult({"kind": "ab"}, pd.DataFrame(rows)).where()
    # the largest change first, the total last
    assert list(where["part"]) == ["Dense GEMM", GAPS, "MoE", TOTAL]
    dense = where.iloc[0]
    assert (dense["ms_a"], dense["ms_b"]) == pytest.approx((2.39, 2.61))  # medians over runs
    assert dense["change_ms"] == pytest.approx(0.22)
    assert dense["change_pct"] == pytest.approx(100 * 0.22 / 2.39)
    assert where.iloc[1]["change_ms"] == pytest.approx(-0.08)
    assert (where["runs"] == 2).all()
    # runs recorded before the parts were leave their size out
    old = [{k: v for k, v in r.items() if k != "step_parts_ms"} for r in rows]
    assert results.AbResult({"kind": "ab"}, pd.DataFrame(old)).where().empty
    # a failed run leaves its arm's other runs, and says how many there were
    failed = [*rows[:3], {**rows[3], "status": "timeout", "step_parts_ms": None}]
    where = results.AbResult({"kind": "ab"}, pd.DataFrame(failed)).where()
    assert (where["runs"] == 1).all() and where.iloc[0]["ms_b"] == pytest.approx(2.60)


def test_where_a_kernel_ab_change_went_kernel_by_kernel():
    def run(arm, run_, layout, gate_up):
        parts = {"_gate_up": gate_up, "_layout": layout, TOTAL: gate_up + layout}
        return {"arm": arm, "run": run_, "tokens": 6, "status": "ok", "ms": 1.0,
                "samples_ms": [1.0], "kernel_ms": parts}  # fmt: skip

    rows = [run("a", 0, 0.0049, 0.075), run("b", 0, 0.0031, 0.075),
            run("a", 1, 0.0047, 0.076), run("b", 1, 0.0033, 0.076)]  # fmt: skip
    where = results.AbResult({"kind": "ab"}, pd.DataFrame(rows)).where()
    assert "phase" not in where and list(where["part"]) == ["_layout", "_gate_up", TOTAL]
    assert where.iloc[0]["change_ms"] == pytest.approx(-0.0016)
    assert where.iloc[1]["change_ms"] == pytest.approx(0.0)
    # a CPU's kernel A/B records no kernels: nothing to say where
    cpu = [{**r, "kernel_ms": {}} for r in rows]
    assert results.AbResult({"kind": "ab"}, pd.DataFrame(cpu)).where().empty


def test_profile_ab_arms_with_different_steps_compare_unpaired():
    rows = [{"arm": "a", "phase": "decode", "tokens": 64, "status": "ok", "ms": 1.0,
             "samples_ms": [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]},
            {"arm": "b", "phase": "decode", "tokens": 64, "status": "ok", "ms": 2.0,
             "samples_ms": [2.0, 2.1, 1.9, 2.0]}]  # fmt: skip
    line = results.AbResult({"kind": "ab"}, pd.DataFrame(rows)).table().iloc[0]
    assert line["ratio"] == pytest.approx(2.0) and line["significant"]


def test_did_not_help_gives_effect_ranges_and_failures(tmp_path):
    write_sweep(tmp_path, [(1, 1, "ok", 1.0), (1, 512, "ok", 2.0),
                            (2, 1, "ok", 0.9), (2, 512, "ok", 2.5),
                            (4, 1, "spills", 1.2), (4, 512, "spills", 2.2),
                            (8, 1, "ok", 1.1), (8, 512, "timeout", None)])  # fmt: skip
    table = results.load_sweep(tmp_path).did_not_help(1).set_index("change")
    assert table.loc["rows=1 -> 2", "effect"] == "between 10% faster and 25% slower"
    assert table.loc["rows=1 -> 2", "failures"] == ""
    assert table.loc["rows=1 -> 4", "effect"] == "between 10% slower and 20% slower"
    assert table.loc["rows=1 -> 4", "failures"] == "spills at rows=4"
    assert table.loc["rows=1 -> 8", "effect"] == "10% slower"
    assert table.loc["rows=1 -> 8", "failures"] == "timeout (deadlock?) at rows=8 (tokens 512)"


def test_a_sweep_loads_without_torch(tmp_path):
    write_sweep(tmp_path, [(1, 1, "ok", 1.0), (2, 1, "ok", 0.5)])
    code = (
        "import sys\nfrom workbench import load_sweep\n"
        f"t = load_sweep({str(tmp_path)!r}).table()\n"
        "assert len(t) == 2 and 'torch' not in sys.modules and 'triton' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_a_gpu_a_sweep_runs_tiny_under_the_interpreter(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible, whatever the machine has
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the sweep sets it for its workers
    ex.sweep("moe", "num_stages", [1], [2], run_dir=tmp_path, fmt="bf16", repeats=QUICK,
             progress=False, timeout_s=120, **SMALL)  # fmt: skip
    rows = read_rows(tmp_path)
    assert [r["status"] for r in rows] == ["ok"], rows
    assert rows[0]["workload"]["preset"] == "tiny"
    said = [line for line in capsys.readouterr().err.splitlines() if "tiny" in line]
    assert len(said) == 1 and "TRITON_INTERPRET=1" in said[0]


def test_a_preset_that_does_not_fit_the_host_is_refused_before_any_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 16 * GIB)
    with pytest.raises(WorkbenchError, match=r"preset 'dsv4-flash-tp2'.* GiB.*preset=tiny"):
        ex.sweep("moe", "num_stages", [1, 2], [6], run_dir=tmp_path / "sweep", progress=False,
                 preset="dsv4-flash-tp2")  # fmt: skip
    with pytest.raises(WorkbenchError, match=r"preset 'dsv4-flash-tp2'.* GiB.*preset=tiny"):
        ex.ab({"dense": "bf16"}, {"dense": "w8a16"}, [64], kernel="profile", progress=False,
              run_dir=tmp_path / "ab", preset="dsv4-flash-tp2")  # fmt: skip
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "ab").exists()


BAD = [
    ("sweep", {"param": "num_stage"}, "moe variant 'stock' takes no parameter num_stage"),
    ("sweep", {"tokens": [0]}, "tokens=0 is below 1"),
    ("sweep", {"tokens": [-3]}, "tokens=-3 is below 1"),
    ("sweep", {"tokens": [2.5]}, "tokens=2.5 is not a whole number"),
    ("sweep", {"tokens": ["6"]}, "tokens='6' is not a whole number"),
    ("sweep", {"tokens": []}, "give at least one token count"),
    ("sweep", {"variant": "bogus"}, "unknown moe variant 'bogus'"),
    ("sweep", {"fmt": "fp4"}, "unknown weight format fmt='fp4'"),
    ("sweep", {"routing": "zipf"}, "unknown routing 'zipf'"),
    ("sweep", {"preset": "huge"}, "unknown preset 'huge'"),
    ("sweep", {"experts": 0}, "experts=0 is below 1"),
    ("sweep", {"repeats": {"min": 3}}, "repeats"),
    ("sweep", {"workers": 0}, "workers=0"),
    ("sweep", {"values": []}, "give at least one of values"),
    ("sweep", {"values": [1, "1"]}, "values: 1 is given twice"),
    ("sweep", {"tokens": [6, 6]}, "tokens: 6 is given twice"),
    ("sweep", {"device": "cuda:1"}, "device='cuda:1'"),
    ("ab", {"a": {"num_stage": 1}}, "takes no parameter num_stage"),
    ("ab", {"b": {"variant": "bogus"}}, "unknown moe variant 'bogus'"),
    ("profile", {"a": {"moe": "bogus"}}, "unknown moe variant 'bogus'"),
    ("profile", {"tokens": [0]}, "tokens=0 is below 1"),
    ("profile", {"b": {"dense": "fp4"}}, "unknown dense variant 'fp4'"),
]


@pytest.mark.parametrize("kind, bad, message", BAD)
def test_bad_settings_are_refused_before_any_worker_starts(tmp_path, monkeypatch, kind, bad,
                                                           message):  # fmt: skip
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    run_dir = tmp_path / "run"
    common = {"run_dir": run_dir, "progress": False, "timeout_s": 60, "repeats": QUICK, **SMALL}
    bad = dict(bad)
    tokens = bad.pop("tokens", [2])
    with pytest.raises(WorkbenchError, match=message):
        if kind == "sweep":
            param, values = bad.pop("param", "num_stages"), bad.pop("values", [1])
            ex.sweep("moe", param, values, tokens, **(common | bad))
        elif kind == "ab":
            ex.ab(bad.get("a", {}), bad.get("b", {}), tokens, **common)
        else:
            ex.ab(bad.get("a", {}), bad.get("b", {}), tokens, kernel="profile", run_dir=run_dir,
                  progress=False, timeout_s=60, preset="tiny")  # fmt: skip
    assert not run_dir.exists()


def test_a_sweep_whose_every_row_failed_says_so_and_the_cli_exits_non_zero(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    run_dir = tmp_path / "run"
    shapes = [f"{k}={v}" for k, v in SMALL.items()]
    # block_n=3 is refused by the kernel when it runs: every row is an error.
    argv = ["sweep", "moe", "block_n", "3", "--tokens", "2", "--run-dir", str(run_dir),
            "--timeout", "120", "--param", "fmt=bf16", *shapes]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "every configuration failed (error: 1)" in err
    with pytest.warns(ex.AllFailedWarning, match="every configuration failed"):  # resumed
        ex.sweep("moe", "block_n", [3], [2], run_dir=run_dir, fmt="bf16", timeout_s=120,
                 progress=False, **SMALL)  # fmt: skip
    assert main([*argv[:4], "--tokens", "0", "--run-dir", str(tmp_path / "zero")]) == 2
    assert "tokens=0 is below 1" in capsys.readouterr().err


def test_a_sweep_row_checks_the_routing_and_times_its_call_without_the_readback(monkeypatch):
    """As bench moe's rows: the check runs the call with the ids' range check (a host sync on a
    GPU), the timed samples without it (`trusted_routing`)."""
    import kernels.moe.routing as moe_routing
    from workbench.capture import timing

    seen = []
    real_check, real_timer = moe_routing.validate_moe_inputs, timing.time_launch

    def spy(*args):
        seen.append(moe_routing._TRUSTED_ROUTING.get())
        return real_check(*args)

    def time_launch(fn, *args, **kwargs):
        seen.append("timed")
        fn()
        return real_timer(lambda: None, *args, **kwargs)

    monkeypatch.setattr("kernels.moe.launch.validate_moe_inputs", spy)
    monkeypatch.setattr(timing, "time_launch", time_launch)
    config = {"workload": ex.WORKLOAD | {"fmt": "bf16", "preset": "tiny"}, "tokens": 3,
              "shapes": SMALL, "params": {}, "repeats": QUICK}  # fmt: skip
    assert ex.measure_moe(config)["status"] == "ok"
    timed = seen.index("timed")
    assert timed > 0 and not any(seen[:timed]) and seen[timed + 1 :] == [True]


def _kernels(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rank", "phase", "step", "category", "start_us", "dur_us"])


def test_a_tp_run_s_parts_are_each_gpu_s_averaged_and_add_up():
    """Each rank its own steps; a category one rank lacks counts 0 there, so the categories
    still add up to the total."""
    kernels = _kernels([(0, "decode", 0, "Dense GEMM", 0, 10), (0, "decode", 0, "MoE", 20, 10),
                        (1, "decode", 0, "Dense GEMM", 0, 10)])  # fmt: skip
    parts = ex._step_parts_ms(kernels, "decode")
    assert parts["Dense GEMM"] == pytest.approx(0.010) and parts["MoE"] == pytest.approx(0.005)
    assert parts[TOTAL] == pytest.approx(parts["Dense GEMM"] + parts["MoE"])
    assert parts[GAPS] == pytest.approx(0.005)  # rank 0's 10 us between its two kernels, halved
    assert ex._step_parts_ms(kernels.iloc[0:0], "decode") == {}


def test_a_tp_run_s_dense_time_is_a_gpu_s_not_both_summed():
    """A step's Dense GEMM time is the ranks' mean, a rank or step without one counting 0
    there (as in the parts), then the median over steps; a single-GPU table has no ranks."""
    dense = "Dense GEMM"
    kernels = _kernels([(0, "decode", 0, dense, 0, 10), (0, "decode", 0, dense, 10, 10),
                        (1, "decode", 0, dense, 0, 30), (0, "decode", 1, dense, 0, 40),
                        (1, "decode", 1, "MoE", 0, 40), (0, "decode", 2, dense, 0, 50),
                        (1, "decode", 2, dense, 0, 50), (0, "decode", 3, "MoE", 0, 10),
                        (1, "decode", 3, "MoE", 0, 10)])  # fmt: skip
    # steps: ranks' 20 and 30 us (mean 25), 40 and 0 (20), 50 and 50 (50), none (0)
    assert ex._dense_ms(kernels) == pytest.approx(0.0225)
    alone = kernels[kernels["rank"] == 0].assign(rank=None)
    assert ex._dense_ms(alone) == pytest.approx(0.030)  # 20, 40, 50 and 0 us
    assert ex._dense_ms(kernels[kernels["category"] == "MoE"]) == 0.0
    assert ex._dense_ms(kernels.assign(step=float("nan"))) == 0.0  # no step to take


def test_only_an_ab_s_kernel_rows_pay_for_the_profiler_and_a_failure_leaves_the_row(
    monkeypatch,
):
    import torch

    from workbench.capture import kernel_times

    cpu = torch.device("cpu")
    assert ex._kernel_parts({}, lambda: None, cpu) == {}  # a sweep's row
    assert ex._kernel_parts({"kernel_times": True}, lambda: None, cpu) == {"kernel_ms": {}}

    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(kernel_times, "kernel_ms", broken)
    row = ex._kernel_parts({"kernel_times": True}, lambda: None, cpu)
    assert row == {"kernel_ms_error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}


def test_where_keeps_gaps_and_drops_only_categories_no_run_launched():
    def run(arm, run_, moe):
        parts = {"Dense GEMM": 1.0, "MoE": moe, TOTAL: 1.0 + moe, GAPS: 0.0}
        return {"arm": arm, "run": run_, "phase": "decode", "tokens": 6, "status": "ok",
                "ms": 1.0, "samples_ms": [1.0], "step_parts_ms": parts}  # fmt: skip

    where = results.AbResult(
        {"kind": "ab"},
        pd.DataFrame([run("a", 0, 0.0), run("b", 0, 0.0), run("a", 1, 0.0), run("b", 1, 0.3)]),
    ).where()
    assert set(where["part"]) == {"Dense GEMM", "MoE", GAPS, TOTAL}  # one run launched MoE
    none = [run(arm, r, 0.0) for arm in "ab" for r in (0, 1)]
    where = results.AbResult({"kind": "ab"}, pd.DataFrame(none)).where()
    assert set(where["part"]) == {"Dense GEMM", GAPS, TOTAL}
