"""Result objects: DataFrames in, tables, plotly figures and HTML out.

A result loaded from artifacts is the same type as one just captured. Importing this module
imports neither torch nor triton; plotly is imported only when a figure or page is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from workbench.analysis import tables
from workbench.analysis.rules import DEFAULT_RULES, Rule
from workbench.analysis.skew import skew_table
from workbench.analysis.trace import device_of, kernel_table, read_chrome_trace, with_schema
from workbench.artifacts import read_meta, read_table
from workbench.errors import ArtifactError

PHASES = ("prefill", "decode")


def profile_tables(kernels: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The result tables written beside the kernel table (the kernel table is the source)."""
    present = set(kernels["phase"])
    out = {}
    if "prefill" in present:
        out["prefill"] = tables.phase_table(kernels, "prefill")
    if "decode" in present:
        out["decode"] = tables.per_step_table(kernels, "decode")
    if not out:
        out["all"] = tables.phase_table(kernels, "all")
    return out


@dataclass
class ProfileResult:
    """Per-kernel rows of one profile (own run or external trace) and its metadata."""

    meta: dict
    kernels: pd.DataFrame
    path: Path | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            params = self.meta.get("params", {})
            self.label = (
                f"{params['moe']} / {params['dense']}"
                + (" / graphs" if params.get("cuda_graphs") else "")
                if "moe" in params
                else Path(self.meta.get("source", "trace")).name
            )

    # ---- tables ---------------------------------------------------------------------------
    @property
    def phases(self) -> list[str]:
        present = set(self.kernels["phase"])
        return [p for p in PHASES if p in present] or sorted(present)

    @property
    def ranks(self) -> list[int]:
        """The tensor-parallel ranks in the table (empty for a single process)."""
        return sorted(int(r) for r in self.kernels["rank"].dropna().unique())

    def _by_rank(self, table_of, rank: int | None) -> pd.DataFrame:
        """A table for one rank, or, over several ranks, the mean of their tables."""
        if not self.ranks:
            return table_of(self.kernels)
        if rank is not None:
            if rank not in self.ranks:
                raise ArtifactError(f"no rank {rank}; this run has ranks {self.ranks}")
            return table_of(self.kernels[self.kernels["rank"] == rank])
        per_rank = [table_of(self.kernels[self.kernels["rank"] == r]) for r in self.ranks]
        mean = sum(per_rank[1:], per_rank[0]) / len(per_rank)
        mean.attrs = per_rank[0].attrs
        return mean

    def prefill(self, rank: int | None = None) -> pd.DataFrame:
        """Prefill kernel time by category (time_ms, share_pct, kernels) and the total.

        In a tensor-parallel run: one rank's, or the mean over the ranks (one GPU's view).
        """
        phase = self._phase("prefill")
        return self._by_rank(lambda k: tables.phase_table(k, phase), rank)

    def decode(self, rank: int | None = None) -> pd.DataFrame:
        """Decode kernel time per step by category (mean, std, min, max over steps), and the
        gaps between kernels; per rank or the mean over ranks as for `prefill`."""
        phase = self._phase("decode")
        return self._by_rank(lambda k: tables.per_step_table(k, phase), rank)

    def rank_skew(self) -> pd.DataFrame:
        """Per rank and phase: time in collectives, split into waiting for the last rank to
        arrive and the transfer itself (see `analysis.skew`)."""
        if not self.ranks:
            raise ArtifactError(f"{self.label} ran on one process: there is no rank skew.")
        return skew_table(self.kernels)

    def decode_caption(self) -> str:
        """How the decode steps ran: steps, CUDA graphs or eager, and how graph kernels were
        attributed (by position in the eager signature, or by name alone)."""
        steps = self.kernels.loc[self.kernels["phase"] == "decode", "step"].nunique()
        decode = self.kernels[self.kernels["phase"] == "decode"]
        replayed = int(decode["graph"].sum())
        matching = self.meta.get("graph_matching")
        if matching:
            ranks = matching.values() if "graph_kernels" not in matching else [matching]
            matched = sum(m["matched_by_position"] for m in ranks)  # tensor-parallel: per rank
            total = sum(m["graph_kernels"] for m in ranks)
            how = f"CUDA graphs; {matched} of {total} replayed kernels attributed by position"
        elif replayed:
            how = f"{replayed} of {len(decode)} kernels replayed from CUDA graphs, by name"
        else:
            how = "eager launches"
        return f"{steps} steps, {how}"

    def by_phase(self, phase: str, rank: int | None = None) -> pd.DataFrame:
        phase = self._phase(phase)
        return self._by_rank(lambda k: tables.phase_table(k, phase), rank)

    def top_kernels(self, n: int = 15, phase: str | None = None) -> pd.DataFrame:
        return tables.top_kernels(self.kernels, phase, n)

    def attribution(self) -> pd.DataFrame:
        """Kernel counts by category and by what decided it (range, op, kernel name, default)."""
        return tables.attribution_table(self.kernels)

    def _phase(self, phase: str) -> str:
        if phase not in set(self.kernels["phase"]):
            raise ArtifactError(
                f"{self.label} has no '{phase}' kernels; its phases are: {', '.join(self.phases)}"
            )
        return phase

    def compare(self, *others: ProfileResult, labels: Sequence[str] | None = None) -> Comparison:
        """The prefill and decode tables of this run and `others` side by side."""
        return Comparison([self, *others], labels)

    # ---- figures and pages --------------------------------------------------------------
    def figure(self):
        """Stacked bar of category time: prefill total and mean decode step."""
        return Comparison([self]).figure()

    def text(self) -> str:
        """The notes and the tables, for a terminal."""
        lines = [*self.meta.get("notes", [])]
        for phase in self.phases:
            table = self.decode() if phase == "decode" else self.by_phase(phase)
            title = "Decode, per step" if phase == "decode" else f"{phase.capitalize()}"
            if phase == "decode":
                title += f" ({self.decode_caption()})"
            lines += ["", title, table.round(3).to_string()]
        if self.ranks:
            lines += ["", "Rank skew at collectives (ms)", self.rank_skew().round(3).to_string()]
        return "\n".join(lines)

    def to_html(self, path: str | Path) -> Path:
        """A self-contained page: notes, tables, figures, top kernels and the metadata."""
        from workbench.report.figures import step_timeline
        from workbench.report.html import HtmlPage

        page = HtmlPage(f"Kernel time by category: {self.label}")
        for note in self.meta.get("notes", []):
            page.text(note, css="note")
        page.heading("Kernel time by category").figure(self.figure())
        for phase in self.phases:
            if phase == "decode":
                table = self.decode()
                page.heading("Decode, per step").table(
                    table, f"{self.decode_caption()}; milliseconds per step", digits=3
                )
            else:
                page.heading(phase.capitalize()).table(self.by_phase(phase), "milliseconds")
        top = self.top_kernels()
        top.index = top.index.map(tables.short_kernel_name)
        page.heading("Top kernels").table(top, "names shortened: templates folded", digits=1)
        if "decode" in self.phases:
            step = int(self.kernels.loc[self.kernels["phase"] == "decode", "step"].max())
            rows = self.kernels[
                (self.kernels["phase"] == "decode") & (self.kernels["step"] == step)
            ]
            page.heading("Timeline of one decode step").figure(
                step_timeline(rows, f"Decode step {step}: kernels by layer")
            )
        if self.ranks:
            page.heading("Rank skew at collectives").table(
                self.rank_skew(), "waiting: for the last rank to arrive; transfer: the rest", 3
            )
        page.heading("How categories were decided").table(self.attribution())
        page.heading("Metadata").metadata(self.meta)
        return page.write(path)


@dataclass
class Comparison:
    """Several profiles side by side, like the seed's "stock / + multi-row / + flat" columns."""

    runs: list[ProfileResult]
    labels: Sequence[str] | None = None
    names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = list(self.labels or [r.label for r in self.runs])
        if len(set(self.names)) < len(self.names):
            self.names = [f"{i + 1}: {n}" for i, n in enumerate(self.names)]

    def prefill(self) -> pd.DataFrame:
        return tables.side_by_side(
            {n: r.prefill() for n, r in zip(self.names, self.runs)}, "time_ms"
        )

    def decode(self) -> pd.DataFrame:
        return tables.side_by_side(
            {n: r.decode() for n, r in zip(self.names, self.runs)}, "mean_ms"
        )

    def figure(self):
        """Stacked category bars: a prefill panel and a mean-decode-step panel, a bar per run."""
        from workbench.report.figures import category_bars

        panels: dict[str, dict[str, pd.Series]] = {}
        for name, run in zip(self.names, self.runs):
            for phase in run.phases:
                if phase == "decode":
                    panels.setdefault("Decode, mean step", {})[name] = run.decode()["mean_ms"]
                else:
                    panels.setdefault(phase.capitalize(), {})[name] = run.by_phase(phase)["time_ms"]
        frames = {title: pd.DataFrame(cols).fillna(0.0) for title, cols in panels.items()}
        return category_bars(frames, "Kernel time by category")

    def to_html(self, path: str | Path) -> Path:
        from workbench.report.html import HtmlPage

        page = HtmlPage("Profiles compared")
        page.heading("Kernel time by category").figure(self.figure())
        page.heading("Prefill").table(self.prefill(), "milliseconds of kernel time")
        page.heading("Decode, per step").table(self.decode(), "mean milliseconds per step", 3)
        for name, run in zip(self.names, self.runs):
            page.heading(f"Metadata: {name}").metadata(run.meta)
        return page.write(path)


def load(path: str | Path) -> ProfileResult:
    """A result from its run directory under `raw/`, without a GPU and without torch."""
    meta = read_meta(path)
    kind = meta.get("kind")
    if kind != "profile":
        raise ArtifactError(f"{path} holds a '{kind}' run, which load() does not read yet.")
    kernels = with_schema(read_table(path, meta, "kernels"))
    return ProfileResult(meta=meta, kernels=kernels, path=Path(path))


def load_trace(path: str | Path, rules: Sequence[Rule] = (), label: str = "") -> ProfileResult:
    """An external torch.profiler Chrome trace (vLLM, SGLang, HF...) as a ProfileResult.

    `rules` go ahead of the default rules, so a user can claim kernels for a category.
    """
    trace = read_chrome_trace(path)
    kernels = kernel_table(trace, (*rules, *DEFAULT_RULES))
    device = device_of(kernels)
    meta: Mapping = {
        "kind": "trace",
        "source": str(path),
        "device": device,
        "trace": {
            k: trace.meta[k] for k in ("deviceProperties", "schemaVersion") if k in trace.meta
        },
        "notes": [
            "External trace: categories come from the launching op and kernel names "
            "(see 'How categories were decided')."
        ],
    }
    return ProfileResult(meta=dict(meta), kernels=kernels, path=Path(path), label=label)
