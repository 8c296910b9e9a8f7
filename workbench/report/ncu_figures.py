"""plotly figures of Nsight Compute tables (made by workbench.analysis.ncu.NcuReport).

Each function takes the table its name says and returns a figure. A stall reason keeps one
colour in every figure, so a chart of one report reads like the chart of the next.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

# ncu's warp states, in the order of its documentation; a reason not listed here is grey.
STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle",
    "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
    "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait",
)  # fmt: skip
STALL_COLOURS = dict(zip(STALL_REASONS, qualitative.Dark24))
OTHER_COLOUR = "#9e9e9e"


def _numeric_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(pd.to_numeric, errors="coerce")


def kernel_time_bars(kernel_time: pd.DataFrame, title: str, top: int = 20) -> go.Figure:
    """Share of the profiled time per kernel, the longest on top; the rest in one bar."""
    rows = kernel_time.head(top)
    rest = kernel_time.iloc[top:]
    names = [*rows.index]
    shares, launches = [*rows["share_pct"]], [*rows["launches"]]
    if len(rest):
        names.append(f"{len(rest)} other kernels")
        shares.append(rest["share_pct"].sum())
        launches.append(rest["launches"].sum())
    fig = go.Figure(
        go.Bar(
            orientation="h",
            y=names[::-1],
            x=shares[::-1],
            customdata=launches[::-1],
            hovertemplate="%{y}<br>%{x:.1f}% in %{customdata} launches<extra></extra>",
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="% of the profiled time",
        template="plotly_white",
        height=max(320, 24 * len(names) + 120),
    )
    return fig


def summary_bars(summary: pd.DataFrame, title: str) -> go.Figure:
    """The percentage rows of the summary (throughputs, occupancy, pipes) per launch."""
    rows = [r for r in summary.index if str(r).endswith("(%)")]
    values = _numeric_rows(summary.loc[rows])
    fig = go.Figure()
    for launch in values.columns:
        fig.add_bar(name=str(launch), x=rows, y=values[launch].to_numpy())
    fig.update_layout(
        barmode="group", title=title, yaxis_title="% of peak", template="plotly_white", height=460
    )
    return fig


def stall_bars(stalls: pd.DataFrame, title: str) -> go.Figure:
    """Stacked stall reasons per launch: cycles per issued instruction, and % of PC samples."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("Cycles per issued instruction", "% of PC samples")
    )
    launches = list(dict.fromkeys(stalls.columns.get_level_values(0)))
    for col, measure in enumerate(("cycles_per_issue", "share_pct"), start=1):
        for reason in stalls.index:
            y = [stalls.loc[reason, (launch, measure)] for launch in launches]
            fig.add_bar(
                name=reason,
                legendgroup=reason,
                showlegend=col == 1,
                x=[str(launch) for launch in launches],
                y=y,
                marker_color=STALL_COLOURS.get(reason, OTHER_COLOUR),
                hovertemplate=f"{reason}: %{{y:.2f}}<extra>%{{x}}</extra>",
                row=1,
                col=col,
            )
    fig.update_layout(
        barmode="stack",
        title=title,
        legend_title="stall reason",
        template="plotly_white",
        height=520,
    )
    return fig


def hotspot_bars(hotspots: pd.DataFrame, title: str) -> go.Figure:
    """Samples per hot line (or SASS instruction), hottest on top, coloured by top stall."""
    rows = hotspots.iloc[::-1]
    where = [
        f"{Path(f).name}:{line}" if level == "source" else address
        for f, line, level, address in zip(
            rows["file"], rows["line"], rows["level"], rows["address"]
        )
    ]
    labels = [f"{launch} | {w}" for launch, w in zip(rows["launch"], where)]
    fig = go.Figure()
    for reason in dict.fromkeys(rows["top_stall"]):
        pick = (rows["top_stall"] == reason).to_numpy()
        fig.add_bar(
            name=reason,
            orientation="h",
            y=[label for label, p in zip(labels, pick) if p],
            x=rows.loc[pick, "samples"].to_numpy(),
            customdata=rows.loc[pick, ["text", "share_pct"]].to_numpy(),
            marker_color=STALL_COLOURS.get(reason, OTHER_COLOUR),
            hovertemplate="%{customdata[0]}<br>%{x} samples (%{customdata[1]:.1f}%)<extra></extra>",
        )
    fig.update_layout(
        title=title,
        xaxis_title="PC samples",
        legend_title="top stall",
        template="plotly_white",
        height=max(360, 22 * len(rows) + 120),
        yaxis={"categoryorder": "array", "categoryarray": labels},
    )
    return fig


def occupancy_bars(occupancy: pd.DataFrame, title: str) -> go.Figure:
    """Theoretical against achieved occupancy per launch; hover names the limiter."""
    values = _numeric_rows(occupancy.loc[["Theoretical occupancy (%)", "Achieved occupancy (%)"]])
    launches = [str(c) for c in occupancy.columns]
    fig = go.Figure()
    for row, colour in zip(values.index, ("#bdbdbd", "#1f77b4")):
        fig.add_bar(
            name=row.removesuffix(" (%)"),
            x=launches,
            y=values.loc[row].to_numpy(),
            marker_color=colour,
            customdata=occupancy.loc["Limiter"].to_numpy(),
            hovertemplate="%{y:.1f}% (limited by %{customdata})<extra>%{x}</extra>",
        )
    fig.update_layout(
        barmode="group",
        title=title,
        yaxis_title="% of the SM's warps",
        template="plotly_white",
        height=440,
    )
    return fig
