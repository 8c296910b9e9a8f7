"""Sweeps and A/B runs as results: their rows, the tables a reader wants, and their loaders.

A sweep times one kernel parameter over values x token counts; an A/B run times two settings
of the same workload, or two whole `profile()` settings, per token count. Both are captured by
`workbench.capture.experiments` (one worker per configuration) into `rows.jsonl` + `run.json`;
this module reads them back on any machine: no torch, no plotly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.stats import ratio, runs_median_ratio, runs_ratio
from workbench.analysis.tables import GAPS, TOTAL
from workbench.artifacts import read_meta, read_rows
from workbench.errors import ArtifactError

SWEEP_COLUMNS = ["param", "value", "tokens", "status", "ms", "q1", "q3", "ci_low", "ci_high",
                 "n", "regs", "spills", "rel_error", "error"]  # fmt: skip
FAILURE_LABELS = {"timeout": "timeout (deadlock?)"}
PHASES = ("prefill", "decode")


def _phase_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """A profile A/B's rows, one per arm, tokens and phase: a worker's row holds every phase
    of its one profile run (`by_phase`); a failed run's status stands for each of its phases.
    Runs recorded with one row per phase pass as they are."""
    if "by_phase" not in rows:
        return rows
    out = []
    for row in rows.to_dict("records"):
        measured = row.pop("by_phase")
        measured = measured if isinstance(measured, dict) else {}
        for phase in row.get("phases") or measured:
            out.append({**row, "phase": phase, **measured.get(phase, {})})
    return pd.DataFrame(out)


def _percent(change: float) -> str:
    return f"{-change:.0f}% faster" if change < 0 else f"{change:.0f}% slower"


@dataclass
class SweepResult:
    """Rows of a sweep (one per value x tokens) and the run's metadata."""

    meta: dict
    rows: pd.DataFrame

    @property
    def param(self) -> str:
        return self.meta["params"]["param"]

    def table(self) -> pd.DataFrame:
        """One row per value x tokens: status, median ms, quartiles, 95% interval, facts."""
        return self.rows.reindex(columns=SWEEP_COLUMNS).reset_index(drop=True)

    def did_not_help(self, baseline_value) -> pd.DataFrame:
        """The seed's "Things that did not help": per value against the baseline, the effect
        range across token counts where both ran, and the failures (status at param=value)."""
        table = self.table()
        base = table[(table["value"] == baseline_value) & table["ms"].notna()]
        base_ms = base.set_index("tokens")["ms"]
        out = []
        for value, group in table.groupby("value", sort=False):
            failures = []
            for status, bad in group[~group["status"].isin(["ok"])].groupby("status"):
                label = FAILURE_LABELS.get(status, status)
                where = f"{label} at {self.param}={value}"
                if len(bad) < len(group):
                    where += f" (tokens {', '.join(str(t) for t in bad['tokens'])})"
                failures.append(where)
            if value == baseline_value and not failures:
                continue
            timed = group[group["ms"].notna() & group["tokens"].isin(base_ms.index)]
            changes = (timed["ms"].to_numpy() / base_ms[timed["tokens"]].to_numpy() - 1) * 100
            if value == baseline_value or not len(changes):
                effect = ""
            elif len(changes) == 1 or changes.min() == changes.max():
                effect = _percent(changes[0])
            else:
                effect = f"between {_percent(changes.min())} and {_percent(changes.max())}"
            change = f"{self.param}={baseline_value} -> {value}"
            if value == baseline_value:
                change = f"{self.param}={value} (the baseline)"
            out.append({"change": change,
                        "effect": effect, "failures": "; ".join(failures)})  # fmt: skip
        return pd.DataFrame(out, columns=["change", "effect", "failures"])


@dataclass
class AbResult:
    """Rows of an A/B run (one per arm x tokens) and the ratio b/a per token count."""

    meta: dict
    rows: pd.DataFrame

    def table(self) -> pd.DataFrame:
        """Per tokens (and phase, for profile A/Bs): both medians (over an arm's runs, the
        median of their medians), ratio = median(b)/median(a) (below 1: b is faster), its
        bootstrap 95% interval and whether it excludes 1 (the change exceeds the noise); with
        several runs an arm the interval spans the runs too (`stats.runs_median_ratio`).
        Profile A/Bs pair their steps: ratio = total time of b over
        a over every run (`stats.runs_ratio`), and each arm's tokens per second (the median
        over its runs, like its ms)."""
        keys = _size_keys(self.rows)
        extra = [c for c in ("tokens_per_s", "dense_ms") if c in self.rows]
        out = []
        for key, group in self.rows.groupby(keys, sort=False):
            a, b = (_runs_of(group, arm) for arm in "ab")
            line = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            line |= {"status_a": _status(a), "status_b": _status(b),
                     "ms_a": _median_of(a, "ms"), "ms_b": _median_of(b, "ms")}  # fmt: skip
            line |= {f"{c}_{arm}": _median_of(runs, c) for c in extra
                     for arm, runs in (("a", a), ("b", b))}  # fmt: skip
            samples_a, samples_b = _samples(a), _samples(b)
            if samples_a and samples_b:
                line |= _compare(samples_a, samples_b, paired="phase" in keys)
            out.append(line)
        columns = [*keys, "status_a", "status_b", "ms_a", "ms_b",
                   *(f"{c}_{arm}" for c in extra for arm in "ab"), "ratio", "ci_low", "ci_high",
                   "significant"]  # fmt: skip
        # rows arrive as workers finish: sorted by size, prefill before decode
        return _by_size(pd.DataFrame(out).reindex(columns=columns), keys)

    def where(self) -> pd.DataFrame:
        """Where an A/B's change went, per size (and phase): the parts of what was timed in
        each arm, the median over its runs that recorded them, b - a in ms and in percent of
        a, the parts by the size of their change, the total last; `runs` is the fewer of the
        two arms' runs that recorded parts. A profile A/B's parts are its mean step's
        categories, their total and the gaps between kernels (`measure_profile`); a kernel
        A/B's, on a GPU, each kernel name's time per call, a dense call being one layer
        (`kernel_times`, which says how to read them). Empty where no run recorded parts (a
        CPU's kernel A/B; runs before they were recorded). A category no run of either arm
        launched in the phase is left out."""
        keys = _size_keys(self.rows)
        column = "step_parts_ms" if "phase" in keys else "kernel_ms"  # profile, kernel A/B
        columns = [*keys, "part", "ms_a", "ms_b", "change_ms", "change_pct", "runs"]
        if column not in self.rows:
            return pd.DataFrame(columns=columns)
        out = []
        for key, group in self.rows.groupby(keys, sort=False):
            where = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            # a failed run has no parts, a CPU's kernel A/B an empty set
            arms = {arm: [r[column] for r in _runs_of(group, arm)
                          if isinstance(r.get(column), dict) and r[column]]
                    for arm in "ab"}  # fmt: skip
            if not all(arms.values()):
                continue  # an arm with no run that recorded its parts: nothing to set against
            lines = []
            for part in dict.fromkeys(k for runs in arms.values() for parts in runs for k in parts):
                values = {arm: [p.get(part, 0.0) for p in arms[arm]] for arm in "ab"}
                if part not in (TOTAL, GAPS) and not any(values["a"] + values["b"]):
                    continue  # a category no run of either arm launched in this phase
                a, b = (float(np.median(values[arm])) for arm in "ab")
                lines.append({**where, "part": part, "ms_a": a, "ms_b": b, "change_ms": b - a,
                              "change_pct": 100 * (b - a) / a if a else np.nan,
                              "runs": min(len(arms["a"]), len(arms["b"]))})  # fmt: skip
            lines.sort(key=lambda line: (line["part"] == TOTAL, -abs(line["change_ms"])))
            out += lines
        return _by_size(pd.DataFrame(out, columns=columns), keys)  # parts keep their order


def _size_keys(rows: pd.DataFrame) -> list[str]:
    """What tells an A/B's sizes apart: the phase too for a profile A/B."""
    return ["phase", "tokens"] if "phase" in rows else ["tokens"]


def _by_size(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`table` by size, prefill before decode as profiles show them; rows of one size keep
    their order."""
    return table.sort_values(keys, key=lambda c: c.map(PHASES.index) if c.name == "phase" else c,
                             kind="stable", ignore_index=True)  # fmt: skip


def _runs_of(group: pd.DataFrame, arm: str) -> list[dict]:
    """An arm's rows at one size, in run order (one row unless a profile A/B repeated it)."""
    rows = group[group["arm"] == arm]
    if "run" in rows:
        rows = rows.sort_values("run", kind="stable")
    return rows.to_dict("records")


def _status(runs: list[dict]) -> str | None:
    """'ok' when every run was measured, else the first failed run's status."""
    statuses = [r.get("status") for r in runs]
    return next((s for s in statuses if s != "ok"), statuses[0] if statuses else None)


def _median_of(runs: list[dict], column: str) -> float | None:
    values = [r[column] for r in runs if isinstance(r.get(column), int | float)]
    return float(np.median(values)) if values else None


def _samples(runs: list[dict]) -> list[list[float]]:
    """Each run's samples, or nothing when a run has none (it failed)."""
    samples = [r.get("samples_ms") for r in runs]
    return samples if samples and all(isinstance(s, list) for s in samples) else []


def _compare(a: list[list[float]], b: list[list[float]], paired: bool) -> dict:
    """The A/B ratio of two arms' runs of samples: paired step by step when run r of each arm
    ran the same steps (a profile's chunks and decode steps), over the runs
    (`stats.runs_ratio`), else the unpaired ratio of the runs' medians, its interval over the
    runs and the samples (`stats.runs_median_ratio`: one run an arm, `stats.ratio`)."""
    if paired and len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b, strict=True)):
        return runs_ratio(a, b)
    if paired:  # unmatched steps: pooled, as before runs were kept apart
        return ratio([v for run in a for v in run], [v for run in b for v in run])
    return runs_median_ratio(a, b)


def _load(run_dir: str | Path, kind: str) -> tuple[dict, pd.DataFrame]:
    meta = read_meta(run_dir)
    if meta.get("kind") != kind:
        raise ArtifactError(f"{run_dir} holds a {meta.get('kind')!r} run, not a {kind!r} one.")
    rows = pd.DataFrame(read_rows(run_dir))
    return meta, rows


def load_sweep(run_dir: str | Path) -> SweepResult:
    """A sweep from its run directory (rows.jsonl + run.json); no torch needed."""
    meta, rows = _load(run_dir, "sweep")
    if len(rows):
        order = {v: i for i, v in enumerate(meta["params"]["values"])}
        rows = rows.sort_values(["value", "tokens"], key=lambda c: c.map(order) if
                                c.name == "value" else c, kind="stable")  # fmt: skip
    return SweepResult(meta, rows)


def load_ab(run_dir: str | Path) -> AbResult:
    """An A/B run from its run directory; no torch needed."""
    meta, rows = _load(run_dir, "ab")
    return AbResult(meta, _phase_rows(rows))
