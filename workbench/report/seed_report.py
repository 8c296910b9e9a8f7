"""`workbench report --html`: the seed report's tables rebuilt from artifacts, on one offline page.

The seed study (`docs/seed-study.md` says what it measured) is the report kernel engineers
write by hand today; each of its sections is fed here by a kind of artifact: profile runs
give the per-category prefill and decode tables, ncu reports the "Nsight Compute on the stock
kernel" table, sweeps "Things that did not help", the dense benchmark and A/B runs the
controlled A/B, benchmark runs the kernel tables. A section whose artifacts are absent says so
and names the command that makes them: the page never fills a gap with a number that was not
measured.

The tables are the Markdown document's (`document` and the section writers, through
`page.ReportPage`); this page adds what a page can: the figures the writers ask for by name
(`FIGURES`), detail tables folded away, long tables folded after their first rows, and each
artifact's full metadata. Written by the one HtmlPage writer (plotly.js inlined once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.collection import Collection, collect
from workbench.report.cells import SHOWN_ROWS
from workbench.report.document import write_document
from workbench.report.experiment_figures import bench_lines, floor_lines, sweep_figure
from workbench.report.html import HtmlPage, inline
from workbench.report.ncu_page import catalog_figure, ncu_figure
from workbench.report.profile_page import comparison_figure
from workbench.report.seed_tables import (
    ABSENT,
    SECTIONS,
    coverage,
    default_paths,
    dense_ab_table,
    did_not_help,
    hybrid_ab_table,
)

__all__ = ["SECTIONS", "build", "coverage", "dense_ab_table", "did_not_help", "hybrid_ab_table",
           "write_report"]  # fmt: skip

FIGURES: dict[str, Callable[..., go.Figure]] = {  # what the section writers ask for by name
    "profiles": comparison_figure,
    "ncu": catalog_figure,
    "ncu-step": lambda step: ncu_figure(step, "kernel_time"),
    "sweep": lambda sweep, name: sweep_figure(sweep).update_layout(title=name),
    "bench": bench_lines,
    "floor": floor_lines,
}


class HtmlReport:
    """The report's page (`page.ReportPage`) over an HtmlPage."""

    def __init__(self, page: HtmlPage):
        self.page = page

    def heading(self, text: str, level: int = 2) -> HtmlReport:
        self.page.heading(text, level)
        return self

    def text(self, text: str) -> HtmlReport:
        self.page.parts.append(f"<p>{inline(text)}</p>")
        return self

    def note(self, text: str) -> HtmlReport:
        self.page.parts.append(f'<p class="note">{inline(text)}</p>')
        return self

    def bullets(self, lines: Sequence[str]) -> HtmlReport:
        self.page.parts.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in lines) + "</ul>")
        return self

    def absent(self, what: str, command: str) -> HtmlReport:
        return self.note(ABSENT.format(what=what, command=command))

    def table(
        self,
        frame: pd.DataFrame,
        caption: str = "",
        source: str = "",
        *,
        index: bool | None = None,
        by_row: bool = False,
        unit: str = "",
        head: int = SHOWN_ROWS,
        extra: bool = False,
    ) -> HtmlReport:
        """A table that fits the page, its rows after `head` folded; an `extra` table folds
        away whole, under its caption."""
        if extra:
            with self.page.details(caption):
                self.page.data_table(frame, "", source, index=index, by_row=by_row, unit=unit,
                                     head=head)  # fmt: skip
            return self
        self.page.data_table(frame, caption, source, index=index, by_row=by_row, unit=unit,
                             head=head)  # fmt: skip
        return self

    def figure(self, name: str, *args: object) -> HtmlReport:
        self.page.figure(FIGURES[name](*args))
        return self


def build(collection: Collection, include_cpu: bool = False) -> HtmlPage:
    """The page: coverage, a section per seed table (or why it is absent), the CPU runs (a
    note, or their own section when `include_cpu`), then what each artifact ran on and its full
    metadata."""
    page = HtmlPage("The seed report, rebuilt from artifacts")
    page.text(
        "Every table below is computed from the artifacts listed under Artifacts (GPU, versions, "
        "date and commit of each); a section without artifacts says so and names the command "
        "that makes them."
    )
    write_document(HtmlReport(page), collection, include_cpu)
    for item in collection.items:
        page.metadata(item.meta, f"{item.kind}: {item.path}")
    return page


def write_report(
    paths: Iterable[str | Path] = (), html: str | Path = "report.html", include_cpu: bool = False
) -> Path:
    """Collect the artifacts at `paths` (none given: those of raw and ncu that are here) and
    write the page to `html`."""
    return build(collect(list(paths) or default_paths()[0]), include_cpu).write(html)
