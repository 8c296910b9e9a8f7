"""The report's outline, the same for the HTML page and the Markdown document.

Coverage first, then a section per seed table (or why it is absent), then what each artifact
ran on. Runs timed on a CPU (the quick start's `tiny` profile, sweeps under Triton's
interpreter) measure the torch references or the interpreter, not GPU kernels: they never sit
in a section's GPU tables. By default they are left out with a note saying how many and how to
see them; `include_cpu` gives them a section of their own, after the GPU sections.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.analysis.collection import Collection, split_cpu
from workbench.report.page import ReportPage, WithoutAbsences, display
from workbench.report.sections_benchmarks import write_attention, write_dense, write_moe
from workbench.report.sections_experiments import write_hybrid, write_sweeps
from workbench.report.sections_profiles import write_ncu, write_profiles
from workbench.report.sections_targets import write_targets
from workbench.report.seed_tables import SECTIONS, Section, artifact_table, coverage

CPU_TITLE = "CPU runs"
CPU_SKIPPED = ("skipped {runs}: their times are CPU op times of the torch references (or of "
               "Triton's interpreter), not GPU kernel times; `--include-cpu` shows them in a "
               "table of their own")  # fmt: skip
CPU_NOTE = ("Times on a CPU are CPU op times of the torch references (or of Triton's "
            "interpreter), not GPU kernel times: they say that the machinery runs, not how fast "
            "a kernel is, so they stay out of the GPU tables above.")  # fmt: skip

WRITERS: dict[str, Callable[[ReportPage, Collection, Section], None]] = {
    "Dense MXFP8 backend": write_dense,
    "Kernel profiles in the server": write_profiles,
    "Nsight Compute on the stock kernel": write_ncu,
    "Things that did not help": write_sweeps,
    "Hybrid dense GEMM, controlled A/B": write_hybrid,
    "MoE kernels against their floor": write_moe,
    "Sparse attention kernels": write_attention,
    "Kernel targets": write_targets,
}


def cpu_skipped(cpu: Collection) -> str:
    """The one line that says CPU runs were left out: how many, and how to see them."""
    count = len(cpu.items)
    return CPU_SKIPPED.format(runs=f"{count} CPU run{'s' if count != 1 else ''}")


def _sections(page: ReportPage, collection: Collection, level: int, all_sections: bool) -> None:
    """A heading and the tables of each section (`all_sections`: absent ones too, with the
    command that makes their artifacts)."""
    kinds = collection.kinds()
    for section in SECTIONS:
        present = any(kinds.get(k) for k in section.kinds)
        if not (present or all_sections):
            continue
        page.heading(section.title, level)
        if not section.in_seed:
            page.text("Not in the seed report: the workbench's kernel-level table.")
        if present:
            if section.note:
                page.text(section.note)
            WRITERS[section.title](page, collection, section)
        else:
            page.absent(*section.absence)


def write_document(page: ReportPage, collection: Collection, include_cpu: bool = False) -> None:
    """Coverage, the sections of the GPU artifacts, the CPU runs (their own section with
    `include_cpu`, else a note), and what each artifact ran on."""
    gpu, cpu = split_cpu(collection)
    page.heading("Coverage")
    page.table(coverage(gpu), "Which seed tables these artifacts rebuild")
    if cpu.items and not include_cpu:
        page.note(f"This report {cpu_skipped(cpu)}.")
    _sections(page, gpu, 2, all_sections=True)
    if include_cpu:
        page.heading(CPU_TITLE)
        page.text(CPU_NOTE if cpu.items else "No CPU runs among these artifacts.")
        _sections(WithoutAbsences(page), cpu, 3, all_sections=False)
    page.heading("Artifacts")
    if collection.items:
        page.table(artifact_table(collection, name=lambda p: f"`{display(p)}`"),
                   "What each artifact ran on")  # fmt: skip
    for path, why in collection.unread:
        page.note(f"Not read: `{display(path)}`: {why}")
