"""Per-category tables from a kernel table, shaped like the seed's "Kernel profiles" tables."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from workbench.analysis.rules import category_order

TOTAL = "Total"
GAPS = "Gaps between kernels"  # not a category: idle GPU time inside a step's span


def idle_between_kernels_us(rows: pd.DataFrame) -> float:
    """Time inside [first start, last end] when no kernel of `rows` ran (intervals merged)."""
    if rows.empty:
        return 0.0
    ordered = rows.sort_values("start_us")
    starts = ordered["start_us"].to_numpy()
    ends = (ordered["start_us"] + ordered["dur_us"]).to_numpy()
    idle, reach = 0.0, ends[0]
    for start, end in zip(starts[1:], ends[1:]):
        if start > reach:
            idle += start - reach
        reach = max(reach, end)
    return idle


def graph_start_wait_us(step: pd.DataFrame) -> float:
    """Idle time right before a step's first CUDA-graph kernel, after the eager kernels ahead
    of it (the step's input copies): the host's time to launch the graph, one gap that kernel
    fusion inside the graph cannot shrink. 0 for a step without graph kernels."""
    graph = step["graph"].fillna(False).astype(bool)
    if not graph.any():
        return 0.0
    first = step.loc[graph, "start_us"].min()
    before = step[~graph & (step["start_us"] < first)]
    if before.empty:
        return 0.0
    return max(0.0, float(first - (before["start_us"] + before["dur_us"]).max()))


def mean_over_ranks(
    kernels: pd.DataFrame, table_of: Callable[[pd.DataFrame], pd.DataFrame]
) -> pd.DataFrame:
    """The mean of `table_of`'s table over the ranks of a tensor-parallel run's `kernels`,
    each GPU's own (its steps, its gaps); a row one rank's table lacks (a category it never
    launched) counts 0 there, so the categories still add up to the total. Rows in the
    canonical category order, then the total and the gaps."""
    ranks = sorted(kernels["rank"].dropna().unique())
    per_rank = [table_of(kernels[kernels["rank"] == r]) for r in ranks]
    rows = set().union(*(table.index for table in per_rank))
    order = category_order(rows - {TOTAL, GAPS}) + [r for r in (TOTAL, GAPS) if r in rows]
    filled = [table.reindex(order, fill_value=0.0) for table in per_rank]  # missing rows: 0
    mean = sum(filled[1:], filled[0]) / len(filled)
    mean.attrs = per_rank[0].attrs
    return mean


def phase_table(kernels: pd.DataFrame, phase: str) -> pd.DataFrame:
    """Summed kernel time by category for one phase: time_ms, share_pct, kernels; Total last."""
    rows = kernels[kernels["phase"] == phase]
    order = category_order(set(kernels["category"].unique()))
    grouped = rows.groupby("category")["dur_us"].agg(["sum", "count"]).reindex(order, fill_value=0)
    total_us = float(grouped["sum"].sum())
    table = pd.DataFrame(
        {
            "time_ms": grouped["sum"] / 1e3,
            "share_pct": 100 * grouped["sum"] / total_us if total_us else 0.0,
            "kernels": grouped["count"].astype(int),
        }
    )
    table.loc[TOTAL] = [total_us / 1e3, 100.0 if total_us else 0.0, int(grouped["count"].sum())]
    table["kernels"] = table["kernels"].astype(int)
    table.index.name = "category"
    return table


def per_step_table(kernels: pd.DataFrame, phase: str = "decode") -> pd.DataFrame:
    """Kernel time per step by category: mean, std, min and max over the steps; Total, then
    the idle time between kernels inside each step's span (launch gaps, host overhead).

    Steps in which a category launched nothing count as zero for it, so the means add up.
    Kernels of the phase outside every step are left out; a phase with no steps is one step.
    """
    rows = kernels[kernels["phase"] == phase]
    if len(rows) and rows["step"].isna().all():
        # A phase scope with no step inside it: the whole phase is one step.
        rows = rows.assign(step=pd.array([0] * len(rows), dtype="Int64"))
    rows = rows[rows["step"].notna()]
    order = category_order(set(kernels["category"].unique()))
    per_step = rows.pivot_table(
        index="step", columns="category", values="dur_us", aggfunc="sum", fill_value=0.0
    ).reindex(columns=order, fill_value=0.0)
    per_step[TOTAL] = per_step.sum(axis=1)
    # A Series built step by step: groupby().apply() returns a DataFrame when there are no
    # groups, which cannot be assigned to one column.
    per_step[GAPS] = pd.Series(
        {step: idle_between_kernels_us(group) for step, group in rows.groupby("step")},
        dtype=float,
    ).reindex(per_step.index)
    counts = rows.groupby("step").size()
    stats = pd.DataFrame(
        {
            "mean_ms": per_step.mean() / 1e3,
            "std_ms": per_step.std(ddof=1).fillna(0.0) / 1e3,
            "min_ms": per_step.min() / 1e3,
            "max_ms": per_step.max() / 1e3,
        }
    )
    stats["kernels_per_step"] = rows.groupby("category").size().reindex(order, fill_value=0) / max(
        len(per_step), 1
    )
    stats.loc[TOTAL, "kernels_per_step"] = counts.mean() if len(counts) else 0.0
    stats.loc[GAPS, "kernels_per_step"] = float("nan")
    stats.index.name = "category"
    stats.attrs["steps"] = len(per_step)
    return stats


def short_kernel_name(name: str, width: int = 120) -> str:
    """A readable kernel name: no `void`, no parameter list, nested templates folded.

    `void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<...>>(int,
    ...)` becomes `at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<…>>`.
    Tables keep grouping by the full name; only the display is shortened.
    """
    text = name.removeprefix("void ")
    depth, out, args_at = 0, [], None
    for i, ch in enumerate(text):
        if ch == "(" and depth == 0 and i and (text[i - 1].isalnum() or text[i - 1] in "_>"):
            args_at = i  # a C++ signature's parameter list, not "Memcpy DtoD (Device -> Device)"
            break
        if ch == "<":
            depth += 1
            out.append(ch if depth <= 2 else "")
            if depth == 2:
                out.append("…")
            continue
        if ch == ">":
            depth -= 1
            out.append(ch if depth <= 1 else "")
            continue
        if depth <= 1:
            out.append(ch)
    short = "".join(out) if args_at is not None or depth == 0 else text
    return short if len(short) <= width else short[: width - 1] + "…"


def top_kernels(kernels: pd.DataFrame, phase: str | None = None, n: int = 15) -> pd.DataFrame:
    """The kernels that cost the most time, by name: calls, total, mean and share."""
    rows = kernels if phase is None else kernels[kernels["phase"] == phase]
    grouped = rows.groupby(["name", "category"])["dur_us"].agg(["count", "sum", "mean"])
    grouped = grouped.sort_values("sum", ascending=False).head(n).reset_index()
    total = rows["dur_us"].sum()
    return pd.DataFrame(
        {
            "category": grouped["category"].to_numpy(),
            "calls": grouped["count"].to_numpy(),
            "total_ms": (grouped["sum"] / 1e3).to_numpy(),
            "mean_us": grouped["mean"].to_numpy(),
            "share_pct": (100 * grouped["sum"] / (total or 1.0)).to_numpy(),
        },
        index=pd.Index(grouped["name"].to_numpy(), name="kernel"),
    )


def attribution_table(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernel counts by category, what kind of rule decided (`decided by`: range scope,
    module, launching op, kernel name, default, graph position) and which rule.

    External traces have no workbench scopes: this shows how much of a table rests on names.
    The counts add up to the number of kernels.
    """
    order = category_order(set(kernels["category"].unique()))
    rules = kernels["rule"].astype(object).where(kernels["rule"].notna(), "(not recorded)")
    frame = pd.DataFrame(
        {
            # Categorical in the canonical order, so the sorted index reads MoE first.
            "category": pd.Categorical(kernels["category"], categories=order, ordered=True),
            "decided by": kernels["source"].astype(object),
            "rule": rules,
        }
    )
    counts = frame.groupby(["category", "decided by", "rule"], observed=True, dropna=False).size()
    return counts.rename("kernels").to_frame().sort_index()


def side_by_side(tables: Mapping[str, pd.DataFrame], column: str) -> pd.DataFrame:
    """One column per run, taking `column` of each table; categories missing from a run are 0."""
    frame = pd.DataFrame({label: t[column] for label, t in tables.items()}).fillna(0.0)
    present = set(frame.index) - {TOTAL, GAPS}
    extra = [GAPS] if GAPS in frame.index else []
    return frame.reindex([*category_order(present), TOTAL, *extra]).fillna(0.0)
