"""Profile results: per-kernel rows in, category tables out.

A result loaded from artifacts is the same type as one just captured. Importing this module
imports neither torch, triton nor plotly: figures and pages are drawn by `workbench.report`
and reached through the views in `workbench.views`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis import tables
from workbench.analysis.cards import card
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


# run.json's key for what a run's stored tables answer (see `ProfileResult` and
# `profile_store`): phases, ranks, the table each method reads and the decode caption's facts.
SUMMARY = "summary"


class ProfileResult:
    """Per-kernel rows of one profile (own run or external trace) and its metadata.

    A run loaded from its directory reads its kernel table (~10^6 rows, seconds to parse) only
    when a method needs kernels: top_kernels, attribution, timelines. The tables by category,
    the decode caption, phases, ranks and the rank skew come from the tables and facts written
    beside it at capture (run.json's `summary`, see `profile_store`), which hold the same
    numbers. A result given its kernels, or whose kernels are replaced, computes everything
    from them; so does a run written before the summary existed.
    """

    def __init__(
        self,
        meta: dict,
        kernels: pd.DataFrame | None = None,
        path: Path | None = None,
        label: str = "",
    ) -> None:
        if kernels is None and path is None:
            raise ArtifactError("a profile needs its kernel table or the run directory holding it")
        self.meta = meta
        self.path = path
        self.label = label or run_label(meta)
        self._kernels = kernels  # None until a method needs the rows (read from `path`)
        # The stored answers describe the kernel table on disk: not a table given or replaced.
        self._summary = meta.get(SUMMARY) if kernels is None else None
        self._answers: dict[tuple, pd.DataFrame] = {}  # tables made so far (small)

    def __repr__(self) -> str:
        rows = "not read" if self._kernels is None else f"{len(self._kernels)} rows"
        return f"{type(self).__name__}({self.label!r}, path={self.path!r}, kernels: {rows})"

    @property
    def kernels(self) -> pd.DataFrame:
        """One row per kernel (see `trace.KERNEL_DTYPES`), read from the run on first use."""
        if self._kernels is None:
            self._kernels = with_schema(read_table(self.path, self.meta, "kernels"))
        return self._kernels

    @kernels.setter
    def kernels(self, table: pd.DataFrame) -> None:
        # Answers now follow the new rows.
        self._kernels, self._summary, self._answers = table, None, {}

    def _answer(
        self, answer: str, rank: int | None, compute: Callable[[], pd.DataFrame]
    ) -> pd.DataFrame:
        """`answer`'s table (prefill, decode, rank_skew, a phase) for `rank` or over all ranks:
        the stored table that is exactly it, else `compute()` from the kernels; made once, and
        a copy returned each time, so that a caller's changes stay its own."""
        key = (answer, rank)
        if key not in self._answers:
            name = (self._summary or {}).get("tables", {}).get(answer) if rank is None else None
            if name is None:
                self._answers[key] = compute()
            else:
                stored = read_table(self.path, self.meta, name)
                self._answers[key] = stored_frame(stored, answer, self._summary)
        table = self._answers[key]
        copy = table.copy()
        copy.attrs = dict(table.attrs)
        return copy

    # ---- tables ---------------------------------------------------------------------------
    @property
    def phases(self) -> list[str]:
        if self._summary is not None:
            return list(self._summary["phases"])
        present = set(self.kernels["phase"].unique())
        return [p for p in PHASES if p in present] or sorted(present)

    @property
    def ranks(self) -> list[int]:
        """The tensor-parallel ranks in the table (empty for a single process)."""
        if self._summary is not None:
            return [int(r) for r in self._summary["ranks"]]
        return sorted(int(r) for r in self.kernels["rank"].dropna().unique())

    def _by_rank(self, table_of, rank: int | None) -> pd.DataFrame:
        """A table for one rank, or, over several ranks, the mean of their tables."""
        if not self.ranks:
            return table_of(self.kernels)
        if rank is not None:
            if rank not in self.ranks:
                raise ArtifactError(f"no rank {rank}; this run has ranks {self.ranks}")
            return table_of(self.kernels[self.kernels["rank"] == rank])
        return tables.mean_over_ranks(self.kernels, table_of)

    def prefill(self, rank: int | None = None) -> pd.DataFrame:
        """Prefill kernel time by category (time_ms, share_pct, kernels) and the total.

        In a tensor-parallel run: one rank's, or the mean over the ranks (one GPU's view).
        """
        phase = self._phase("prefill")
        return self._answer(
            phase, rank, lambda: self._by_rank(lambda k: tables.phase_table(k, phase), rank)
        )

    def decode(self, rank: int | None = None) -> pd.DataFrame:
        """Decode kernel time per step by category (mean, std, min, max over steps), and the
        gaps between kernels; per rank or the mean over ranks as for `prefill`."""
        phase = self._phase("decode")
        return self._answer(
            phase, rank, lambda: self._by_rank(lambda k: tables.per_step_table(k, phase), rank)
        )

    def rank_skew(self) -> pd.DataFrame:
        """Per rank and phase: time in collectives, split into waiting for the last rank to
        arrive and the transfer itself (see `analysis.skew`)."""
        if not self.ranks:
            raise ArtifactError(f"{self.label} ran on one process: there is no rank skew.")
        return self._answer("rank_skew", None, lambda: skew_table(self.kernels))

    def caption_facts(self) -> dict[str, float]:
        """What the decode caption counts: decode steps, decode kernels, how many of them were
        replayed from CUDA graphs, and the median wait before a step's graph started
        (`tables.graph_start_wait_us`; runs stored before it lack it)."""
        if self._summary is not None and "caption" in self._summary:
            return dict(self._summary["caption"])
        decode = self.kernels[self.kernels["phase"] == "decode"]
        waits = [tables.graph_start_wait_us(step) for _, step in decode.groupby("step")]
        return {"steps": int(decode["step"].nunique()), "kernels": len(decode),
                "replayed": int(decode["graph"].sum()),
                "graph_wait_us": float(np.median(waits)) if waits else 0.0}  # fmt: skip

    def decode_caption(self) -> str:
        """How the decode steps ran: steps, CUDA graphs or eager, and how graph kernels were
        attributed (by position in the eager signature, or by name alone)."""
        facts = self.caption_facts()
        matching = self.meta.get("graph_matching")
        if matching:
            ranks = matching.values() if "graph_kernels" not in matching else [matching]
            matched = sum(m["matched_by_position"] for m in ranks)  # tensor-parallel: per rank
            total = sum(m["graph_kernels"] for m in ranks)
            how = f"CUDA graphs; {matched} of {total} replayed kernels attributed by position"
        elif facts["replayed"]:
            replayed, kernels = facts["replayed"], facts["kernels"]
            how = f"{replayed} of {kernels} kernels replayed from CUDA graphs, by name"
        else:
            how = "eager launches"
        wait = facts.get("graph_wait_us", 0.0)
        if wait:  # host time, not kernel time: most of the gaps when steps wait to launch
            said = f"{wait / 1e3:.2f} ms" if wait >= 100 else f"{wait:.0f} us"
            how += (f"; of the gaps, a median {said} a step is the wait for the graph's first "
                    "kernel after the step's input copies")  # fmt: skip
        return f"{facts['steps']} steps, {how}"

    def by_phase(self, phase: str, rank: int | None = None) -> pd.DataFrame:
        if phase == "prefill":
            return self.prefill(rank)
        phase = self._phase(phase)
        return self._answer(
            f"{phase} by category",
            rank,
            lambda: self._by_rank(lambda k: tables.phase_table(k, phase), rank),
        )

    def top_kernels(self, n: int = 15, phase: str | None = None) -> pd.DataFrame:
        return tables.top_kernels(self.kernels, phase, n)

    def attribution(self) -> pd.DataFrame:
        """Kernel counts by category, by what kind of rule decided it (range, module, op, kernel
        name, default) and by the rule itself."""
        return tables.attribution_table(self.kernels)

    def _phase(self, phase: str) -> str:
        if phase in self.phases:  # the stored summary knows these without the kernels
            return phase
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


def stored_frame(table: pd.DataFrame, answer: str, summary: Mapping | None = None) -> pd.DataFrame:
    """A stored table as its method returns it: indexed as computed, the phase in the kernel
    table's `string` dtype, the decode table with the step count of `summary` (CSV keeps
    neither)."""
    if answer == "rank_skew":
        return table.astype({"phase": "string"}).set_index(["rank", "phase"])
    table = table.set_index("category")
    if answer == "decode" and summary is not None:
        table.attrs["steps"] = int(summary["decode_steps"])
    return table


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

    def card_note(self) -> str:
        """A caution when the runs ran on more than one recorded card: two H200s can differ
        in a kernel's time by more than a change under test, so a change's effect is read
        from runs on one card, or from an A/B (`workbench ab`), which runs both sides in turns.
        Empty when they share a card or the runs do not say."""
        cards = {name: card(run.meta) for name, run in zip(self.names, self.runs)}
        seen = {c for c in cards.values() if c}
        if len(seen) < 2:
            return ""
        named = ", ".join(f"{name} on {c}" for name, c in cards.items() if c)
        return (
            f"These runs ran on {len(seen)} cards ({named}): between H200s a kernel's time can "
            "move by more than the change being compared; read a change's effect from runs on "
            "one card or from an A/B (`workbench ab`), which times both sides in turns."
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
    triton / graphs` (`stock fp8 / ...` when the experts are not bf16); an external trace is
    labelled by its file name."""
    p = meta.get("params", {})
    if "moe" not in p:
        return Path(meta.get("source", "trace")).name
    where = " ".join(
        part
        for part in (device_name(meta), p.get("preset"), f"TP{p['tp']}" if p.get("tp") else "")
        if part  # fmt: skip
    )
    moe = p["moe"] + (f" {p['moe_format']}" if p.get("moe_format", "bf16") != "bf16" else "")
    kernels = [moe, p.get("dense", "?"), p.get("attention", "?")]
    return f"{where}: {' / '.join(kernels)} / {'graphs' if p.get('cuda_graphs') else 'eager'}"


def profile_label(run: ProfileResult, with_prompt: bool = False) -> str:
    """What sets a profile apart in the seed study's columns: `flat MoE, CUDA graphs, TP2`,
    the experts' format, dense and attention backends when they are not the defaults (`stock
    MoE (fp8 experts)`, `humming dense, triton attention`), and the machine when it is not a
    GPU (a CPU run's times are not kernel times)."""
    p = run.meta.get("params", {})
    experts = p.get("moe_format", "bf16")
    parts = [f"{p.get('moe', '?')} MoE" + (f" ({experts} experts)" if experts != "bf16" else "")]
    pdl = " with PDL" if p.get("dense_pdl", False) is not False else ""  # kernels.pdl
    parts += [f"{p['dense']} dense{pdl}"] if p.get("dense", "bf16") != "bf16" else []
    parts += [f"{p['attention']} attention"] if p.get("attention", "torch") != "torch" else []
    parts.append("CUDA graphs" if p.get("cuda_graphs") else "eager")
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
    """A result from its run directory under `raw/`, without a GPU and without torch; its
    kernel table is read when a method first needs it."""
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise ArtifactError(f"load() needs the path of a run directory under raw/; got {path!r}.")
    if Path(path).is_file() and str(path).endswith((".json", ".json.gz")):
        raise ArtifactError(f"{path} is a trace file, not a run directory; use load_trace().")
    meta = read_meta(path)
    kind = meta.get("kind")
    if kind != "profile":
        raise ArtifactError(f"{path} holds a '{kind}' run, which load() does not read yet.")
    listed = meta.get("tables", {}).get("kernels")
    if listed is None or not (Path(path) / listed).is_file():
        read_table(path, meta, "kernels")  # raises, saying what the run holds instead
    return ProfileResult(meta=meta, path=Path(path))  # kernels read when first needed


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
