"""The kernel targets (`analysis.targets`): verdicts from the committed H200 runs, and from
small tables that miss rows, so a run that lacks a size or a peer never reads as a pass."""

from __future__ import annotations

import pandas as pd
from helpers import ROOT

from workbench.analysis.collection import collect
from workbench.analysis.targets import (
    dense_verdicts,
    hybrid_ab_verdict,
    moe_verdicts,
)
from workbench.report.sections_targets import write_targets
from workbench.report.seed_tables import SECTIONS

DENSE_RUN = ROOT / "raw" / "bench-dense-dsv4-flash-tp2-20261205T195201" / "bench.csv"
MOE_RUN = ROOT / "raw" / "bench-moe-dsv4-flash-tp2-20261206T051930" / "bench.csv"


def test_dense_verdicts_of_the_committed_run():
    """The H200 run of record (its rows timed in turns, the GPU's state read): W8A16 at 1 to 6
    rows and the hybrid meet; W8A16 at 128 and 256 rows and W8A8 at prefill miss."""
    verdicts = dense_verdicts(pd.read_csv(DENSE_RUN))
    decode, middle, hybrid, prefill = verdicts
    assert decode.met is True and decode.measured.startswith("M=1 1.55x, M=4 1.32x, M=6 1.32x")
    assert "humming at most 0.51x our speed" in decode.measured
    assert middle.met is False and "M=64 1.05x, M=128 0.88x, M=256 0.77x" in middle.measured
    assert hybrid.met is True and "1.00x" in hybrid.measured
    assert prefill.met is False and "M=4,096 1.32x, M=16,384 1.40x" in prefill.measured
    assert "M=4,096 0.90x, M=16,384 0.90x" in prefill.measured  # DeepGEMM, the fastest peer


def test_moe_verdicts_of_the_committed_run():
    fp8, int4, int4_prefill, spills, w8a8, bf16 = moe_verdicts(pd.read_csv(MOE_RUN))
    assert fp8.met is True and fp8.measured.startswith("1.26x its floor")
    assert int4.met is False and int4.measured == "1.68x its floor (0.118 ms)"
    assert int4_prefill.met is True and int4_prefill.measured.startswith("0 spills, 0.71x")
    assert spills.met is True and spills.measured == "none spill"
    assert w8a8.met is True and w8a8.measured.startswith("1.51x our bf16 flat's speed, 3.77x")
    assert bf16.met is True and bf16.measured.startswith("66.9% of cuBLAS bf16's rate")
    assert [v.status for v in (fp8, int4)] == ["met", "missed"]


def layer_rows(times: dict[tuple[str, int], float]) -> pd.DataFrame:
    """bench dense rows of our layer kernels at (variant, M) with these times."""
    return pd.DataFrame(
        [{"kernel": "dense-layer", "variant": v, "m": m, "ms": ms} for (v, m), ms in times.items()]
    )


def test_a_missing_peer_or_size_is_not_measured_never_met():
    """W8A16 fast enough at every decode size but no humming row: not measured. One size too
    slow: missed whatever else is absent."""
    fast = {("bf16", m): 1.4 for m in (1, 4, 6)} | {("w8a16", m): 1.0 for m in (1, 4, 6)}
    decode = dense_verdicts(layer_rows(fast))[0]
    assert decode.met is None and decode.status == "not measured"
    assert decode.measured.endswith("; no humming")
    slow = fast | {("w8a16", 4): 1.2}
    assert dense_verdicts(layer_rows(slow))[0].met is False
    humming = pd.DataFrame([{"kernel": "humming", "m": m, "ms": 1.1} for m in (1, 4, 6)])
    met = dense_verdicts(pd.concat([layer_rows(fast), humming]))[0]
    assert met.met is True and "humming at most 0.91x our speed" in met.measured
    middle = dense_verdicts(layer_rows(fast))[1]
    assert middle.met is None and "M=16 not timed" in middle.measured


def test_the_hybrid_is_judged_at_every_m_where_all_three_ran():
    times = {("hybrid", 64): 1.0, ("w8a16", 64): 1.0, ("w8a8", 64): 1.2,
             ("hybrid", 4096): 1.06, ("w8a16", 4096): 2.0, ("w8a8", 4096): 1.0}  # fmt: skip
    hybrid = dense_verdicts(layer_rows(times))[2]
    assert (
        hybrid.met is False and hybrid.measured == "at most 1.06x the better one's time (M=4,096)"
    )
    times[("hybrid", 4096)] = 1.04
    assert dense_verdicts(layer_rows(times))[2].met is True
    assert dense_verdicts(layer_rows({("hybrid", 1): 1.0}))[2].met is None


def test_moe_verdicts_without_rows_are_not_measured():
    empty = pd.DataFrame(columns=["kernel", "variant", "weight_dtype", "tokens", "routing", "ms",
                                  "spills"])  # fmt: skip
    verdicts = moe_verdicts(empty)
    assert [v.met for v in verdicts] == [None] * 6
    assert verdicts[3].measured == "no INT4 rows compiled"


def test_the_seed_ab_needs_an_interval_above_one():
    """b / a is the hybrid's time over W8A16's: tokens per second are its inverse."""
    table = pd.DataFrame([{"phase": "prefill", "tokens": 46000, "ratio": 0.94, "ci_low": 0.89,
                           "ci_high": 0.976}])  # fmt: skip
    met = hybrid_ab_verdict(table)
    assert met.met is True and met.measured == "1.06x at 46,000 tokens (95% interval 1.02 - 1.12)"
    table.loc[0, "ci_high"] = 1.01
    assert hybrid_ab_verdict(table).met is False
    assert hybrid_ab_verdict(table.assign(phase="decode")).met is None
    assert hybrid_ab_verdict(table.assign(ci_low=float("nan"))).met is None


class Recorder:
    """A ReportPage that keeps what the writer put on it."""

    def __init__(self):
        self.tables, self.absences = [], []

    def table(self, frame, caption="", source="", **_):
        self.tables.append((frame, caption, source))
        return self

    def absent(self, what, command):
        self.absences.append((what, command))
        return self


def test_the_section_names_the_run_of_every_verdict(monkeypatch):
    """From the committed runs: one table, each row naming its run, the caption counting the
    targets met; with no runs, the section says what is absent and how to make it."""
    monkeypatch.chdir(ROOT)
    section = next(s for s in SECTIONS if s.title == "Kernel targets")
    runs = [DENSE_RUN.parent.relative_to(ROOT), MOE_RUN.parent.relative_to(ROOT)]
    page = Recorder()
    write_targets(page, collect(runs), section)
    (frame, caption, source), *states = page.tables
    assert (
        len(frame) == 10 and caption == f"Kernel targets: {(frame.status == 'met').sum()} of 10 met"
    )
    assert set(frame["from"]) == {f"`{r.as_posix()}`" for r in runs}
    assert source.startswith("From `raw/bench-dense") and "NVIDIA H200" in source
    assert "the GPU while the rows were timed: SM clock 1,665 MHz median" in source
    # and a table of the GPU's state a size for each run: decode at full clock, prefill capped
    (dense, dense_caption, _), (moe, _, _) = states
    assert dense_caption == (
        "The GPU while each size's rows were timed (bench-dense; read from its rounds)"
    )
    by_m = dense.set_index("m")
    assert (
        by_m.loc["1", "SM clock median (MHz)"] == 1980
        and by_m.loc["1", "power-capped samples"] == "0%"
    )
    assert by_m.loc["16,384", "SM clock median (MHz)"] < 1980
    assert by_m.loc["16,384", "power-capped samples"] == "100%"
    assert list(moe["tokens"]) == ["6", "33,863"] and set(moe["routing"]) == {"uniform"}
    empty = Recorder()
    write_targets(empty, collect([]), section)
    assert empty.tables == [] and empty.absences[0][1] == section.command


def test_a_check_below_its_goal_is_missed_when_the_table_gives_numpy_numbers():
    """A comparison of a table's values is a numpy bool, never `is False`: W8A8 at 1.46x our
    bf16 flat (goal 1.5x) once read as met. Rows from a DataFrame, as the report reads them."""
    rows = pd.DataFrame([
        {"kernel": "moe", "variant": "w8a8", "weight_dtype": "fp8", "tokens": 33863, "ms": 9.655},
        {"kernel": "moe", "variant": "flat", "weight_dtype": "bf16", "tokens": 33863, "ms": 14.128},
        {"kernel": "deepgemm", "variant": "w8a8-block128", "weight_dtype": "fp8", "tokens": 33863,
         "ms": 34.45},
    ]).assign(routing="uniform")  # fmt: skip
    w8a8 = moe_verdicts(rows)[4]
    assert w8a8.measured.startswith("1.46x our bf16 flat's speed") and w8a8.met is False
    rows.loc[1, "ms"] = 14.6  # 1.51x
    assert moe_verdicts(rows)[4].met is True
