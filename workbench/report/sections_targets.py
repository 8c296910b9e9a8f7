"""The report's targets section: each kernel target, what one run measured, met or missed.

The benchmark sections show every row; a reader who asks "where do the kernels stand against
their goals" would have to redo the arithmetic from them. This section does it
(`analysis.targets`), each target from one run (the newest whole `bench dense` run, the newest
`bench moe` run that timed decode and prefill, the newest profile A/B of W8A16 against the
hybrid), and names the run beside the verdict, so a figure can be traced to the artifact that
measured it.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.collection import Artifact, Collection
from workbench.analysis.targets import (
    MOE_DECODE_T,
    MOE_PREFILL_T,
    Verdict,
    dense_verdicts,
    hybrid_ab_verdict,
    moe_verdicts,
    verdict_table,
)
from workbench.report.page import ReportPage, display, sources
from workbench.report.sections_benchmarks import dense_run, newest
from workbench.report.seed_tables import Section, artifacts, bench_rows, started


def _moe_run(collection: Collection) -> Artifact | None:
    """The newest bench moe run that timed our kernels at the decode and the prefill size of
    the targets, else the newest that timed them at all."""

    def both(rows: pd.DataFrame) -> bool:
        ours = rows[rows["kernel"] == "moe"]
        return {MOE_DECODE_T, MOE_PREFILL_T} <= set(ours.get("tokens", []))

    ours = lambda rows: bool((rows["kernel"] == "moe").any())  # noqa: E731
    return newest(collection, "bench-moe", both) or newest(collection, "bench-moe", ours)


def _hybrid_ab_run(collection: Collection) -> Artifact | None:
    """The newest profile A/B of W8A16 (a) against the hybrid (b)."""
    runs = [
        item
        for item in sorted(artifacts(collection, "ab"), key=started)
        if item.meta.get("params", {}).get("kernel") == "profile"
        and item.meta["params"].get("a") == {"dense": "w8a16"}
        and (item.meta["params"].get("b") or {}).get("dense") == "hybrid"
    ]
    return runs[-1] if runs else None


def write_targets(page: ReportPage, collection: Collection, section: Section) -> None:
    """One table: every target's measure, goal, measured figures, status and run."""
    verdicts: list[tuple[Verdict, str]] = []
    used = []
    for run, judge in ((dense_run(collection), dense_verdicts), (_moe_run(collection),
                                                                moe_verdicts)):  # fmt: skip
        if run is not None:
            verdicts += [(v, f"`{display(run.path)}`") for v in judge(bench_rows(run))]
            used.append(run)
    ab = _hybrid_ab_run(collection)
    if ab is not None:
        verdicts.append((hybrid_ab_verdict(ab.result.table()), f"`{display(ab.path)}`"))
        used.append(ab)
    if not verdicts:
        page.absent("a bench dense or bench moe run with our kernels", section.command)
        return
    table = verdict_table(verdicts)
    met = (table["status"] == "met").sum()
    page.table(table, f"Kernel targets: {met} of {len(table)} met", sources(used), index=False)
