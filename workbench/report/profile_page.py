"""Figures and self-contained pages of profiles and of profiles compared.

Functions that take analysis results and draw them, so that `workbench.analysis` never needs
plotly; `workbench.views` gives the results `.figure()` and `.to_html()` through these.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from workbench.analysis import tables
from workbench.analysis.phases import bytecode_hint, compiles_line, phases_table
from workbench.analysis.profile import Comparison, ProfileResult
from workbench.report.figures import category_bars, step_timeline
from workbench.report.html import HtmlPage


def comparison_figure(comparison: Comparison):
    """Stacked category bars: a prefill panel and a mean-decode-step panel, a bar per run."""
    return category_bars(comparison.panels(), "Kernel time by category")


def profile_figure(result: ProfileResult):
    """Stacked bar of category time: prefill total and mean decode step."""
    return comparison_figure(Comparison([result]))


def write_profile_page(result: ProfileResult, path: str | Path) -> Path:
    """A self-contained page: notes, tables, figures, top kernels and the metadata."""
    page = HtmlPage(f"Kernel time by category: {result.label}")
    for note in result.meta.get("notes", []):
        page.text(note, css="note")
    page.heading("Kernel time by category").figure(profile_figure(result))
    for phase in result.phases:
        if phase == "decode":
            page.heading("Decode, per step").table(
                result.decode(), f"{result.decode_caption()}; milliseconds per step", digits=3
            )
        else:
            page.heading(phase.capitalize()).table(result.by_phase(phase), "milliseconds")
    top = result.top_kernels()
    top.index = top.index.map(tables.short_kernel_name)
    page.heading("Top kernels").table(top, "names shortened: templates folded", digits=1)
    if "decode" in result.phases:
        kernels = result.kernels
        step = int(kernels.loc[kernels["phase"] == "decode", "step"].max())
        rows = kernels[(kernels["phase"] == "decode") & (kernels["step"] == step)]
        page.heading("Timeline of one decode step").figure(
            step_timeline(rows, f"Decode step {step}: kernels by layer")
        )
    if result.ranks:
        page.heading("Rank skew at collectives").table(
            result.rank_skew(), "waiting: for the last rank to arrive; transfer: the rest", 3
        )
    page.heading("How categories were decided").table(result.attribution())
    _own_time(page, result.meta)
    page.heading("Metadata").metadata(result.meta)
    return page.write(path)


def _own_time(page: HtmlPage, meta: dict) -> None:
    """The profile's own wall time by phase, and what Triton compiled (run.json's `phases`
    and `compiles`), when the run recorded them."""
    phases = phases_table(meta)
    if phases is None:
        return
    compiles = meta.get("compiles") or {}
    caption = f"wall {meta['wall_s']:.1f} s" if meta.get("wall_s") else "seconds"
    if compiles.get("compiled") or compiles.get("loaded") or compiles.get("precompile"):
        caption += f"; {compiles_line(compiles)}"
    hint = bytecode_hint(meta)
    if hint:
        caption += f". {hint}"
    page.heading("Where the profile's own time went").table(phases, caption, digits=1)
    by_kernel = compiles.get("by_kernel")
    if by_kernel:
        table = pd.DataFrame(by_kernel).set_index("kernel").rename(columns={"s": "seconds"})
        page.table(table.head(12), "Triton compiles in this process, slowest first", digits=2)


def write_comparison_page(comparison: Comparison, path: str | Path) -> Path:
    """Profiles side by side: the category figure, both tables and each run's metadata."""
    page = HtmlPage("Profiles compared")
    if note := comparison.card_note():
        page.text(note)
    page.heading("Kernel time by category").figure(comparison_figure(comparison))
    page.heading("Prefill").table(comparison.prefill(), "milliseconds of kernel time")
    page.heading("Decode, per step").table(comparison.decode(), "mean milliseconds per step", 3)
    for name, run in zip(comparison.names, comparison.runs):
        page.heading(f"Metadata: {name}").metadata(run.meta)
    return page.write(path)
