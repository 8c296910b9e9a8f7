"""The report's cells: numbers rounded by the unit their header names, headers a reader can read.

Both writers of the report (the HTML page and the Markdown document) format every table here,
so a number reads the same in both, and the rounding follows from the header instead of a digit
count chosen table by table: a header says its unit (`MoE (ms)`, `× floor`, `share (%)`,
`rel. error`), and the unit says how precise a number can usefully be. Times and rates keep 3
significant digits (a median's noise is in the third), ratios 2 decimals (whole from 100 up),
percentages 1, errors scientific notation (they span decades); counts are whole. A column
whose header names no unit takes the table's (`unit=`), else it shows whole numbers whole and
others to 3 significant digits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

SHOWN_ROWS = 15  # a longer table shows its first rows and folds the rest away (HTML)
# A cell that reads as a number (right-aligned): `1,234.5`, `-38%`, `3.58 (spills)`, `0.7 – 0.8`,
# `1.7e-03`, `411 → 255 (-38%)`.
NUMBER = re.compile(
    r"[-+]?[\d,]*\.?\d+(e[-+]\d+)?%?( \(.*\))?(( – | → )[-+]?[\d,]*\.?\d+(e[-+]\d+)?( \(.*\))?)?"
)
UNITS = (  # (unit, how a header names it), first match wins: "error (%)" is an error
    ("error", re.compile(r"\berror\b", re.IGNORECASE)),
    ("pct", re.compile(r"%")),
    ("ratio", re.compile(r"(^|\s)[×x]\s|\bb / a\b| / |\bratio\b|\bspeedup\b", re.IGNORECASE)),
    ("time", re.compile(r"\((ms|us|µs|ns|s)\)|\b(ms|us)\b")),
    ("rate", re.compile(r"/s\b")),
)
RENAMED = {  # raw column names whose words alone would not say what they are
    "ratio_to_floor": "× floor",
    "ratio_to_cublas": "× cuBLAS",
    "rel_error": "rel. error",
    "error_vs_bf16": "rel. error vs bf16",
    "tokens_per_s": "tokens/s",
    "tflops": "TFLOP/s",
    "ci_low": "95% interval low (ms)",
    "ci_high": "95% interval high (ms)",
    "regs": "registers",
}
SUFFIXES = (("_ms", " (ms)"), ("_us", " (us)"), ("_pct", " (%)"), ("_per_s", "/s"),
            ("_gib", " (GiB)"), ("_bytes", " (bytes)"))  # fmt: skip


def unit_of(header: object, default: str = "") -> str:
    """The unit a header names ("time", "rate", "ratio", "pct", "error"), else `default`."""
    for unit, pattern in UNITS:
        if pattern.search(str(header)):
            return unit
    return default


def human_header(name: object) -> str:
    """A raw column name as a header: `time_ms` -> `time (ms)`, `ratio_to_floor` -> `× floor`;
    a name without underscores is taken to be a header already."""
    text = str(name)
    if "_" not in text:
        return text
    if text in RENAMED:
        return RENAMED[text]
    for suffix, unit in SUFFIXES:
        if text.endswith(suffix):
            return human_header(text.removesuffix(suffix)) + unit
    return re.sub(r"(?<=\w)_(?=\w)", " ", text).strip("_ ")


def _significant(value: float, digits: int = 3) -> str:
    """`digits` significant digits, whole numbers kept whole: 5205.5 -> 5,206, 0.0025 ->
    0.00250."""
    if value == 0:
        return "0"
    places = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{places}f}"


def format_value(value: object, unit: str = "", whole: bool = False) -> str:
    """One cell: a number rounded for its unit (`whole`: a unitless column of whole numbers),
    text as it is, a missing value empty."""
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer) and unit not in ("error", "ratio", "pct"):
        return f"{int(value):,}"
    if isinstance(value, int | float | np.integer | np.floating):
        number = float(value)
        if math.isnan(number):
            return ""
        if unit == "error":
            return "0" if number == 0 else f"{number:.1e}"
        if unit == "pct":
            return f"{number:,.1f}"
        if unit == "ratio":  # 1.03 against 1.05 matters; 551.54 against 551.60 does not
            return f"{number:,.2f}" if abs(number) < 100 else f"{number:,.0f}"
        if not unit and whole and number.is_integer():
            return f"{int(number):,}"
        return _significant(number)
    return str(value).strip()


def format_column(values: Iterable[object], header: object, unit: str = "") -> list[str]:
    """A column's cells, rounded by the unit its header names (else `unit`)."""
    values = list(values)
    kind = unit_of(header, unit)
    numbers = [v for v in values if isinstance(v, int | float | np.integer | np.floating)]
    whole = all(float(v).is_integer() for v in numbers if not math.isnan(float(v)))
    return [format_value(v, kind, whole) for v in values]


def _header(column: object) -> str:
    """A column label as one header: levels joined by spaces, raw names made readable."""
    parts = column if isinstance(column, tuple) else (column,)
    return " ".join(human_header(p) for p in parts if str(p))


def format_frame(
    frame: pd.DataFrame, index: bool | None = None, by_row: bool = False, unit: str = ""
) -> tuple[list[str], list[list[str]], list[bool]]:
    """A table as text: its headers, its rows of cells and, per column, whether it reads as
    numbers (to right-align). The index becomes the first column(s) when `index` (by default
    unless it is a plain row count). `by_row`: the row labels name the units (a metric per
    row, a launch per column), else the headers do, else `unit`."""
    if index is None:
        index = not isinstance(frame.index, pd.RangeIndex) or any(frame.index.names)
    labels = [str(label) for label in frame.index]
    if by_row:
        rows = [format_column(frame.iloc[i].tolist(), label, unit) for i, label in
                enumerate(labels)]  # fmt: skip
        columns = [list(cells) for cells in zip(*rows)] if rows else [[] for _ in frame.columns]
    else:
        columns = [format_column(frame.iloc[:, i].tolist(), _header(c), unit)
                   for i, c in enumerate(frame.columns)]  # fmt: skip
    headers = [_header(c) for c in frame.columns]
    if index:
        names = [n or "" for n in frame.index.names]
        levels = [frame.index.get_level_values(i) for i in range(frame.index.nlevels)]
        shown = [format_column(level.tolist(), "") for level in levels]
        headers = [human_header(n) for n in names] + headers
        columns = shown + columns
    numeric = [any(col) and all(not c or NUMBER.fullmatch(c) for c in col) for col in columns]
    rows = [list(row) for row in zip(*columns)] if columns else []
    return headers, rows, numeric
