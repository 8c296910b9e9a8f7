"""Where a profile's step time goes: each step's span, its kernel time by category, and the time
no kernel ran, from the kernel table (start_us, dur_us, step, category).

Why: a profile A/B's ratio says a change made a step slower; these say where. A change that
lengthens one category's kernels, or one that leaves the GPU idle between launches, reads the
same in the span, and not the same here. HolisticTraceAnalysis splits a trace's time the same
way (kernels by kind, and idle); here it is per step so an A/B can pair the arms' steps.
Pure pandas: no torch.
"""

from __future__ import annotations

import pandas as pd

IDLE = "idle (no kernel running)"


def step_spans_ms(kernels: pd.DataFrame) -> pd.Series:
    """Per step: from its first kernel's start to its last kernel's end, in ms."""
    ends = kernels["start_us"] + kernels["dur_us"]
    steps = kernels.assign(end_us=ends).groupby("step")
    return (steps["end_us"].max() - steps["start_us"].min()) / 1e3


def busy_ms(kernels: pd.DataFrame) -> pd.Series:
    """Per step: the time some kernel ran, in ms (the union of the launches' intervals, so two
    that overlap, as a launch with programmatic dependent launch overlaps the one before it,
    count once)."""
    ordered = kernels.sort_values(["step", "start_us"], kind="stable")
    ends = ordered["start_us"] + ordered["dur_us"]
    # the furthest any earlier launch of the step reached: a launch adds what lies past it
    reached = ends.groupby(ordered["step"]).transform(lambda e: e.cummax().shift())
    starts = ordered["start_us"].where(reached.isna(), ordered["start_us"].clip(lower=reached))
    added = (ends - starts).clip(lower=0)
    return added.groupby(ordered["step"]).sum() / 1e3


def breakdown(kernels: pd.DataFrame) -> dict:
    """The median step's kernel time by category and its idle time, in ms: each category's
    median over the steps (a step without that category's kernels counts 0), and the median
    of span minus busy time."""
    steps = pd.Index(kernels["step"].unique())
    per_step = kernels.groupby(["category", "step"])["dur_us"].sum().unstack("category")
    per_step = per_step.reindex(steps).fillna(0.0) / 1e3
    idle = (step_spans_ms(kernels) - busy_ms(kernels)).clip(lower=0)
    return {
        "category_ms": {str(c): float(per_step[c].median()) for c in per_step.columns},
        "idle_ms": float(idle.median()),
    }
