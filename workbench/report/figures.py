"""plotly figures of profile results. Colours are fixed per category so runs compare at a glance."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.rules import CATEGORIES
from workbench.analysis.tables import GAPS, TOTAL

CATEGORY_COLOURS = dict(
    zip(CATEGORIES, ("#d62728", "#1f77b4", "#2ca02c", "#17becf", "#ff7f0e", "#7f7f7f"))
)


def category_bars(panels: Mapping[str, pd.DataFrame], title: str, unit: str = "ms") -> go.Figure:
    """Stacked bars, one panel per phase (each with its own axis: a decode step is ~1000x
    shorter than a prefill), one bar per run, one segment per category."""
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=list(panels))
    shown: set[str] = set()
    for col, frame in enumerate(panels.values(), start=1):
        for category in frame.index:
            if category == TOTAL:
                continue
            fig.add_bar(
                name=category,
                legendgroup=category,
                showlegend=category not in shown,
                x=[str(c) for c in frame.columns],
                y=frame.loc[category].to_numpy(),
                marker_color=CATEGORY_COLOURS.get(category, "#ffffff"),
                # Idle time is not kernel time: hatched, so it never reads as a category.
                marker_pattern_shape="/" if category == GAPS else "",
                marker_line_color="#999999" if category == GAPS else None,
                hovertemplate=f"{category}: %{{y:,.3f}} {unit}<extra>%{{x}}</extra>",
                row=1,
                col=col,
            )
            shown.add(category)
        fig.update_yaxes(title_text=unit, row=1, col=col)
    fig.update_layout(
        barmode="stack", title=title, legend_title="category", template="plotly_white", height=440
    )
    return fig


def step_timeline(kernels: pd.DataFrame, title: str) -> go.Figure:
    """Kernels of one step back to back (idle gaps removed), by layer, coloured by category.

    Drawn on wall time, a decode step's few-microsecond kernels vanish between launch gaps;
    packed, the strip shows where kernel time goes, and the title says how much of the step's
    span the GPU sat idle.
    """
    rows = kernels.sort_values("start_us")
    busy = rows["dur_us"].cumsum() - rows["dur_us"]
    span_us = float((rows["start_us"] + rows["dur_us"]).max() - rows["start_us"].min())
    total_us = float(rows["dur_us"].sum())
    idle = 100 * (1 - total_us / span_us) if span_us else 0.0
    fig = go.Figure()
    for category, part in rows.groupby("category", sort=False):
        fig.add_bar(
            name=category,
            base=busy[part.index].to_numpy(),
            x=part["dur_us"].to_numpy(),
            y=part["layer"].astype("Float64").fillna(-1).to_numpy(),
            orientation="h",
            marker_color=CATEGORY_COLOURS.get(category),
            marker_line_width=0,
            customdata=part["name"].to_numpy(),
            hovertemplate="%{customdata}<br>%{x:.1f} us<extra>" + category + "</extra>",
        )
    fig.update_layout(
        title=(
            f"{title}: {total_us / 1e3:.2f} ms of kernels in a {span_us / 1e3:.2f} ms span "
            f"({idle:.0f}% idle between kernels)"
        ),
        xaxis_title="kernel time from step start, us (gaps removed)",
        yaxis_title="layer (-1: outside layers)",
        barmode="overlay",
        bargap=0.1,
        template="plotly_white",
        height=480,
    )
    return fig
