"""Profile results: per-kernel rows in, category tables out.

A result loaded from artifacts is the same type as one just captured. Importing this module
imports neither torch, triton nor plotly: figures and pages are drawn by `workbench.report`
and reached through the views in `workbench.views`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from workbench.analysis import tables
from workbench.analysis.rules import DEFAULT_RULES, Rule
from workbench.analysis.skew import skew_table
from workbench.analysis.trace import (
    device_of,
    kernel_table,
    read_chrome_trace,
    trace_notes,
    with_schema,
)
from workbench.artifacts import read_meta, read_table
from workbench.errors import ArtifactError

PHASES = ("prefill", "decode")
SEED_VARIANTS = ("stock", "multirow", "flat")  # the seed study's profile columns, in order


def profile_tables(kernels: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The result tables written beside the kernel table (the kernel table is the source)."""
    present = set(kernels["phase"].unique())
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
            self.label = run_label(self.meta)

    # ---- tables ---------------------------------------------------------------------------
    @property
    def phases(self) -> list[str]:
        present = set(self.kernels["phase"].unique())
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
        """Kernel counts by category, by what kind of rule decided it (range, module, op, kernel
        name, default) and by the rule itself."""
        return tables.attribution_table(self.kernels)

    def _phase(self, phase: str) -> str:
        if phase not in set(self.kernels["phase"].unique()):
            raise ArtifactError(
                f"{self.label} has no '{phase}' kernels; its phases are: {', '.join(self.phases)}"
            )
        return phase

    def compare(self, *others: ProfileResult, labels: Sequence[str] | None = None) -> Comparison:
        """The prefill and decode tables of this run and `others` side by side."""
        return Comparison([self, *others], labels)

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

    def panels(self) -> dict[str, pd.DataFrame]:
        """Category time per figure panel (prefill total, mean decode step), a column per run."""
        panels: dict[str, dict[str, pd.Series]] = {}
        for name, run in zip(self.names, self.runs):
            for phase in run.phases:
                if phase == "decode":
                    panels.setdefault("Decode, mean step", {})[name] = run.decode()["mean_ms"]
                else:
                    panels.setdefault(phase.capitalize(), {})[name] = run.by_phase(phase)["time_ms"]
        return {title: pd.DataFrame(cols).fillna(0.0) for title, cols in panels.items()}


def device_name(meta: Mapping) -> str:
    """The machine a run's times were taken on, short: `H200`, or `CPU` for the torch
    references a CPU run times (never to be read as GPU kernel time)."""
    if meta.get("device") != "cuda":
        return "CPU"
    name = str(meta.get("environment", {}).get("gpu", {}).get("name") or "GPU")
    return name.removeprefix("NVIDIA ").strip()


def run_label(meta: Mapping) -> str:
    """A profile's label that tells runs apart: `H200 dsv4-flash-tp2 TP2: stock / bf16 /
    triton / graphs`; an external trace is labelled by its file name."""
    p = meta.get("params", {})
    if "moe" not in p:
        return Path(meta.get("source", "trace")).name
    where = " ".join(
        part
        for part in (device_name(meta), p.get("preset"), f"TP{p['tp']}" if p.get("tp") else "")
        if part  # fmt: skip
    )
    kernels = [p["moe"], p.get("dense", "?"), p.get("attention", "?")]
    return f"{where}: {' / '.join(kernels)} / {'graphs' if p.get('cuda_graphs') else 'eager'}"


def profile_label(run: ProfileResult, with_prompt: bool = False) -> str:
    """What sets a profile apart in the seed study's columns: `flat MoE, CUDA graphs, TP2`,
    with the machine when it is not a GPU (a CPU run's times are not kernel times)."""
    p = run.meta.get("params", {})
    parts = [f"{p.get('moe', '?')} MoE", "CUDA graphs" if p.get("cuda_graphs") else "eager"]
    if p.get("tp"):
        parts.append(f"TP{p['tp']}")
    if with_prompt:
        parts.append(f"{p.get('prompt_tokens')} tokens")
    if device_name(run.meta) == "CPU":
        parts.append(f"CPU, {p.get('preset')}")
    return ", ".join(parts)


def seed_order(runs: Iterable[ProfileResult]) -> list[ProfileResult]:
    """Profiles in the seed's column order: one process before tensor parallelism, then stock,
    multi-row, flat (other kernels after), CUDA graphs before eager."""

    def key(run: ProfileResult) -> tuple:
        p = run.meta.get("params", {})
        moe = p.get("moe")
        rank = SEED_VARIANTS.index(moe) if moe in SEED_VARIANTS else len(SEED_VARIANTS)
        return (p.get("tp") or 1, rank, str(moe), not p.get("cuda_graphs"))

    return sorted(runs, key=key)


def load(path: str | Path) -> ProfileResult:
    """A result from its run directory under `raw/`, without a GPU and without torch."""
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise ArtifactError(f"load() needs the path of a run directory under raw/; got {path!r}.")
    if Path(path).is_file() and str(path).endswith((".json", ".json.gz")):
        raise ArtifactError(f"{path} is a trace file, not a run directory; use load_trace().")
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
    rules = (rules,) if isinstance(rules, Rule) else tuple(rules or ())
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
            "External trace: categories come from scopes, modules, launching ops and kernel "
            "names (see 'How categories were decided').",
            *trace_notes(trace, kernels, path),
        ],
    }
    return ProfileResult(meta=dict(meta), kernels=kernels, path=Path(path), label=label)
