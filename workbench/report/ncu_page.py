"""Nsight Compute reports drawn: a report's figures and its self-contained HTML page, and the
figures of a capture set (NcuCatalog).

The analysis classes only build tables; this module picks the table each figure needs, titles
it, and lays tables and figures out on a page, so the analysis never imports plotly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.ncu import NcuReport
from workbench.analysis.ncu_catalog import NcuCatalog
from workbench.analysis.ncu_rules import SHOWN_RULES, rule_name, rules_overview
from workbench.analysis.ncu_text import diff_tables, fit
from workbench.errors import WorkbenchError
from workbench.report import ncu_figures
from workbench.report.html import HtmlPage

FIGURE_KINDS = ("kernel_time", "summary", "stalls", "hotspots", "occupancy")
CATALOG_FIGURE_KINDS = ("seed", "stalls", "occupancy", "hotspots")
STALL_MEASURES = {
    "cycles_per_issue": "cycles per issued instruction",
    "share_pct": "% of PC samples",
}


def _blank(frame: pd.DataFrame) -> pd.DataFrame:
    """Missing values as empty cells, not "nan", on a page."""
    return frame.astype(object).where(frame.notna(), "")


def _unknown(kind: str, known: tuple[str, ...]) -> WorkbenchError:
    return WorkbenchError(f"unknown figure kind '{kind}'; known: {', '.join(known)}")


def ncu_figure(report: NcuReport, kind: str = "summary") -> go.Figure:
    """A figure of one report: "kernel_time", "summary", "stalls", "hotspots" or "occupancy".

    A report of many launches charts its longest ones (NcuReport.main_launches) only.
    """
    if kind not in FIGURE_KINDS:
        raise _unknown(kind, FIGURE_KINDS)
    title = report.title
    if kind == "kernel_time":
        kernel_time = report.kernel_time()
        return ncu_figures.kernel_time_bars(kernel_time, f"Profiled time by kernel: {title}")
    main = report.main_launches()
    some = f" ({len(main)} longest launches)" if len(main) < len(report) else ""
    if kind == "summary":
        return ncu_figures.summary_bars(report.summary()[main], f"ncu summary: {title}{some}")
    if kind == "stalls":
        stalls = report.stalls()
        stalls = stalls[main] if not stalls.empty else stalls
        return ncu_figures.stall_bars(stalls, f"Warp stalls: {title}{some}")
    if kind == "hotspots":
        return ncu_figures.hotspot_bars(report.main_hotspots(), f"Hot spots: {title}")
    return ncu_figures.occupancy_bars(report.occupancy(), f"Occupancy: {title}")


def _per_launch(
    page: HtmlPage,
    frame: pd.DataFrame,
    main: list[str],
    caption: str = "",
    digits: int = 2,
    css: str = "",
) -> None:
    """A table with a row per launch: every row while there are few launches; otherwise the
    main launches' rows, and every row folded away below them (a decode step has 134)."""
    frame = _blank(frame)
    shown = frame.loc[[label for label in main if label in frame.index]]
    if len(shown) == len(frame) or shown.empty:
        page.table(frame, caption, digits, css)
        return
    some = f"the {len(shown)} longest launches"
    page.table(shown, f"{caption}; {some}" if caption else some, digits, css)
    with page.details(f"All {len(frame)} launches"):
        page.table(frame, caption, digits, css)


def _stalls(page: HtmlPage, stalls: pd.DataFrame, main: list[str]) -> None:
    """Stall reasons (rows) by launch (columns), cycles per issued instruction and % of PC
    samples as two tables: one table of both is two columns per launch, wider than the page.
    The main launches only, every launch (as rows) folded away below them."""
    if stalls.empty:
        page.text("This report has no warp-state statistics.")
        return
    labels = list(dict.fromkeys(stalls.columns.get_level_values(0)))
    shown = [label for label in labels if label in main]
    some = f"; the {len(shown)} longest launches" if len(shown) < len(labels) else ""
    for measure, caption in STALL_MEASURES.items():
        page.table(_blank(stalls[shown].xs(measure, axis=1, level=1)), caption + some)
    if some:
        with page.details(f"All {len(labels)} launches"):
            for measure, caption in STALL_MEASURES.items():
                page.table(_blank(stalls.xs(measure, axis=1, level=1).T), caption)


def _hot_spots(page: HtmlPage, hot: pd.DataFrame) -> None:
    """The hot lines, a table per launch (its label the caption, not a column on every row),
    the source line last, where it wraps at a readable width."""
    for label, rows in hot.groupby("launch", sort=False):
        where = [
            f"{file}:{line}" if level == "source" else f"SASS {address}"
            for file, line, level, address in zip(
                rows["file"], rows["line"], rows["level"], rows["address"]
            )
        ]
        table = pd.DataFrame(
            {
                "where": where,
                "samples": rows["samples"].round().astype(int).to_numpy(),
                "share (%)": rows["share_pct"].to_numpy(),
                "top stall": rows["top_stall"].to_numpy(),
                "source (or SASS)": rows["text"].to_numpy(),
            }
        ).set_index("where")
        page.table(_blank(table), str(label), 1, "wrap")


def _instruction_stalls(page: HtmlPage, table: pd.DataFrame) -> None:
    """Each main launch's samples by SASS opcode and stall, a table per launch: where a
    source line's `barrier` holds both a wgmma's wait (WARPGROUP.DEPBAR) and parked warps
    (NOP), by opcode they come apart."""
    for label, rows in table.groupby("launch", sort=False):
        shown = rows.drop(columns="launch").set_index("instruction")
        shown["samples"] = shown["samples"].round().astype(int)
        page.table(shown.rename(columns={"share_pct": "share (%)"}), str(label), 1)


def _launch_details(
    page: HtmlPage, labels: list[str], main: list[str], write: Callable[[HtmlPage, str], None]
) -> None:
    """`write(page, label)` for each launch, the main launches first; the others' blocks fold
    into one block of their own when there are more (a decode step's 126)."""
    for label in [label for label in labels if label in main]:
        write(page, label)
    rest = [label for label in labels if label not in main]
    if rest:
        with page.details(f"The other {len(rest)} launches"):
            for label in rest:
                write(page, label)


def _rules(page: HtmlPage, report: NcuReport, main: list[str]) -> None:
    """ncu's rules: one line per launch first (how many to act on, which promises most), then
    each launch's rules and their messages, wrapped, in a block of their own, closed."""
    rules = report.rules()
    if rules.empty:
        return
    overview = rules_overview(rules, report.labels)
    page.heading("ncu rules")
    _per_launch(page, overview, main, "largest estimated speedup of each launch's rules", 1)
    shown = rules[rules["type"].isin(SHOWN_RULES)]
    by_launch = dict(iter(shown.groupby("launch", sort=False)))

    def write(page: HtmlPage, label: str) -> None:
        if label not in by_launch:
            return
        row = overview.loc[label]
        top = row["largest est. speedup (%)"]
        most = f", up to {top:.1f}% est. speedup ({row['its rule']})" if pd.notna(top) else ""
        rules = by_launch[label]
        table = pd.DataFrame(
            {
                "rule": [rule_name(rule) for _, rule in rules.iterrows()],
                "section": rules["section"],
                "type": rules["type"],
                "est. speedup (%)": rules["speedup_pct"],
                "of": rules["speedup_type"],
                "message": rules["message"],  # last: the wrapped column
            }
        ).set_index("rule")
        with page.details(f"{label}: {len(table)} rules{most}"):
            page.table(_blank(table), "", 1, "wrap")

    _launch_details(page, [label for label in report.labels if label in by_launch], main, write)


def _diff(page: HtmlPage, report: NcuReport, baseline: NcuReport, main: list[str]) -> None:
    """The change from a baseline: a line per compared launch, then every metric of each."""
    tables = diff_tables(report, baseline)
    page.heading(f"Change from {tables.baseline}")
    for note in tables.notes:
        page.text(note, css="note")
    _per_launch(page, tables.overview, main, "launches paired by kernel, token count, position")

    def write(page: HtmlPage, label: str) -> None:
        reference = tables.overview.at[label, "baseline launch"]
        with page.details(f"{label}, against {reference}"):
            page.table(tables.launches[label])

    _launch_details(page, list(tables.launches), main, write)


def write_ncu_page(report: NcuReport, path: str | Path, baseline: NcuReport | None = None) -> Path:
    """A self-contained page of one report: every table with its figure, the change from
    `baseline` (another report) if given, ncu's rules and the capture's metadata. A report of
    many launches tabulates its longest and folds the rest away. Returns the path written."""
    page = HtmlPage(f"Nsight Compute: {report.title}")
    for note in report.notes():
        page.text(note, css="note")
    main = report.main_launches()
    page.heading("Profiled time by kernel").figure(ncu_figure(report, "kernel_time"))
    page.table(report.kernel_time(), "each launch replayed alone, caches flushed", 1)
    page.heading("Summary").figure(ncu_figure(report, "summary"))
    _per_launch(page, fit(report.summary()), main)
    if baseline is not None:
        _diff(page, report, baseline, main)
    page.heading("Warp stalls").figure(ncu_figure(report, "stalls"))
    _stalls(page, report.stalls(), main)
    hot = report.main_hotspots()
    if not hot.empty:
        page.heading("Hot spots").figure(ncu_figure(report, "hotspots"))
        _hot_spots(page, hot)
    by_instruction = report.main_instruction_stalls()
    if not by_instruction.empty:
        page.heading("Samples by SASS instruction and stall")
        _instruction_stalls(page, by_instruction)
    page.heading("Occupancy").figure(ncu_figure(report, "occupancy"))
    _per_launch(page, fit(report.occupancy()), main)
    _rules(page, report, main)
    launches = report.launches.drop(columns=["index"])  # its demangled C++ name last: it wraps
    page.heading("Launches")
    launches = launches[[*launches.columns.drop("function"), "function"]]
    _per_launch(page, launches, main, css="wrap")
    if report.meta:
        page.heading("Capture").metadata(report.meta, "What was captured")
    return page.write(path)


def catalog_figure(catalog: NcuCatalog, kind: str, variant: str = "stock") -> go.Figure:
    """A figure of a capture set's main launches of one variant: "seed" (the seed table's
    percentages), "stalls", "occupancy" or "hotspots", in the style of ncu_figure."""
    title = f"{variant}: main launches"
    if kind == "seed":
        return ncu_figures.summary_bars(catalog.seed_table(variant), f"ncu summary, {title}")
    if kind == "stalls":
        return ncu_figures.stall_bars(catalog.stalls(variant), f"Warp stalls, {title}")
    if kind == "occupancy":
        return ncu_figures.occupancy_bars(catalog.occupancy(variant), f"Occupancy, {title}")
    if kind == "hotspots":
        return ncu_figures.hotspot_bars(catalog.hotspots(variant), f"Hot spots, {title}")
    raise _unknown(kind, CATALOG_FIGURE_KINDS)
