"""Nsight Compute reports as tables: `load_ncu(path) -> NcuReport`.

Reads any `.ncu-rep` through NVIDIA's `ncu_report` package (from PyPI; it needs no GPU): one or
many kernels, with or without NVTX ranges, with or without imported source. The file is checked
and a packed one unpacked first (ncu_files); which metric names each table reads is in
ncu_metrics, the hot-spot table is built in ncu_source, ncu's rules in ncu_rules, which launches
a diff compares in ncu_pairs, and the terminal text in ncu_text.
Pure pandas: imports neither torch nor triton nor plotly; workbench.report draws the tables
and workbench.views.ncu.NcuResult adds figures and a page to the report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Self

import pandas as pd

from workbench.analysis.ncu_files import existing_form, openable, read_report, read_sidecar
from workbench.analysis.ncu_metrics import (
    CLOCK_ROW,
    FUNCTION_START,
    LIMIT_PREFIX,
    NOT_A_STALL,
    OCCUPANCY_METRICS,
    SUMMARY_METRICS,
    TIME_TO_US,
    TOP_STALL_ROWS,
    clock_shown,
    first_value,
    row_unit,
    stall_records,
)
from workbench.analysis.ncu_module import ncu_report
from workbench.analysis.ncu_pairs import LaunchPairs, pair_launches
from workbench.analysis.ncu_rules import rule_table
from workbench.analysis.ncu_source import (
    HOTSPOT_COLUMNS,
    INSTRUCTION_COLUMNS,
    hot_lines,
    instruction_stalls,
    pc_samples,
)
from workbench.analysis.ncu_text import MAIN_LAUNCHES, report_text
from workbench.errors import ArtifactError, WorkbenchError


def load_ncu(path: str | Path) -> NcuReport:
    """Every profiled launch of an Nsight Compute report, checked, as an NcuReport."""
    return NcuReport.load(path)


# ---- small helpers ---------------------------------------------------------------------------
def _nvtx_ranges(action) -> list[str]:
    """The NVTX ranges around a launch, outermost first; non-default domains as `domain@name`."""
    state = action.nvtx_state()
    if state is None:
        return []
    ranges = []
    for domain_id in state.domains():
        domain = state.domain_by_id(domain_id)
        prefix = "" if domain.name().startswith("<") else f"{domain.name()}@"
        ranges += [prefix + n for n in (*domain.push_pop_ranges(), *domain.start_end_ranges())]
    return ranges


def _launch_table(actions: Sequence) -> pd.DataFrame:
    """One row per launch, labelled by kernel name and innermost NVTX range (or launch index)."""
    rows = []
    for index, action in enumerate(actions):
        ranges = _nvtx_ranges(action)
        kernel = action.name()
        rows.append(
            {
                "index": index,
                "kernel": kernel,
                "function": action.name(ncu_report.IAction.NameBase_DEMANGLED),
                "nvtx": " > ".join(ranges),
                "label": f"{kernel} @ {ranges[-1]}" if ranges else f"{kernel} #{index}",
            }
        )
    table = pd.DataFrame(rows)
    repeated = table["label"].duplicated(keep=False)
    table.loc[repeated, "label"] += " #" + table.loc[repeated, "index"].astype(str)
    return table.set_index("label")


def _numeric(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(pd.to_numeric, errors="coerce").dropna(how="all")


# ---- the report ------------------------------------------------------------------------------
class NcuReport:
    """The launches of one Nsight Compute report and the tables made from them.

    `launches` has one row per profiled launch; its index (kernel @ innermost NVTX range, or
    kernel #index) labels the launch in every table. `meta` is the capture's `<name>.json`.
    """

    def __init__(
        self,
        path: Path,
        actions: Sequence,
        meta: dict | None = None,
        context: object = None,
        launches: pd.DataFrame | None = None,
    ):
        self.path = Path(path)
        self.meta = meta or {}
        # the loaded report (and a packed report's unpacked copy): the actions read from them
        self._context = context
        self._actions = list(actions)
        self.launches = _launch_table(self._actions) if launches is None else launches
        self._names = [frozenset(a.metric_names()) for a in self._actions]
        self._hot: dict[int, pd.DataFrame] = {}  # hot lines per launch, made on first use
        self._samples: dict[int, dict] = {}  # PC samples per launch, read on first use
        self._by_instruction: dict[int, pd.DataFrame] = {}  # samples by opcode, on first use

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Every profiled launch of the report at `path`, after checking the file is whole.

        A classmethod so that a subclass (workbench.views.ncu.NcuResult) loads as itself.
        """
        path = existing_form(Path(path))
        data = read_report(path)
        opened, unpacked = openable(path, data)
        context = ncu_report.load_report(str(opened))
        actions = [rng[i] for rng in context for i in range(len(rng))]
        if not actions:
            raise ArtifactError(
                f"{path} holds no profiled kernel launch ({len(context)} ranges, 0 launches): "
                "ncu matched no kernel, e.g. its NVTX filter matched no range. Re-run the capture."
            )
        return cls(path, actions, read_sidecar(path), (context, unpacked))

    def __len__(self) -> int:
        return len(self._actions)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path.name!r}, {len(self)} launches)"

    @property
    def labels(self) -> list[str]:
        return list(self.launches.index)

    @property
    def title(self) -> str:
        m = self.meta
        if "kernel" in m:
            return f"{m['kernel']} / {m['variant']}, T = {', '.join(map(str, m['tokens']))}"
        return self.path.name

    def _position(self, launch: str | int) -> int:
        if isinstance(launch, int) and -len(self) <= launch < len(self):
            return launch % len(self)
        if launch in self.launches.index:
            return self.labels.index(launch)
        raise WorkbenchError(
            f"no launch {launch!r} in {self.path.name}; give an index below {len(self)} or one "
            f"of: {', '.join(self.labels)}"
        )

    # ---- metrics -------------------------------------------------------------------------
    def metrics(self, *names: str) -> pd.DataFrame:
        """Raw values of the named metrics (rows) for every launch (columns); missing is NaN."""
        values = {}
        for label, action in zip(self.labels, self._actions):
            metrics = [action.metric_by_name(n) for n in names]
            values[label] = [math.nan if m is None else m.value() for m in metrics]
        return pd.DataFrame(values, index=list(names))

    def _first(self, i: int, candidates: Sequence[str], units: dict | None = None) -> tuple:
        """(value, metric name) of the first candidate launch `i` has; (NaN, None) if none."""
        return first_value(self._actions[i], self._names[i], candidates, units)

    def _rows(self, table: dict[str, tuple[str, ...]]) -> tuple[dict, dict]:
        values, used = {}, {}
        for row, candidates in table.items():
            found = [self._first(i, candidates, row_unit(row)) for i in range(len(self))]
            values[row] = [value for value, _ in found]
            used[row] = [name for _, name in found]
        return values, used

    def _shown_rows(self) -> tuple[dict, dict]:
        """`_rows` of SUMMARY_METRICS as the summary shows them: a launch's clock only from
        CLOCK_MIN_US of launch time (`clock_shown`), and no metric named where it is hidden."""
        values, used = self._rows(SUMMARY_METRICS)
        values[CLOCK_ROW] = list(map(clock_shown, values[CLOCK_ROW], values["Duration (us)"]))
        used[CLOCK_ROW] = [None if math.isnan(value) else name
                           for value, name in zip(values[CLOCK_ROW], used[CLOCK_ROW])]  # fmt: skip
        return values, used

    def summary(self) -> pd.DataFrame:
        """The headline metrics (rows) per launch (columns), like the seed's ncu table.

        Rows come from SUMMARY_METRICS (metric_sources() says which name gave each value), then
        the top stall reason by cycles per issued instruction (the issuing "selected" state
        excluded; by PC samples where the report has no cycles) and its share of the samples.
        """
        values, _ = self._shown_rows()
        top = [self._top_stalls.get(label, (None, math.nan, math.nan)) for label in self.labels]
        for row, column in zip(TOP_STALL_ROWS, zip(*top)):
            values[row] = list(column)
        return pd.DataFrame(values, index=self.labels).T

    def metric_sources(self) -> pd.DataFrame:
        """The metric name behind each SUMMARY_METRICS value (None where the report has none,
        or where the summary hides it: the clock of a short launch)."""
        return pd.DataFrame(self._shown_rows()[1], index=self.labels).T

    # ---- stalls --------------------------------------------------------------------------
    @cached_property
    def _stall_records(self) -> pd.DataFrame:
        """Long form: launch, reason, cycles_per_issue, samples, share_pct (of all samples)."""
        return stall_records(self.labels, self._actions, self._names)

    def stalls(self) -> pd.DataFrame:
        """Every stall reason (rows): cycles per issued instruction and % of the PC samples,
        per launch (column groups). Each launch's shares add up to 100."""
        records = self._stall_records
        columns = pd.MultiIndex.from_product([self.labels, ["cycles_per_issue", "share_pct"]])
        if records.empty:
            return pd.DataFrame(columns=columns)
        wide = records.pivot(index="reason", columns="launch")
        wide = wide[["cycles_per_issue", "share_pct"]].swaplevel(axis=1).reindex(columns=columns)
        order = records.groupby("reason")[["share_pct", "cycles_per_issue"]].mean()
        order = order.sort_values(["share_pct", "cycles_per_issue"], ascending=False).index
        wide = wide.loc[order]
        wide.index.name = "reason"
        return wide

    @cached_property
    def _top_stalls(self) -> dict[str, tuple[str | None, float, float]]:
        """Per launch: (reason, cycles per issue, % of samples) of the top stall, by cycles per
        issued instruction where the report has them, else by samples."""
        top: dict[str, tuple[str | None, float, float]] = {}
        for key in ("share_pct", "cycles_per_issue"):  # the later key wins where it is known
            known = self._stall_records.dropna(subset=[key])
            known = known[known["reason"] != NOT_A_STALL].sort_values(key, kind="stable")
            for row in known.drop_duplicates("launch", keep="last").itertuples(index=False):
                top[row.launch] = (row.reason, row.cycles_per_issue, row.share_pct)
        return top

    # ---- source hot spots ----------------------------------------------------------------
    def _pc_samples(self, i: int) -> dict[int, dict[str, float]]:
        """Launch `i`'s samples per instruction address and stall reason, read on first use."""
        if i not in self._samples:
            self._samples[i] = pc_samples(self._actions[i], self._names[i])
        return self._samples[i]

    def _hot_lines(self, i: int) -> pd.DataFrame:
        """Every sampled source line (or SASS instruction) of launch `i`, made on first use."""
        if i not in self._hot:
            start = self._first(i, FUNCTION_START)[0]
            self._hot[i] = hot_lines(self._actions[i], self._pc_samples(i), self.labels[i], start)
        return self._hot[i]

    def _instruction_rows(self, i: int) -> pd.DataFrame:
        """Launch `i`'s samples by SASS opcode and stall reason, made on first use."""
        if i not in self._by_instruction:
            self._by_instruction[i] = instruction_stalls(
                self._actions[i], self._pc_samples(i), self.labels[i]
            )
        return self._by_instruction[i]

    def _per_launch(
        self, rows_of, n: int, launch: str | int | list[str] | None, columns: list[str]
    ) -> pd.DataFrame:
        """The first `n` rows of `rows_of(i)` for each launch (or one, or those labelled),
        stacked; empty with `columns` where none of them has any."""
        if launch is None:
            picks = range(len(self))
        elif isinstance(launch, list):
            picks = [self._position(label) for label in launch]
        else:
            picks = [self._position(launch)]
        frames = [rows_of(i).head(n) for i in picks]
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)

    def hotspots(self, n: int = 10, launch: str | int | None = None) -> pd.DataFrame:
        """The `n` most sampled source lines of each launch (or of one), hottest first.

        Columns: launch, level ("source", or "sass" where the report maps no line), file, line,
        address (SASS offset in the function), text, samples, share_pct of the launch's samples,
        top_stall (the reason holding most of the line's samples). Triton kernels map to their
        Python lines. Empty when the report has no PC sampling (SourceCounters section).
        """
        return self._per_launch(self._hot_lines, n, launch, HOTSPOT_COLUMNS)

    def instruction_stalls(self, n: int = 10, launch: str | int | None = None) -> pd.DataFrame:
        """The `n` largest shares of each launch's (or one launch's) PC samples by SASS opcode
        and stall reason (ncu_source.instruction_stalls says how to read them).

        Columns: launch, instruction (`WARPGROUP.DEPBAR`, `BRA`, `FFMA`, ...), reason,
        samples, share_pct of the launch's samples. Empty without PC sampling."""
        return self._per_launch(self._instruction_rows, n, launch, INSTRUCTION_COLUMNS)

    # ---- occupancy, rules, diff ----------------------------------------------------------
    def occupancy(self) -> pd.DataFrame:
        """Theoretical and achieved occupancy, the block limits and what sets them, per launch.

        "Limiter" names the smallest block limit(s): the resource that caps resident blocks.
        """
        values, _ = self._rows(OCCUPANCY_METRICS)
        limits = {k.removeprefix(LIMIT_PREFIX): v for k, v in values.items() if LIMIT_PREFIX in k}
        limiter = []
        for i in range(len(self)):
            known = {name: v[i] for name, v in limits.items() if not math.isnan(v[i])}
            low = min(known.values(), default=None)
            limiter.append(", ".join(k for k, v in known.items() if v == low) or None)
        values["Limiter"] = limiter
        return pd.DataFrame(values, index=self.labels).T

    def rules(self) -> pd.DataFrame:
        """ncu's own rule results per launch, the largest estimated speedup first (ncu_rules).

        `speedup_pct` is ncu's "Est. Speedup" (local: of this launch; global: of the run).
        """
        return rule_table(self.labels, self._actions)

    def diff(self, baseline: str | int | NcuReport) -> pd.DataFrame:
        """Change of every numeric summary metric from a baseline, per launch.

        `baseline` is a launch of this report (label or index) or another NcuReport, whose
        launches pair with these by label, else by kernel, token count and position (pairs()
        says which; a launch that pairs with none is left out). Columns per launch: `change`
        (this minus baseline) and `change_pct` (of the baseline).
        """
        mine = _numeric(self.summary())
        if isinstance(baseline, NcuReport):
            base = _numeric(baseline.summary())
            pairs = self.pairs(baseline).pairs
        else:
            base, reference = mine, self.labels[self._position(baseline)]
            pairs = {label: reference for label in self.labels}
        base = base.reindex(mine.index)
        out = {}
        for label, reference in pairs.items():
            change = mine[label] - base[reference]
            pct = 100 * change / base[reference].abs()
            out[(label, "change")] = change
            out[(label, "change_pct")] = pct.where(base[reference] != 0)
        return pd.DataFrame(out, index=mine.index)

    def pairs(self, baseline: NcuReport) -> LaunchPairs:
        """Which launch of `baseline` each launch here is compared with (ncu_pairs says how),
        and what pairs with nothing. Raises when no launch pairs at all."""
        found = pair_launches(self.launches, self.meta, baseline.launches, baseline.meta)
        if not found.pairs:
            raise WorkbenchError(
                f"no launch of {self.path.name} ({', '.join(self.labels)}) runs a kernel of "
                f"{baseline.path.name} ({', '.join(baseline.labels)}). Narrow both to the "
                "launches to compare: `--select REGEX` on the command line, select() in Python; "
                "a label is `kernel @ NVTX range`, so anchor the pattern at the kernel's name "
                "(`^(_w8a8|sm90_fp8)`): a word of a range matches every launch in it."
            )
        return found

    def select(self, pattern: str) -> Self:
        """The launches whose label matches regular expression `pattern` (e.g. "gate_up")."""
        keep = [i for i, label in enumerate(self.labels) if re.search(pattern, label)]
        if not keep:
            raise WorkbenchError(
                f"no launch label matches {pattern!r}; labels: {', '.join(self.labels)}"
            )
        return type(self)(
            self.path,
            [self._actions[i] for i in keep],
            self.meta,
            self._context,
            self.launches.iloc[keep],
        )

    # ---- kernel time, text -----------------------------------------------------------------
    def _durations(self) -> pd.Series:
        duration = SUMMARY_METRICS["Duration (us)"]
        return pd.Series([self._first(i, duration, TIME_TO_US)[0] for i in range(len(self))])

    def kernel_time(self) -> pd.DataFrame:
        """Where the profiled time goes, kernel by kernel, the longest first: launches, total
        duration (us) and share of the report's. A decode step's 134 launches come to 28 kernels.

        ncu replays each launch alone with its caches flushed, so these rank a step's kernels;
        they do not add up to a served step's time (profile()'s traces do that).
        """
        frame = pd.DataFrame(
            {"kernel": self.launches["kernel"].to_numpy(), "us": self._durations().to_numpy()}
        )
        table = frame.groupby("kernel").agg(
            launches=("us", "size"), total_us=("us", "sum"), mean_us=("us", "mean")
        )
        table["share_pct"] = 100 * table["total_us"] / table["total_us"].sum()
        return table.sort_values("total_us", ascending=False)

    def main_launches(self, n: int = MAIN_LAUNCHES) -> list[str]:
        """The `n` longest launches, in report order: the ones text and HTML detail."""
        keep = set(self._durations().fillna(0).nlargest(n).index)
        return [label for i, label in enumerate(self.labels) if i in keep]

    def main_hotspots(self) -> pd.DataFrame:
        """The hot spots of the main launches (of the first launch if none of them has any)."""
        hot = self._per_launch(self._hot_lines, 10, self.main_launches(), HOTSPOT_COLUMNS)
        return hot if not hot.empty else self.hotspots(launch=0)

    def main_instruction_stalls(self, n: int = 8) -> pd.DataFrame:
        """instruction_stalls() of the main launches, the `n` largest shares of each."""
        main = self.main_launches()
        return self._per_launch(self._instruction_rows, n, main, INSTRUCTION_COLUMNS)

    def notes(self) -> list[str]:
        """One line on where the report came from, when its capture metadata is there."""
        m = self.meta
        if "ncu_version" not in m:
            return [f"{self.path.name}: {len(self)} profiled launches."]
        gpu = m.get("environment", {}).get("gpu", {}).get("name") or "unknown GPU"
        return [
            f"{self.path.name}: {len(self)} profiled launches on {gpu}, ncu {m['ncu_version']}, "
            f"captured {m.get('environment', {}).get('date', '')}; preset {m.get('preset')}, "
            f"routing {m.get('routing')}, parameters {m.get('params') or 'default'}."
        ]

    def text(self) -> str:
        """The tables as text (what capture() writes to `<name>.summary.txt`)."""
        return report_text(self)
