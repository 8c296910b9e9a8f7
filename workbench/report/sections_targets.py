"""The report's targets section: each kernel target, what one run measured, met or missed.

The benchmark sections show every row; a reader who asks "where do the kernels stand against
their goals" would have to redo the arithmetic from them. This section does it
(`analysis.targets`), each target from one run (the newest whole `bench dense` run, the newest
`bench moe` run that timed decode and prefill, the newest profile A/B of W8A16 against the
hybrid), and names the run beside the verdict, so a figure can be traced to the artifact that
measured it.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from workbench.analysis.collection import Artifact, Collection
from workbench.analysis.gpu_state import state_by_size
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
from workbench.report.sections_benchmarks import dense_run, newest, run_conditions
from workbench.report.seed_tables import Section, artifacts, bench_rows, started


def _timed_ours_at(sizes: set[int]) -> Callable[[pd.DataFrame], bool]:
    """Whether bench moe rows hold our kernels at every one of `sizes` tokens."""

    def holds(rows: pd.DataFrame) -> bool:
        ours = rows[rows["kernel"] == "moe"]
        return not ours.empty and sizes <= set(ours.get("tokens", []))

    return holds


def _moe_run(collection: Collection) -> Artifact | None:
    """The newest bench moe run that timed our kernels at the decode and the prefill size of
    the targets, else the newest that timed them at all."""
    return newest(collection, "bench-moe", _timed_ours_at({MOE_DECODE_T, MOE_PREFILL_T})) or (
        newest(collection, "bench-moe", _timed_ours_at(set()))
    )


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
    """A table of every target's measure, goal, measured figures, status and run, then, for
    each bench run judged that read it, the GPU's state at each size."""
    judged: list[tuple[Artifact, list[Verdict]]] = []
    for run, judge in ((dense_run(collection), dense_verdicts),
                       (_moe_run(collection), moe_verdicts)):  # fmt: skip
        if run is not None:  # a run's samples give its ratios their intervals, where it kept them
            judged.append((run, judge(bench_rows(run), run.result.get("samples"))))
    ab = _hybrid_ab_run(collection)
    if ab is not None:
        judged.append((ab, [hybrid_ab_verdict(ab.result.table())]))
    verdicts = [(v, f"`{display(run.path)}`") for run, vs in judged for v in vs]
    used = [run for run, _ in judged]
    if not verdicts:
        page.absent("a bench dense or bench moe run with our kernels", section.command)
        return
    table = verdict_table(verdicts)
    met = (table["status"] == "met").sum()
    page.table(table, f"Kernel targets: {met} of {len(table)} met", sources(used, run_conditions),
               index=False)  # fmt: skip
    for run in used:
        _write_gpu_state(page, run)


def _write_gpu_state(page: ReportPage, run: Artifact) -> None:
    """What the GPU did while each size's rows of a judged bench run were timed, where the run
    read it: a prefill size runs under the board's power cap, its clocks below their maximum,
    so its times (not its ratios, timed in turns) move with the GPU's state."""
    if run.kind not in ("bench-dense", "bench-moe"):
        return
    names = ["m"] if run.kind == "bench-dense" else ["routing", "tokens"]
    state = state_by_size(run.result.get("gpu_state"), run.result.get("samples"),
                          bench_rows(run), names)  # fmt: skip
    if state.empty:
        return
    window = (run.meta.get("gpu_state") or {}).get("window")
    span = "its rounds" if window == "rounds" else "its first warm-up to its last round"
    page.table(state, f"The GPU while each size's rows were timed ({run.kind}; read from "
               f"{span})", sources([run]), index=False)  # fmt: skip
