"""The GitHub Markdown writer the results document (`markdown`) is built with.

The Markdown counterpart of `html.HtmlPage`, kept apart from what goes into the document so
that the section writers (`markdown_profiles`, `markdown_benchmarks`, `markdown_experiments`)
share one way to write a cell, a table, a path and a source: the document is regenerated and
compared byte for byte, so every table must format a number the same way. Cells come out
stable (numbers rounded, thousands separated, missing values empty) and tables stay valid
GitHub tables whatever text a cell holds.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.collection import Artifact
from workbench.report.seed_tables import ABSENT, origin

# A cell that reads as a number (right-aligned): `1,234.5`, `-38%`, `3.581 (spills)`, `0.7 – 0.8`.
NUMBER = re.compile(r"[-+]?[\d,]*\.?\d+%?( \(.*\))?( – [-+]?[\d,]*\.?\d+)?")


def cell(value: object, digits: int = 2, trim: bool = False) -> str:
    """A table cell: floats rounded to `digits` with thousands separators (integral floats
    without decimals when `trim`), integers with separators, missing values empty, and text
    safe inside a table row (no `|` or line break)."""
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer):
        return f"{int(value):,}"
    if isinstance(value, float | np.floating):
        value = float(value)
        if math.isnan(value):
            return ""
        if trim and value.is_integer():
            return f"{int(value):,}"
        return f"{value:,.{digits}f}"
    return str(value).replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip()


def short_status(status: object) -> str:
    """A harness row's status, short enough for a cell: an error's exception class rather
    than its message."""
    text = str(status)
    if text.startswith("error:"):
        return "error: " + text.removeprefix("error:").strip().split(":")[0]
    return text


def markdown_table(
    frame: pd.DataFrame,
    digits: int | Mapping[str, int] = 2,
    index: bool | None = None,
    trim: bool = False,
) -> str:
    """`frame` as a GitHub Markdown table: its index as the first column(s) (when `index`;
    by default unless it is a plain row count), column levels joined by spaces, columns of
    numbers right-aligned. `digits` is one count for every float, or a count per column (2 for
    the others)."""
    if index is None:
        index = not isinstance(frame.index, pd.RangeIndex) or any(frame.index.names)
    if index:
        names = [n or "" for n in frame.index.names]
        frame = frame.copy()
        frame.index.names = names if len(names) > 1 else [names[0] or " "]
        frame = frame.reset_index()
    headers = [
        " ".join(str(part) for part in col if str(part)) if isinstance(col, tuple) else str(col)
        for col in frame.columns
    ]
    per_column = digits if isinstance(digits, Mapping) else {}
    columns = []
    for position, header in enumerate(headers):
        places = per_column.get(header, 2) if per_column else int(digits)  # type: ignore[arg-type]
        values = frame.iloc[:, position].tolist()
        columns.append([cell(v, places, trim) for v in values])
    right = [any(col) and all(not c or NUMBER.fullmatch(c) for c in col)
             for col in columns]  # fmt: skip
    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "|" + "|".join("---:" if r else "---" for r in right) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in zip(*columns)] if columns else []
    return "\n".join(lines)


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def display(path: Path) -> str:
    """A path as the report shows it: relative to the working directory when under it (so a
    report of `raw` and `ncu` names `raw/...` wherever the command ran), POSIX slashes."""
    path = Path(path)
    if path.is_absolute():
        with contextlib.suppress(ValueError):  # outside the working directory: as given
            path = path.relative_to(Path.cwd())
    return path.as_posix()


def sources(items: Iterable[Artifact], detail: Callable[[Artifact], str] | None = None) -> str:
    """Where a table came from: each artifact's path, GPU and commit (and `detail`)."""
    parts = []
    for item in items:
        env = origin(item.meta)
        what = [env["GPU"], f"commit {env['commit']}"]
        if detail:
            what.append(detail(item))
        parts.append(f"`{display(item.path)}` ({', '.join(w for w in what if w)})")
    return "From " + "; ".join(parts) + "." if parts else ""


class MarkdownPage:
    """A Markdown document built section by section: headings, paragraphs, captioned tables
    with their sources, and notes for what is absent."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []

    def heading(self, text: str, level: int = 2) -> MarkdownPage:
        self.parts.append(f"{'#' * level} {text}")
        return self

    def text(self, text: str) -> MarkdownPage:
        self.parts.append(text)
        return self

    def absent(self, what: str, command: str) -> MarkdownPage:
        return self.text("> " + ABSENT.format(what=what, command=command))

    def table(
        self, frame: pd.DataFrame, caption: str = "", source: str = "", **options: object
    ) -> MarkdownPage:
        if caption:
            self.parts.append(f"**{caption}**")
        self.parts.append(markdown_table(frame, **options))  # type: ignore[arg-type]
        if source:
            self.parts.append(source)
        return self

    def render(self) -> str:
        return f"# {self.title}\n\n" + "\n\n".join(self.parts) + "\n"
