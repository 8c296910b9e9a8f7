"""ipywidgets explorers for notebooks: controls that update plotly FigureWidgets in place.

Changing a control re-draws the figure's traces inside `batch_update()`, without re-running a
cell, so a user flips between runs, phases, metrics and decode steps (ProfileExplorer), ncu
variants, token counts, launches and stall measures (NcuExplorer), or sweeps, token counts and
metrics (SweepExplorer) while reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.analysis.profile import ProfileResult
from workbench.analysis.tables import GAPS, TOTAL
from workbench.report.experiment_figures import sweep_figure
from workbench.report.figures import CATEGORY_COLOURS, step_timeline
from workbench.report.ncu_figures import OTHER_COLOUR, STALL_COLOURS

if TYPE_CHECKING:  # the ncu and sweep explorers' inputs; ncu_report is imported on use only
    from workbench.analysis.experiments import SweepResult
    from workbench.analysis.ncu_catalog import NcuCatalog

METRICS = {
    "prefill": ("time_ms", "share_pct", "kernels"),
    "decode": ("mean_ms", "max_ms", "std_ms", "kernels_per_step"),
}


class ProfileExplorer:
    """Category bars of one run and phase, and the timeline of one decode step."""

    def __init__(self, runs: Mapping[str, ProfileResult]):
        self.runs = dict(runs)
        first = next(iter(self.runs.values()))
        self.run = widgets.Dropdown(options=list(self.runs), description="run")
        self.phase = widgets.ToggleButtons(options=first.phases, description="phase")
        self.metric = widgets.Dropdown(description="metric")
        self.step = widgets.IntSlider(description="decode step", min=0, continuous_update=False)
        self.bars = go.FigureWidget(
            go.Bar(marker_color=[]), layout={"template": "plotly_white", "height": 380}
        )
        self.timeline = go.FigureWidget(layout={"template": "plotly_white", "height": 420})
        self.run.observe(self._on_run, names="value")
        self.phase.observe(self._on_phase, names="value")
        self.metric.observe(lambda _: self._draw_bars(), names="value")
        self.step.observe(lambda _: self._draw_timeline(), names="value")
        self._on_run()

    @property
    def current(self) -> ProfileResult:
        return self.runs[self.run.value]

    def _on_run(self, _=None) -> None:
        run = self.current
        self.phase.options = run.phases
        steps = run.kernels.loc[run.kernels["phase"] == "decode", "step"].dropna()
        self.step.max = int(steps.max()) if len(steps) else 0
        self._on_phase()
        self._draw_timeline()

    def _on_phase(self, _=None) -> None:
        options = METRICS.get(self.phase.value, ("time_ms",))
        self.metric.options = options
        if self.metric.value not in options:
            self.metric.value = options[0]
        self._draw_bars()

    def table(self):
        run, phase = self.current, self.phase.value
        return run.decode() if phase == "decode" else run.by_phase(phase)

    def _draw_bars(self) -> None:
        if self.metric.value is None:
            return
        rows = self.table().drop(index=[TOTAL, GAPS], errors="ignore")
        with self.bars.batch_update():
            bar = self.bars.data[0]
            bar.x = list(rows.index)
            bar.y = rows[self.metric.value].to_list()
            bar.marker.color = [CATEGORY_COLOURS.get(c, "#999999") for c in rows.index]
            self.bars.layout.title = f"{self.run.value}: {self.phase.value}, {self.metric.value}"

    def _draw_timeline(self) -> None:
        run = self.current
        rows = run.kernels[
            (run.kernels["phase"] == "decode") & (run.kernels["step"] == self.step.value)
        ]
        title = f"Decode step {self.step.value}"
        if run.ranks:  # one GPU's kernels: the ranks' streams would interleave on one strip
            rows = rows[rows["rank"] == run.ranks[0]]
            title += f", rank {run.ranks[0]}"
        fresh = step_timeline(rows, title) if len(rows) else go.Figure()
        with self.timeline.batch_update():
            self.timeline.data = []
            for trace in fresh.data:
                self.timeline.add_trace(trace)
            self.timeline.layout = fresh.layout

    def view(self) -> widgets.VBox:
        controls = widgets.HBox([self.run, self.phase, self.metric])
        return widgets.VBox([controls, self.bars, self.step, self.timeline])


STALL_MEASURES = ("cycles_per_issue", "share_pct")
STATUS_COLOURS = {"ok": "#1f77b4", "spills": "#ff7f0e"}  # any failure: red
FAILED_COLOUR = "#d62728"


def _offer(control: widgets.ValueWidget, options: list) -> None:
    """Give a selection control new options, keeping its value where it is still offered (a
    control whose options change has no value in ipywidgets 8 until one is set)."""
    keep = control.value
    control.options = options
    values = [o[1] if isinstance(o, tuple) else o for o in options]
    if values:
        control.value = keep if keep in values else values[0]


def _replace_traces(target: go.FigureWidget, fresh: go.Figure) -> None:
    """Swap a FigureWidget's traces and layout for a fresh figure's, in one update."""
    with target.batch_update():
        target.data = []
        for trace in fresh.data:
            target.add_trace(trace)
        target.layout = fresh.layout


class NcuExplorer:
    """Nsight Compute reports of one capture set: pick a variant, a token count, a launch and a
    stall measure; the stall, hot-spot and cross-variant figures update in place."""

    def __init__(self, catalog: NcuCatalog):
        self.catalog = catalog
        from workbench.analysis.ncu_catalog import SEED_ROWS, TOP_STALL

        numeric = [row for row in SEED_ROWS if row != TOP_STALL]
        self.variant = widgets.Dropdown(options=catalog.variants, description="variant")
        self.tokens = widgets.ToggleButtons(description="tokens")
        self.launch = widgets.Dropdown(description="launch")
        self.metric = widgets.Dropdown(options=STALL_MEASURES, description="stall metric")
        self.summary_row = widgets.Dropdown(options=numeric, description="compare")
        layout = {"template": "plotly_white", "height": 400}
        self.stalls = go.FigureWidget(go.Bar(orientation="h"), layout=layout)
        self.hotspots = go.FigureWidget(go.Bar(orientation="h"), layout=layout)
        self.compare = go.FigureWidget(layout=layout)
        self.variant.observe(self._on_variant, names="value")
        self.tokens.observe(self._on_tokens, names="value")
        self.launch.observe(lambda _: self._draw_launch(), names="value")
        self.metric.observe(lambda _: self._draw_launch(), names="value")
        self.summary_row.observe(lambda _: self._draw_compare(), names="value")
        self._on_variant()

    def _on_variant(self, _=None) -> None:
        sizes = self.catalog.tokens(self.variant.value)
        _offer(self.tokens, [str(t) for t in sizes] or ["all"])
        self._on_tokens()

    def _on_tokens(self, _=None) -> None:
        tokens = None if self.tokens.value in (None, "all") else int(self.tokens.value)
        self._main = self.catalog.main(self.variant.value, tokens)
        _offer(self.launch, [(x.column, i) for i, x in enumerate(self._main)])
        self._draw_launch()
        self._draw_compare()

    @property
    def current(self):
        """The selected main launch (a workbench.analysis.ncu_catalog.Launch)."""
        return self._main[self.launch.value or 0]

    def _draw_launch(self) -> None:
        launch = self.current
        stalls = launch.report.stalls()
        measure = self.metric.value
        if not stalls.empty:
            values = stalls[(launch.label, measure)].dropna().sort_values()
        else:
            values = stalls.iloc[:, :0].sum(axis=1)
        with self.stalls.batch_update():
            bar = self.stalls.data[0]
            bar.y, bar.x = list(values.index), values.to_list()
            bar.marker.color = [STALL_COLOURS.get(r, OTHER_COLOUR) for r in values.index]
            self.stalls.layout.title = f"{launch.column} ({launch.variant}): stalls, {measure}"
        hot = launch.report.hotspots(10, launch=launch.label).iloc[::-1]
        where = [
            f"{Path(f).name}:{line}" if level == "source" else address
            for f, line, level, address in zip(hot["file"], hot["line"], hot["level"],
                                               hot["address"])
        ]  # fmt: skip
        with self.hotspots.batch_update():
            bar = self.hotspots.data[0]
            bar.y, bar.x = where, hot["samples"].to_list()
            bar.customdata = hot[["text", "top_stall"]].to_numpy()
            bar.hovertemplate = "%{customdata[0]}<br>%{x} samples, top stall %{customdata[1]}"
            bar.marker.color = [STALL_COLOURS.get(r, OTHER_COLOUR) for r in hot["top_stall"]]
            self.hotspots.layout.title = f"{launch.column} ({launch.variant}): hot lines"

    def _draw_compare(self) -> None:
        """The chosen summary row for every variant's main launches at the chosen tokens."""
        tokens = None if self.tokens.value in (None, "all") else int(self.tokens.value)
        fresh = go.Figure(layout={"template": "plotly_white", "barmode": "group", "height": 400})
        for variant in self.catalog.variants:
            main = [x for x in self.catalog.main(variant) if tokens in (None, x.tokens)]
            if not main:
                continue
            values = [x.report.summary().loc[self.summary_row.value, x.label] for x in main]
            fresh.add_bar(name=variant, x=[x.role for x in main], y=values)
        fresh.update_layout(title=f"{self.summary_row.value}, {self.tokens.value} tokens")
        _replace_traces(self.compare, fresh)

    def view(self) -> widgets.VBox:
        top = widgets.HBox([self.variant, self.tokens])
        second = widgets.HBox([self.launch, self.metric])
        plots = widgets.HBox([self.stalls, self.hotspots])
        return widgets.VBox([top, second, plots, self.summary_row, self.compare])


SWEEP_METRICS = ("ms", "change_pct", "regs", "spills", "n")


class SweepExplorer:
    """Sweeps: pick a sweep, a token count and a metric; the per-value bars (with the median's
    95% interval for ms) and the sweep's interval bands across token counts update in place."""

    def __init__(self, sweeps: Mapping[str, SweepResult]):
        self.sweeps = dict(sweeps)
        self.artifact = widgets.Dropdown(options=list(self.sweeps), description="sweep")
        self.tokens = widgets.Dropdown(description="tokens")
        self.metric = widgets.Dropdown(options=SWEEP_METRICS, description="metric")
        self.bars = go.FigureWidget(go.Bar(), layout={"template": "plotly_white", "height": 380})
        self.bands = go.FigureWidget(layout={"template": "plotly_white", "height": 420})
        self.artifact.observe(self._on_artifact, names="value")
        self.tokens.observe(lambda _: self._draw_bars(), names="value")
        self.metric.observe(lambda _: self._draw_bars(), names="value")
        self._on_artifact()

    @property
    def current(self) -> SweepResult:
        return self.sweeps[self.artifact.value]

    def _on_artifact(self, _=None) -> None:
        table = self.current.table()
        _offer(self.tokens, sorted(int(t) for t in table["tokens"].unique()))
        _replace_traces(self.bands, sweep_figure(self.current))
        self._draw_bars()

    def rows(self):
        """The selected token count's rows, with change_pct against the first value."""
        table = self.current.table()
        rows = table[table["tokens"] == self.tokens.value].copy()
        base = rows["ms"].iloc[0] if len(rows) else float("nan")
        rows["change_pct"] = 100 * (rows["ms"] / base - 1)
        return rows

    def _draw_bars(self) -> None:
        if self.tokens.value is None:
            return
        rows, metric = self.rows(), self.metric.value
        with self.bars.batch_update():
            bar = self.bars.data[0]
            bar.x = [f"{self.current.param}={v}" for v in rows["value"]]
            bar.y = rows[metric].to_list()
            bar.text = [s if s not in STATUS_COLOURS else "" for s in rows["status"]]
            bar.marker.color = [STATUS_COLOURS.get(s, FAILED_COLOUR) for s in rows["status"]]
            bar.error_y = (
                {"type": "data", "symmetric": False,
                 "array": (rows["ci_high"] - rows["ms"]).to_list(),
                 "arrayminus": (rows["ms"] - rows["ci_low"]).to_list()}
                if metric == "ms" else {"visible": False}
            )  # fmt: skip
            self.bars.layout.title = (
                f"{self.artifact.value}: {metric} at {self.tokens.value} tokens"
                + (" (vs the first value)" if metric == "change_pct" else "")
            )

    def view(self) -> widgets.VBox:
        controls = widgets.HBox([self.artifact, self.tokens, self.metric])
        return widgets.VBox([controls, self.bars, self.bands])
