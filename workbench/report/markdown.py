"""`workbench report --markdown`: the seed report's tables as GitHub Markdown.

The HTML page (`seed_report`) is for reading with figures; this is for reading where code is
read: on GitHub, in a diff, in review. `docs/results.md` is this file made from the committed
artifacts, and a test regenerates it, so the output is a pure function of the artifacts: no
date of generation, sections in a fixed order, rows in a stable order, numbers rounded. Each
table says which artifacts it came from and what they ran on (GPU, commit), so a number
can be traced to the run that measured it.

This module is the document: its header, the sections in order (`seed_tables.SECTIONS`, with
the same "absent: run ..." notes as the HTML page) and the writing of the file. Each section's
tables are written by the module for its kind of artifact (`markdown_profiles`,
`markdown_benchmarks`, `markdown_experiments`), trimmed to the columns a reader compares, with
units in their headers, through one Markdown writer (`markdown_page`). Pure pandas: no plotly,
no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from workbench.analysis.collection import Collection
from workbench.report.markdown_benchmarks import write_attention, write_dense, write_moe
from workbench.report.markdown_experiments import write_hybrid, write_sweeps
from workbench.report.markdown_page import MarkdownPage, anchor, cell, display
from workbench.report.markdown_profiles import write_ncu, write_profiles
from workbench.report.seed_tables import DEFAULT_PATHS, SECTIONS, Section, artifact_table, coverage

TITLE = "Results, generated from artifacts"

WRITERS: dict[str, Callable[[MarkdownPage, Collection, Section], None]] = {
    "Dense MXFP8 backend": write_dense,
    "Kernel profiles in the server": write_profiles,
    "Nsight Compute on the stock kernel": write_ncu,
    "Things that did not help": write_sweeps,
    "Hybrid dense GEMM, controlled A/B": write_hybrid,
    "MoE kernels against their floor": write_moe,
    "Sparse attention kernels": write_attention,
}


def build_markdown(
    collection: Collection, paths: Sequence[str | Path] = DEFAULT_PATHS, target: str = "PATH"
) -> str:
    """The document: how it was made (the command, naming `paths` and `target`, the file it
    writes), the coverage table, a section per seed table (or why it is absent), and what each
    artifact ran on."""
    page = MarkdownPage(TITLE)
    shown = [display(Path(p)) for p in paths]
    named = " ".join(shown)
    under = " and ".join(", ".join(f"`{p}`" for p in shown).rsplit(", ", 1))
    page.text(
        f"Generated from the artifacts under {under} "
        f"by `workbench report {named} --markdown {target}`: change the generator "
        "(`workbench/report/markdown.py`) or the artifacts, not this file. Every number was "
        "measured on the GPU named under its table, by the commit named there; a section "
        "whose artifacts are absent says so and names the command that makes them. The seed "
        "study's own numbers, from another GPU, are in `docs/seed-study.md`."
    )
    page.text("\n".join(f"- [{s.title}](#{anchor(s.title)})" for s in SECTIONS)
              + "\n- [Artifacts](#artifacts)")  # fmt: skip
    page.heading("Coverage").table(coverage(collection).rename_axis("section"), index=True)
    kinds = collection.kinds()
    for section in SECTIONS:
        page.heading(section.title)
        if not section.in_seed:
            page.text("Not in the seed report: the workbench's kernel-level table.")
        if any(kinds.get(k) for k in section.kinds):
            if section.note:
                page.text(section.note)
            WRITERS[section.title](page, collection, section)
        else:
            page.absent(*section.absence)
    page.heading("Artifacts")
    if collection.items:
        page.table(artifact_table(collection, name=lambda p: f"`{display(p)}`"),
                   "What each artifact ran on")  # fmt: skip
    for path, why in collection.unread:
        page.text(f"> Not read: `{display(path)}`: {cell(why)}")
    return page.render()


def write_markdown(
    collection: Collection,
    path: str | Path,
    paths: Sequence[str | Path] = DEFAULT_PATHS,
    target: str | None = None,
) -> Path:
    """Write the document to `path` through a temporary file renamed into place, so a reader
    never sees half of one. `target` is the file the document names as its own (default:
    `path`); a check that regenerates a committed document elsewhere names the committed one."""
    path = Path(path)
    text = build_markdown(collection, paths, target or display(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
