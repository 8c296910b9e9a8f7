"""The one self-contained HTML writer every result and report uses.

plotly.js is inlined once in the page head, figures are embedded without it, tables are plain
HTML: the page opens offline with no request to any CDN.

Two kinds of table: `table` rounds every float to one digit count (the single-result pages),
`data_table` formats cells by the unit their header names (`cells`, as the Markdown document
does), fits the page (text cells wrap, anywhere if they must; a table that still cannot fit
scrolls inside its own box, never the page) and folds the rows after its first ones into a
`<details>` ("N more rows"), so a long table costs the reader a line until asked for.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from workbench.report.cells import NUMBER, SHOWN_ROWS, format_frame

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1150px; color: #222; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2.2rem;
  border-bottom: 1px solid #ddd; } h3 { font-size: 1.05rem; }
table.data { border-collapse: collapse; margin: 0.6rem 0 1.2rem; font-size: 0.88rem;
  display: block; max-width: 100%; overflow-x: auto; }  /* wide tables scroll */
table.data th, table.data td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
table.data th:first-child, table.data td:first-child { text-align: left; }
table.data thead th { background: #f3f3f3; }
.caption { color: #555; font-size: 0.85rem; margin-bottom: 0.3rem; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.4rem 0.8rem; }
details { margin: 0.5rem 0 1rem; } pre { font-size: 0.78rem; background: #f7f7f7;
  padding: 0.6rem; overflow-x: auto; }
nav ol { columns: 2; font-size: 0.9rem; }
/* table.wrap: the last column is prose (ncu's rule messages, C++ names) and wraps at a
   readable width instead of being squeezed to a sliver or stretching the page */
table.data.wrap td:last-child { text-align: left; white-space: normal; min-width: 36ch;
  max-width: 80ch; overflow-wrap: anywhere; }
details > summary { cursor: pointer; } details details { margin-left: 1rem; }
/* data_table: fits the page; numbers stay whole, text (paths, kernel names) wraps */
div.table { max-width: 100%; overflow-x: auto; }
div.table table.data { display: table; margin-bottom: 0.3rem; }
table.data td.num { white-space: nowrap; }
table.data .text, table.data .text:first-child { text-align: left; overflow-wrap: break-word; }
table.data td code { overflow-wrap: anywhere; }  /* paths and kernel names break anywhere */
table.data th { vertical-align: bottom; }
.source { color: #666; font-size: 0.78rem; margin-bottom: 1.2rem; overflow-wrap: anywhere; }
details.more > summary { color: #555; font-size: 0.85rem; }
"""


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def _format_table(frame: pd.DataFrame, digits: int, css: str = "") -> str:
    def fmt(value):
        if isinstance(value, float):
            return "" if math.isnan(value) else f"{value:,.{digits}f}"
        return value

    shown = frame.apply(lambda col: col.map(fmt))
    return shown.to_html(classes=f"data {css}".strip(), border=0, na_rep="", escape=True)


def inline(text: str) -> str:
    """Text as HTML, with `code` (Markdown's backticks) shown as code."""
    parts = html.escape(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: shown as it is
        return html.escape(text)
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _td(cell: str, number: bool) -> str:
    return f'<td class="{"num" if number else "text"}">{inline(cell)}</td>'


def _data_rows(rows: list[list[str]], numeric: list[bool], by_row: bool) -> str:
    """Table rows; a cell is right-aligned when its column holds numbers, or (`by_row`: a
    metric per row, so columns mix numbers and text) when it is a number itself."""
    lines = (
        "".join(_td(c, n or (by_row and bool(NUMBER.fullmatch(c)))) for c, n in zip(row, numeric))
        for row in rows
    )
    return "".join(f"<tr>{line}</tr>" for line in lines)


def _data_table(
    headers: list[str], rows: list[list[str]], numeric: list[bool], by_row: bool
) -> str:
    """A table in its own box (`div.table`), which scrolls if the table cannot fit."""
    head = "".join(f'<th class="{"num" if n else "text"}">{inline(h)}</th>'
                   for h, n in zip(headers, numeric))  # fmt: skip
    return (f'<div class="table"><table class="data"><thead><tr>{head}</tr></thead>'
            f"<tbody>{_data_rows(rows, numeric, by_row)}</tbody></table></div>")  # fmt: skip


@dataclass
class HtmlPage:
    """Build a page section by section, then `write()` it."""

    title: str
    parts: list[str] = field(default_factory=list)
    contents: list[tuple[str, str]] = field(default_factory=list)
    figures: int = 0

    def heading(self, text: str, level: int = 2) -> HtmlPage:
        """A heading; a top-level one (`level` 2) is listed in the contents."""
        if level > 2:
            self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")
            return self
        anchor = _anchor(text)
        self.contents.append((anchor, text))
        self.parts.append(f'<h2 id="{anchor}">{html.escape(text)}</h2>')
        return self

    def text(self, text: str, css: str = "") -> HtmlPage:
        klass = f' class="{css}"' if css else ""
        self.parts.append(f"<p{klass}>{html.escape(text)}</p>")
        return self

    def table(
        self, frame: pd.DataFrame, caption: str = "", digits: int = 2, css: str = ""
    ) -> HtmlPage:
        """A table; `css` adds classes to it ("wrap": its last column is wrapped prose)."""
        if caption:
            self.parts.append(f'<div class="caption">{html.escape(caption)}</div>')
        self.parts.append(_format_table(frame, digits, css))
        return self

    def data_table(
        self,
        frame: pd.DataFrame,
        caption: str = "",
        source: str = "",
        *,
        index: bool | None = None,
        by_row: bool = False,
        unit: str = "",
        head: int = SHOWN_ROWS,
    ) -> HtmlPage:
        """A table formatted by `cells.format_frame` (`index`, `by_row`, `unit` as there) that
        fits the page, its rows after the first `head` folded into "N more rows", and the
        artifacts it came from (`source`) under it; `caption` and `source` may mark code with
        backticks."""
        headers, rows, numeric = format_frame(frame, index, by_row, unit)
        if caption:
            self.parts.append(f'<div class="caption">{inline(caption)}</div>')
        self.parts.append(_data_table(headers, rows[:head], numeric, by_row))
        if rows[head:]:
            more = len(rows) - head
            with self.details(f"{more} more row{'s' if more > 1 else ''}", css="more"):
                self.parts.append(_data_table(headers, rows[head:], numeric, by_row))
        if source:
            self.parts.append(f'<div class="source">{inline(source)}</div>')
        return self

    @contextmanager
    def details(self, summary: str, open: bool = False, css: str = "") -> Iterator[HtmlPage]:
        """What is added inside the `with` block folds into a `<details>` block (closed unless
        `open`), so a long section costs the reader one line until asked for."""
        shown = (" open" if open else "") + (f' class="{css}"' if css else "")
        self.parts.append(f"<details{shown}><summary>{html.escape(summary)}</summary>")
        try:
            yield self
        finally:
            self.parts.append("</details>")

    def figure(self, fig: go.Figure) -> HtmlPage:
        self.figures += 1
        self.parts.append(
            fig.to_html(
                full_html=False,
                include_plotlyjs=False,
                div_id=f"figure-{self.figures}",
                config={"displaylogo": False},
            )
        )
        return self

    def metadata(self, meta: Mapping, summary: str = "Run metadata") -> HtmlPage:
        body = html.escape(json.dumps(meta, indent=2, sort_keys=True, default=str))
        self.parts.append(f"<details><summary>{html.escape(summary)}</summary><pre>{body}</pre>")
        self.parts.append("</details>")
        return self

    def render(self) -> str:
        nav = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t in self.contents)
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title)}</title><style>{STYLE}</style>"
            f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
            f"<h1>{html.escape(self.title)}</h1>"
            + (
                f"<nav><strong>Contents</strong><ol>{nav}</ol></nav>"
                if len(self.contents) > 1
                else ""
            )
            + "\n".join(self.parts)
            + "</body></html>\n"
        )

    def write(self, path: str | Path) -> Path:
        return write_atomic(path, self.render())


def write_atomic(path: str | Path, text: str) -> Path:
    """Write atomically enough for a report: a temporary file renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
