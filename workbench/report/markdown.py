"""`workbench report --markdown`: the seed report's tables as GitHub Markdown.

The HTML page (`seed_report`) is for reading with figures; this is for reading where code is
read: on GitHub, in a diff, in review. `docs/results.md` is this file made from the committed
artifacts, and a test regenerates it, so the output is a pure function of the artifacts: no
date of generation, sections in a fixed order, rows in a stable order, numbers rounded. Each
table says which artifacts it came from and what they ran on (GPU, commit), so a number
can be traced to the run that measured it.

This module is the document's header and the writing of the file; the outline (coverage,
sections, CPU runs, artifacts) is `document`'s and the tables are the section writers', the
same as on the HTML page, written through one Markdown writer (`markdown_page`). Pure pandas:
no plotly, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from workbench.analysis.collection import Collection
from workbench.report.document import CPU_TITLE, write_document
from workbench.report.markdown_page import MarkdownPage, anchor
from workbench.report.page import display
from workbench.report.seed_tables import DEFAULT_PATHS, SECTIONS

TITLE = "Results, generated from artifacts"


def build_markdown(
    collection: Collection,
    paths: Sequence[str | Path] = DEFAULT_PATHS,
    target: str = "PATH",
    include_cpu: bool = False,
) -> str:
    """The document: how it was made (the command, naming `paths` and `target`, the file it
    writes), then `document.write_document` (with the CPU runs' section when `include_cpu`)."""
    page = MarkdownPage(TITLE)
    shown = [display(Path(p)) for p in paths]
    named = " ".join(shown)
    under = " and ".join(", ".join(f"`{p}`" for p in shown).rsplit(", ", 1))
    flag = " --include-cpu" if include_cpu else ""
    page.text(
        f"Generated from the artifacts under {under} "
        f"by `workbench report {named} --markdown {target}{flag}`: change the generator "
        "(`workbench/report/markdown.py`) or the artifacts, not this file. Every number was "
        "measured on the GPU named under its table, by the commit named there; a section "
        "whose artifacts are absent says so and names the command that makes them. The seed "
        "study's own numbers, from another GPU, are in `docs/seed-study.md`."
    )
    titles = [s.title for s in SECTIONS] + ([CPU_TITLE] if include_cpu else []) + ["Artifacts"]
    page.text("\n".join(f"- [{title}](#{anchor(title)})" for title in titles))
    write_document(page, collection, include_cpu)
    return page.render()


def write_markdown(
    collection: Collection,
    path: str | Path,
    paths: Sequence[str | Path] = DEFAULT_PATHS,
    target: str | None = None,
    include_cpu: bool = False,
) -> Path:
    """Write the document to `path` through a temporary file renamed into place, so a reader
    never sees half of one. `target` is the file the document names as its own (default:
    `path`); a check that regenerates a committed document elsewhere names the committed one."""
    path = Path(path)
    text = build_markdown(collection, paths, target or display(path), include_cpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
