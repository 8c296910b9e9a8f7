"""plotly figures and pages of experiments: sweeps as lines with interval bands across token
counts, benchmarks as lines per kernel."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from workbench.analysis.experiments import SweepResult
from workbench.report.html import HtmlPage


def sweep_lines(table: pd.DataFrame, param: str, title: str) -> go.Figure:
    """ms against tokens (log axes: token counts span 1 to 33863), one line per value, with the
    median's 95% interval as a shaded band, so overlapping bands read as "no difference".
    Configurations without a time (wrong, timeout, crash...) leave gaps."""
    fig = go.Figure()
    timed = table[table["ms"].notna()]
    for i, (value, group) in enumerate(timed.groupby("value", sort=False)):
        colour = qualitative.Plotly[i % len(qualitative.Plotly)]
        group = group.sort_values("tokens")
        band_x = list(group["tokens"]) + list(group["tokens"])[::-1]
        band_y = list(group["ci_high"]) + list(group["ci_low"])[::-1]
        fig.add_scatter(x=band_x, y=band_y, fill="toself", fillcolor=colour, opacity=0.2,
                        line={"width": 0}, hoverinfo="skip", showlegend=False,
                        legendgroup=str(value))  # fmt: skip
        fig.add_scatter(x=group["tokens"], y=group["ms"], mode="lines+markers",
                        name=f"{param}={value}", legendgroup=str(value),
                        line={"color": colour}, customdata=group[["ci_low", "ci_high", "n"]],
                        hovertemplate="%{x} tokens: %{y:.4f} ms<br>95% CI %{customdata[0]:.4f}"
                        "-%{customdata[1]:.4f} (n=%{customdata[2]})<extra></extra>")  # fmt: skip
    fig.update_xaxes(type="log", title="tokens")
    fig.update_yaxes(type="log", title="ms (median, 95% interval)")
    fig.update_layout(title=title, template="plotly_white")
    return fig


def bench_lines(
    table: pd.DataFrame,
    title: str,
    keys: tuple[str, ...],
    x: str = "tokens",
    y: str = "ms",
    y_title: str = "ms (median)",
) -> go.Figure:
    """A benchmark's `y` (ms) against its size column `x` (tokens, or M rows; log axes), one
    line per combination of `keys` present in the table (e.g. variant, weight format,
    routing); rows without a value leave gaps."""
    present = [k for k in keys if k in table]
    timed = table[pd.to_numeric(table[y], errors="coerce").notna()]
    names = timed[present].astype(str).agg(" ".join, axis=1) if present else "all"
    fig = go.Figure()
    for label, group in timed.assign(line=names).groupby("line", sort=False):
        group = group.sort_values(x)
        fig.add_scatter(
            x=group[x],
            y=group[y],
            mode="lines+markers",
            name=label,
            hovertemplate=f"%{{x}} {x}: %{{y:.4g}} {y_title}<extra>{label}</extra>",
        )
    fig.update_xaxes(type="log", title=x)
    fig.update_yaxes(type="log", title=y_title)
    fig.update_layout(title=title, template="plotly_white", height=480)
    return fig


def floor_lines(
    table: pd.DataFrame, title: str, keys: tuple[str, ...], x: str = "tokens"
) -> go.Figure:
    """Each row's time over its roofline floor (its bytes at the copy bandwidth or its FLOPs at
    the tensor-core peak, both measured in the run) against its size, the floor itself dashed
    at 1: where a kernel runs near what the hardware allows, and where it falls away, which a
    plot of milliseconds hides behind the sizes' own growth."""
    fig = bench_lines(table, title, keys, x, "ratio_to_floor", "× roofline floor")
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey")
    # on a log axis an annotation's y is log10 of the value: 0 is the floor's 1
    fig.add_annotation(text="the floor", x=1, xref="paper", xanchor="right", y=0, yref="y",
                       yanchor="bottom", showarrow=False)  # fmt: skip
    return fig


def sweep_figure(result: SweepResult) -> go.Figure:
    """A sweep's ms against tokens, one line per value (see `sweep_lines`)."""
    return sweep_lines(result.table(), result.param, f"{result.meta['params']['kernel']} sweep")


def write_sweep_page(result: SweepResult, path: str | Path, baseline_value=None) -> Path:
    """A self-contained page: the figure, the table, optionally "did not help"."""
    page = HtmlPage(f"Sweep of {result.param}").heading("Timings").figure(sweep_figure(result))
    page.table(result.table(), caption="ms: median; ci: the median's 95% interval", digits=4)
    if baseline_value is not None:
        page.heading("Things that did not help").table(result.did_not_help(baseline_value))
    return page.metadata(result.meta).write(path)
