"""An Nsight Compute report as terminal text: what `workbench ncu-report` prints and capture()
writes to `<name>.summary.txt`, and a report's change from a baseline.

A report of a whole decode step holds over a hundred launches, so the text details only the
longest MAIN_LAUNCHES of them and turns wide tables so launches are rows. Reads the report only
through its public tables; imports nothing of it at run time, so NcuReport.text() can use it.
The diff's tables (diff_tables) serve the HTML page too, so both show the same rounded numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import TYPE_CHECKING

import pandas as pd

from workbench.analysis.ncu_rules import SHOWN_RULES, rules_overview

if TYPE_CHECKING:
    from workbench.analysis.ncu import NcuReport

MAIN_LAUNCHES = 8  # text and HTML detail the longest launches only
DIGITS = 3  # significant digits of a diff's values: 410.75 us reads 411, 0.0623 stays
DURATION = "Duration (us)"


def fit(frame: pd.DataFrame, width: int = 4) -> pd.DataFrame:
    """Launches as rows once there are more than `width` of them, for a readable text file or
    page table (a decode step's 134 launches would otherwise be 134 columns)."""
    return frame.T if frame.shape[1] > width else frame


def _rounded(frame: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """Floats rounded cell by cell: summary columns hold text too, so DataFrame.round skips them."""
    return frame.map(lambda v: round(v, digits) if isinstance(v, float) else v)


def significant(value: object, digits: int = DIGITS, sign: bool = False) -> str:
    """A number as text with `digits` significant digits (never dropping integer digits) and no
    trailing zeros: 410.75 -> "411", 21.63 -> "21.6", 0.06234 -> "0.0623"; text as it is, NaN
    empty. `sign` writes "+" before a positive change."""
    if not isinstance(value, Real) or isinstance(value, bool):
        return "" if value is None else str(value)
    if math.isnan(value):
        return ""
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:{'+' if sign else ''},.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def percent(value: object, sign: bool = False) -> str:
    """A percentage with one decimal ("+26.9"); NaN empty."""
    if not isinstance(value, Real) or math.isnan(value):
        return ""
    return f"{value:{'+' if sign else ''}.1f}"


def _value(metric: str, value: object) -> str:
    return percent(value) if "%" in metric else significant(value)


@dataclass
class DiffTables:
    """A report against a baseline, readable: `overview` has one row per compared launch (its
    baseline launch and duration in both); `launches` one table per compared launch (every
    summary metric in both, the change and the change in %); `notes` the launches left out."""

    baseline: str
    overview: pd.DataFrame
    launches: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def diff_tables(report: NcuReport, baseline: NcuReport) -> DiffTables:
    """NcuReport.diff as rounded tables (text, not floats), launch by launch."""
    pairs = report.pairs(baseline)
    change = report.diff(baseline)
    mine, theirs = report.summary(), baseline.summary()
    overview, launches = {}, {}
    for label, reference in pairs.pairs.items():
        rows = {}
        for metric in mine.index:
            numeric = metric in change.index
            rows[metric] = {
                "baseline": _value(metric, theirs.at[metric, reference]),
                "this": _value(metric, mine.at[metric, label]),
                "change": significant(change.at[metric, (label, "change")], sign=True)
                if numeric
                else "",
                "change (%)": percent(change.at[metric, (label, "change_pct")], sign=True)
                if numeric
                else "",
            }
        launches[label] = pd.DataFrame.from_dict(rows, orient="index").rename_axis("metric")
        overview[label] = {
            "baseline launch": reference,
            "baseline (us)": rows[DURATION]["baseline"],
            "this (us)": rows[DURATION]["this"],
            "change (%)": rows[DURATION]["change (%)"],
        }
    table = pd.DataFrame.from_dict(overview, orient="index").rename_axis("launch")
    notes = pairs.notes(report.path.name, baseline.path.name)
    return DiffTables(baseline.path.name, table, launches, notes)


def report_text(report: NcuReport) -> str:
    """Every table of the report, titled, after a line on where the report came from."""
    main = report.main_launches()
    hot = report.main_hotspots()  # files already named as a reader knows them (ncu_source)
    rules = report.rules()
    overview = rules_overview(rules, report.labels)
    rules = rules[rules["type"].isin(SHOWN_RULES) & rules["launch"].isin(main)]
    stalls = report.stalls()
    stalls = stalls[main].head(10) if not stalls.empty else stalls
    some = f" of the {len(main)} longest launches" if len(main) < len(report) else ""
    sections = [
        ("Profiled time by kernel", report.kernel_time().head(MAIN_LAUNCHES * 2)),
        ("Summary", fit(report.summary())),
        ("Warp stalls: cycles per issued instruction, % of PC samples", stalls),
        ("Hot spots (most sampled lines)", hot.drop(columns=["level"])),
        ("Samples by SASS instruction and stall", report.main_instruction_stalls()),
        ("Occupancy", fit(report.occupancy())),
        ("ncu rules per launch", overview),
        (f"ncu rules{some}, largest estimated speedup first", rules.drop(columns=["message"])),
    ]
    lines = [f"Nsight Compute: {report.title}", *report.notes()]
    if len(main) < len(report):
        lines.append(
            f"Stalls, hot spots, samples by instruction and rules: the {len(main)} longest "
            "launches."
        )
    with pd.option_context("display.width", 250, "display.max_colwidth", 70):
        for title, frame in sections:
            body = _rounded(frame).to_string() if not frame.empty else "(none in this report)"
            lines += ["", title, body]
    return "\n".join(lines) + "\n"


def diff_text(report: NcuReport, baseline: NcuReport) -> str:
    """The change of every summary metric from another report: one line per compared launch,
    then every metric of the longest of them (NcuReport.diff, rounded)."""
    tables = diff_tables(report, baseline)
    lines = [f"Change from baseline {tables.baseline}", *tables.notes, ""]
    lines.append(tables.overview.to_string())
    main = [label for label in report.main_launches() if label in tables.launches]
    with pd.option_context("display.width", 250, "display.max_colwidth", 70):
        for label in main:
            reference = tables.overview.at[label, "baseline launch"]
            lines += ["", f"{label}, against {reference}", tables.launches[label].to_string()]
    return "\n".join(lines) + "\n"
