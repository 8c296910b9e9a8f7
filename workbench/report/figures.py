"""plotly figures of profile results. Colours are fixed per category so runs compare at a glance."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.rules import CATEGORIES
from workbench.analysis.tables import TOTAL

CATEGORY_COLOURS = dict(
    zip(CATEGORIES, ("#d62728", "#1f77b4", "#2ca02c", "#17becf", "#ff7f0e", "#7f7f7f"))
)


def category_bars(frame: pd.DataFrame, title: str, unit: str = "ms") -> go.Figure:
    """Stacked bars: one bar per column (a run and phase), one segment per category row."""
    fig = go.Figure()
    for category in frame.index:
        if category == TOTAL:
            continue
        fig.add_bar(
            name=category,
            x=[str(c) for c in frame.columns],
            y=frame.loc[category].to_numpy(),
            marker_color=CATEGORY_COLOURS.get(category),
            hovertemplate=f"{category}: %{{y:,.2f}} {unit}<extra>%{{x}}</extra>",
        )
    fig.update_layout(
        barmode="stack",
        title=title,
        yaxis_title=unit,
        legend_title="category",
        template="plotly_white",
        height=420,
    )
    return fig


def step_timeline(kernels: pd.DataFrame, title: str) -> go.Figure:
    """Kernels of one step on a time axis, coloured by category (a Gantt-like strip)."""
    fig = go.Figure()
    start0 = kernels["start_us"].min() if len(kernels) else 0.0
    for category, rows in kernels.groupby("category", sort=False):
        fig.add_bar(
            name=category,
            base=(rows["start_us"] - start0).to_numpy(),
            x=rows["dur_us"].to_numpy(),
            y=rows["layer"].astype("Float64").fillna(-1).to_numpy(),
            orientation="h",
            marker_color=CATEGORY_COLOURS.get(category),
            customdata=rows["name"].to_numpy(),
            hovertemplate="%{customdata}<br>%{x:.1f} us<extra>" + category + "</extra>",
        )
    fig.update_layout(
        title=title,
        xaxis_title="us from step start",
        yaxis_title="layer (-1: outside layers)",
        barmode="overlay",
        template="plotly_white",
        height=460,
    )
    return fig
