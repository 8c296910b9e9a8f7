"""Several Nsight Compute reports read as one set: which variant and token count each launch is.

A capture writes one report per variant and token count (a report of both sizes is too large
to return from the GPU machine), so the seed's "Nsight Compute on the stock kernel" table, with
its 6-token and 4096-token columns, spans files. A MoE call is several launches (expert counts,
offsets, permutation, the gate-up and down GEMMs, the combine); the seed's table is about the
GEMMs, so each launch gets a *role* (its kernel name without the scheduler's name, so stock's
and flat's gate-up kernels pair up) and the launches holding a real share of their call's time
are its *main* launches. Pure pandas over `NcuReport`: no torch, no plotly; the set's figures
are drawn by workbench.report.ncu_page (and workbench.views.ncu.NcuCatalogResult.figure).
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

import pandas as pd

from workbench.analysis.ncu import HOTSPOT_COLUMNS, NcuReport
from workbench.analysis.ncu_files import SUFFIXES, report_stem, shadowed
from workbench.errors import ArtifactError, WorkbenchError

# Scheduler names as they appear in kernel names (`_stock_gate_up_kernel`); removing them gives
# the role that pairs a launch of one variant with the same step of another.
SCHEDULER_WORDS = ("stock", "multirow", "flat", "padded")
# A launch is "main" when it holds at least this share of its NVTX range's kernel time: the
# routing kernels take microseconds next to the GEMMs and would only clutter the seed's table.
MAIN_SHARE = 0.10
TOKENS_IN_RANGE = re.compile(r"T=(\d+)")
# The experts' format a served profile on the GPU runs (capture.profile_settings.SERVED_ON_GPU),
# which a capture set's labels leave unsaid.
SERVED_FORMAT = "fp8"
# The seed's table, in its order: summary rows (NcuReport.summary) shown per main launch.
SEED_ROWS = (
    "Duration (us)",
    "DRAM throughput (%)",
    "Issue slots busy (%)",
    "Registers per thread",
    "Achieved occupancy (%)",
    "Integer ALU pipe (%)",
    "Tensor pipe (%)",
    "Top stall, cycles per issued instruction",
    "Top stall, % of samples",
    "Local-memory spill requests",
)
TOP_STALL = "Top stall, cycles per issued instruction"
NO_REPORTS = (
    "no Nsight Compute report matches {where}. Capture them on the GPU machine, e.g. "
    "`workbench ncu moe stock --tokens 6 4096 --param fmt=fp8` (and `flat`), and commit "
    "ncu/*.ncu-rep (or packed, .ncu-rep.gz or .ncu-rep.xz) with their .json; or point "
    "WORKBENCH_NCU_REPORTS at a glob of reports."
)


def find_reports(where: str | Path) -> list[Path]:
    """`.ncu-rep` (or packed `.ncu-rep.gz`, `.ncu-rep.xz`) files: a folder's reports, or those a
    glob matches, sorted by name."""
    where = Path(where)
    if where.is_dir():
        found = [Path(p) for suffix in SUFFIXES for p in glob.glob(str(where / f"*{suffix}"))]
    else:
        found = [Path(p) for p in glob.glob(str(where))]
    return sorted(p for p in found if not shadowed(p))


def role(kernel: str) -> str:
    """A kernel's step in the MoE pipeline: `_flat_gate_up_kernel` -> `gate_up`."""
    words = [w for w in kernel.strip("_").split("_") if w and w not in SCHEDULER_WORDS]
    if words and words[-1] == "kernel":
        words.pop()
    return "_".join(words) or kernel


def variant_label(meta: dict, path: Path) -> str:
    """The variant and its parameters (`multirow rows=2`), after the kernel when it is not the
    MoE (`model-decode-step stock`). The experts' format is named only when it is not the
    served one (`flat fmt=int4`), so a set can hold one scheduler in two formats without
    pairing an INT4 launch with an FP8 one. Foreign reports: the file name."""
    if "variant" not in meta:
        return report_stem(path)
    params = meta.get("params") or {}
    params = {k: v for k, v in params.items() if (k, v) != ("fmt", SERVED_FORMAT)}
    kernel = [] if meta.get("kernel", "moe") == "moe" else [meta["kernel"]]
    words = [*kernel, meta["variant"], *(f"{k}={v}" for k, v in sorted(params.items()))]
    return " ".join(words)


def _gpu(report: NcuReport) -> str:
    return str(report.meta.get("environment", {}).get("gpu", {}).get("name", ""))


def variants_of(reports: list[NcuReport]) -> list[str]:
    """Each report's variant (`variant_label`); where reports of one variant ran on different
    GPUs (the same GEMM captured on an H100 and an H200), each names its GPU
    (`dense deepgemm projection=o_b on NVIDIA H100 80GB HBM3`), so no table sets one card's
    launch beside another's as if they came from one capture. The label keeps its first word
    (the scheduler, which orders the seed's tables)."""
    labels = [variant_label(report.meta, report.path) for report in reports]
    gpus: dict[str, set[str]] = {}
    for label, report in zip(labels, reports, strict=True):
        gpus.setdefault(label, set()).add(_gpu(report))
    return [
        f"{label} on {_gpu(report) or 'an unnamed GPU'}" if len(gpus[label]) > 1 else label
        for label, report in zip(labels, reports, strict=True)
    ]


def _tokens(nvtx: str, meta: dict) -> int | None:
    found = TOKENS_IN_RANGE.findall(nvtx)
    if found:
        return int(found[-1])
    tokens = meta.get("tokens") or []
    return int(tokens[0]) if len(tokens) == 1 else None


@dataclass(frozen=True)
class Launch:
    """One launch of the set: its report, its label there, what it is and its share of its call."""

    report: NcuReport
    label: str
    variant: str
    tokens: int | None
    role: str
    duration_us: float
    share_pct: float
    column: str  # its column in the set's tables, unique within its variant: `6 tokens, gate_up`

    @property
    def main(self) -> bool:
        return self.share_pct >= 100 * MAIN_SHARE


def _launches_of(report: NcuReport, variant: str) -> list[Launch]:
    """A report's launches; a launch's call is its NVTX range (or the whole report)."""
    durations = pd.to_numeric(report.summary().loc["Duration (us)"], errors="coerce").fillna(0)
    calls = report.launches["nvtx"].where(report.launches["nvtx"] != "", "(no range)")
    per_call = durations.groupby(calls).transform("sum")
    launches = []
    for label, row in report.launches.iterrows():
        tokens, kind = _tokens(row["nvtx"], report.meta), role(row["kernel"])
        size = f"{tokens} tokens" if tokens is not None else "tokens unknown"
        share = 100 * float(durations[label] / per_call[label]) if per_call[label] else 0.0
        launches.append(Launch(report, label, variant, tokens, kind, float(durations[label]),
                               share, f"{size}, {kind}"))  # fmt: skip
    return launches


def _unique_columns(launches: list[Launch]) -> list[Launch]:
    """Number the columns a variant repeats (a kernel launched twice in one call): `... #2`."""
    seen: dict[tuple[str, str], int] = {}
    for launch in launches:
        seen[launch.variant, launch.column] = seen.get((launch.variant, launch.column), 0) + 1
    count: dict[tuple[str, str], int] = {}
    out = []
    for launch in launches:
        key = (launch.variant, launch.column)
        count[key] = count.get(key, 0) + 1
        if seen[key] > 1:
            launch = replace(launch, column=f"{launch.column} #{count[key]}")
        out.append(launch)
    return out


class NcuCatalog:
    """Reports of one capture set (e.g. every `ncu/*.ncu-rep`), indexed by variant and tokens."""

    # What load() reads each file as: a subclass of the catalog can load a subclass of the report.
    report_type: type[NcuReport] = NcuReport

    def __init__(self, reports: Iterable[NcuReport]):
        self.reports = list(reports)
        if not self.reports:
            raise ArtifactError(NO_REPORTS.format(where="the given paths"))
        self._variants = variants_of(self.reports)
        pairs = zip(self.reports, self._variants, strict=True)
        self.all = _unique_columns([x for r, v in pairs for x in _launches_of(r, v)])

    @classmethod
    def load(cls, where: str | Path | Iterable[str | Path]) -> Self:
        """Every report in a folder or glob (or the given paths), checked by `NcuReport.load`."""
        paths = find_reports(where) if isinstance(where, str | Path) else [Path(p) for p in where]
        if not paths:
            raise ArtifactError(NO_REPORTS.format(where=str(where)))
        return cls(cls.report_type.load(p) for p in paths)

    # ---- what the set holds --------------------------------------------------------------
    def entries(self) -> pd.DataFrame:
        """One row per report: file, variant, kernel, tokens, format, launches, GPU, ncu, date,
        commit (from the capture's `<name>.json`; empty for a foreign report)."""
        rows = []
        for report, variant in zip(self.reports, self._variants, strict=True):
            m, env = report.meta, report.meta.get("environment", {})
            rows.append(
                {
                    "file": report.path.name,
                    "variant": variant,
                    "kernel": m.get("kernel", ""),
                    "tokens": ", ".join(map(str, m.get("tokens", []))),
                    "format": (m.get("params") or {}).get("fmt", ""),
                    "launches": len(report),
                    "gpu": _gpu(report),
                    "ncu": m.get("ncu_version", ""),
                    "date": env.get("date", ""),
                    "commit": str(env.get("git", {}).get("commit") or "")[:10],
                }
            )
        return pd.DataFrame(rows)

    def launches(self) -> pd.DataFrame:
        """Every launch: variant, tokens, role, label, file, duration, share of its call (its
        NVTX range) and whether it is a main launch (at least MAIN_SHARE of the call)."""
        return pd.DataFrame(
            [{"variant": x.variant, "tokens": x.tokens, "role": x.role, "launch": x.label,
              "file": x.report.path.name, "duration_us": x.duration_us,
              "share_pct": x.share_pct, "main": x.main} for x in self.all]
        )  # fmt: skip

    @property
    def variants(self) -> list[str]:
        return list(dict.fromkeys(launch.variant for launch in self.all))

    def tokens(self, variant: str | None = None) -> list[int]:
        """Token counts profiled (of one variant), ascending."""
        return sorted(
            {x.tokens for x in self.all if x.tokens is not None and variant in (None, x.variant)}
        )

    def main(self, variant: str, tokens: int | None = None) -> list[Launch]:
        """The main launches of a variant (at one token count), by tokens then report order."""
        self._check_variant(variant)
        picked = [x for x in self.all if x.variant == variant and x.main]
        picked = [x for x in picked if tokens in (None, x.tokens)]
        return sorted(picked, key=lambda x: x.tokens or 0)

    def _check_variant(self, variant: str) -> None:
        if variant not in self.variants:
            raise WorkbenchError(
                f"no report of variant {variant!r}; the set holds: {', '.join(self.variants)}"
            )

    # ---- tables --------------------------------------------------------------------------
    def seed_table(self, variant: str = "stock") -> pd.DataFrame:
        """The seed's "Nsight Compute on <variant>" table: its rows for every main launch, the
        top stall written as "barrier 1.61" (reason, cycles per issued instruction)."""
        columns = {}
        for launch in self.main(variant):
            summary = launch.report.summary()[launch.label]
            values = summary.reindex(SEED_ROWS)
            cycles = summary.get(TOP_STALL)
            reason = summary.get("Top stall")
            values[TOP_STALL] = (
                f"{reason} {cycles:.2f}" if reason and pd.notna(cycles) else (reason or None)
            )
            columns[launch.column] = values
        return pd.DataFrame(columns)

    def stalls(self, variant: str = "stock") -> pd.DataFrame:
        """Stall reasons (rows) of the main launches: cycles per issued instruction and % of PC
        samples per launch (column groups), as NcuReport.stalls()."""
        frames = []
        for launch in self.main(variant):
            stalls = launch.report.stalls()
            if stalls.empty:
                continue
            part = stalls[launch.label]
            part.columns = pd.MultiIndex.from_product([[launch.column], part.columns])
            frames.append(part)
        if not frames:
            return pd.DataFrame()
        wide = pd.concat(frames, axis=1)
        order = wide.xs("share_pct", axis=1, level=1).mean(axis=1).sort_values(ascending=False)
        return wide.loc[order.index]

    def occupancy(self, variant: str = "stock") -> pd.DataFrame:
        """Occupancy, the block limits and the limiter of each main launch."""
        return pd.DataFrame(
            {
                launch.column: launch.report.occupancy()[launch.label]
                for launch in self.main(variant)
            }
        )

    def hotspots(self, variant: str = "stock", tokens: int | None = None, n: int = 10):
        """The `n` most sampled source lines of each main launch, `launch` as its column name."""
        frames = []
        for launch in self.main(variant, tokens):
            hot = launch.report.hotspots(n, launch=launch.label)
            frames.append(hot.assign(launch=launch.column))
        frames = [f for f in frames if not f.empty]
        if not frames:
            return pd.DataFrame(columns=HOTSPOT_COLUMNS)
        return pd.concat(frames, ignore_index=True)

    def diff(self, variant: str, baseline: str = "stock") -> pd.DataFrame:
        """`variant` against `baseline`, launch by launch where both have a main launch of the
        same role and token count: the baseline's value, the variant's, and the change in %
        (NcuReport.diff of the two launches)."""
        mine = {launch.column: launch for launch in self.main(variant)}
        base = {launch.column: launch for launch in self.main(baseline)}
        shared = [column for column in base if column in mine]
        if not shared:
            raise WorkbenchError(
                f"{variant!r} and {baseline!r} share no main launch (same role and token "
                f"count): {variant} has {', '.join(mine) or 'none'}; {baseline} has "
                f"{', '.join(base) or 'none'}."
            )
        out = {}
        for column in shared:
            a, b = base[column], mine[column]
            ours = b.report.select(f"^{re.escape(b.label)}$")
            theirs = a.report.select(f"^{re.escape(a.label)}$")
            change = ours.diff(theirs)[b.label]
            numeric = pd.to_numeric
            out[(column, baseline)] = numeric(a.report.summary()[a.label], errors="coerce")
            out[(column, variant)] = numeric(b.report.summary()[b.label], errors="coerce")
            out[(column, "change_pct")] = change["change_pct"]
        order = [row for row in a.report.summary().index if row in change.index]
        return pd.DataFrame(out).reindex(order).dropna(how="all")
