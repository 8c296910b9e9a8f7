"""The GitHub Markdown writer the results document (`markdown`) is built with.

The Markdown counterpart of the HTML page (`seed_report.HtmlReport`): both take what the
section writers write (`page.ReportPage`) and format every cell through `cells`, so a number
reads the same in both. The document is regenerated and compared byte for byte, so cells come
out stable (numbers rounded by their unit, thousands separated, missing values empty) and
tables stay valid GitHub tables whatever text a cell holds. Figures and the page's folded
detail tables are left out: the document is for reading where code is read, and the full rows
are in the artifact each table names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pandas as pd

from workbench.report.cells import SHOWN_ROWS, format_frame
from workbench.report.seed_tables import ABSENT


def _cell(text: str) -> str:
    """Text safe inside a table row: no `|` or line break."""
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip()


def markdown_table(
    frame: pd.DataFrame, index: bool | None = None, by_row: bool = False, unit: str = ""
) -> str:
    """`frame` as a GitHub Markdown table, formatted by `cells.format_frame` (its index as the
    first column(s) when `index`; units named by the headers, or by the row labels when
    `by_row`, else `unit`), columns of numbers right-aligned."""
    headers, rows, numeric = format_frame(frame, index, by_row, unit)
    lines = [
        "| " + " | ".join(_cell(h) for h in headers) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


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

    def note(self, text: str) -> MarkdownPage:
        return self.text(f"> {text}")

    def bullets(self, lines: Sequence[str]) -> MarkdownPage:
        return self.text("\n".join(f"- {line}" for line in lines))

    def absent(self, what: str, command: str) -> MarkdownPage:
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
    ) -> MarkdownPage:
        """A captioned table and its source; every row (`head` folds rows on the HTML page
        only), and nothing for an `extra` table (its rows stay in the artifact)."""
        if extra:
            return self
        if caption:
            self.parts.append(f"**{caption}**")
        self.parts.append(markdown_table(frame, index, by_row, unit))
        if source:
            self.parts.append(source)
        return self

    def figure(self, name: str, *args: object) -> MarkdownPage:
        """Nothing: the document has no figures (the HTML page draws them)."""
        return self

    def render(self) -> str:
        return f"# {self.title}\n\n" + "\n\n".join(self.parts) + "\n"
