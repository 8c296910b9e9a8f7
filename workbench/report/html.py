"""The one self-contained HTML writer every result and report uses.

plotly.js is inlined once in the page head, figures are embedded without it, tables are plain
HTML: the page opens offline with no request to any CDN.
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


@dataclass
class HtmlPage:
    """Build a page section by section, then `write()` it."""

    title: str
    parts: list[str] = field(default_factory=list)
    contents: list[tuple[str, str]] = field(default_factory=list)
    figures: int = 0

    def heading(self, text: str) -> HtmlPage:
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

    @contextmanager
    def details(self, summary: str, open: bool = False) -> Iterator[HtmlPage]:
        """What is added inside the `with` block folds into a `<details>` block (closed unless
        `open`), so a long section costs the reader one line until asked for."""
        shown = " open" if open else ""
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
