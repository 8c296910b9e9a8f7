"""What the report's section writers write to, whichever page it becomes.

The report is written twice from one `Collection`: an offline HTML page with figures
(`seed_report`) and GitHub Markdown (`markdown`, which is how `docs/results.md` is made). One
set of section writers (`sections_profiles`, `sections_benchmarks`, `sections_experiments`)
writes both through this interface, so the two cannot drift apart: the same tables with the
same headers and rounding (`cells`). A figure is asked for by name (the HTML page draws it; the
Markdown document, which needs no plotly, leaves it out), and `table(..., extra=True)` marks
detail that folds away on the page and stays in the artifact for the document. Text may mark
code with backticks, as in Markdown; the HTML page shows it as code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import pandas as pd

from workbench.analysis.cards import card
from workbench.analysis.collection import Artifact
from workbench.report.cells import SHOWN_ROWS
from workbench.report.seed_tables import origin


class ReportPage(Protocol):
    """A page the section writers fill: the HTML page and the Markdown document."""

    def heading(self, text: str, level: int = 2) -> object: ...

    def text(self, text: str) -> object: ...

    def note(self, text: str) -> object:
        """A paragraph that must not be missed (a skipped run, an unread artifact)."""

    def bullets(self, lines: Sequence[str]) -> object: ...

    def absent(self, what: str, command: str) -> object:
        """What these artifacts lack and the command that makes it (`seed_tables.ABSENT`)."""

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
    ) -> object:
        """A table formatted by `cells.format_frame` (`index`, `by_row`, `unit`); on the HTML
        page the rows after `head` fold away, and an `extra` table folds away whole (the
        Markdown document leaves it to the artifact)."""

    def figure(self, name: str, *args: object) -> object:
        """A figure by name and its data (`seed_report.FIGURES`); the document has none."""


class WithoutAbsences:
    """A page that drops "absent: run this on the GPU machine" notes: the CPU runs' section,
    where a missing GPU run is no news."""

    def __init__(self, page: ReportPage):
        self._page = page

    def absent(self, what: str, command: str) -> None:
        return None

    def __getattr__(self, name: str) -> Callable:
        return getattr(self._page, name)


def display(path: Path) -> str:
    """A path as the report shows it: relative to the working directory when under it (so a
    report of `raw` and `ncu` names `raw/...` wherever the command ran), POSIX slashes."""
    path = Path(path)
    if path.is_absolute():
        with contextlib.suppress(ValueError):  # outside the working directory: as given
            path = path.relative_to(Path.cwd())
    return path.as_posix()


def sources(items: Iterable[Artifact], detail: Callable[[Artifact], str] | None = None) -> str:
    """Where a table came from: each artifact's path, GPU, card where recorded (so runs on the
    same card show as such) and commit (and `detail`)."""
    parts = []
    for item in items:
        env = origin(item.meta)
        on_card = card(item.meta)
        what = [env["GPU"], f"card {on_card}" if on_card else "", f"commit {env['commit']}"]
        if detail:
            what.append(detail(item))
        parts.append(f"`{display(item.path)}` ({', '.join(w for w in what if w)})")
    return "From " + "; ".join(parts) + "." if parts else ""


def short_status(status: object) -> str:
    """A harness row's status, short enough for a cell: an error's exception class rather
    than its message."""
    text = str(status)
    if text.startswith("error:"):
        return "error: " + text.removeprefix("error:").strip().split(":")[0]
    return text
