"""ipywidgets explorers for notebooks: controls that update plotly FigureWidgets in place.

Changing a control re-draws the figure's traces inside `batch_update()`, without re-running a
cell, so a user flips between runs, phases, metrics and decode steps while reading.
"""

from __future__ import annotations

from collections.abc import Mapping

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.analysis.tables import GAPS, TOTAL
from workbench.report.figures import CATEGORY_COLOURS, step_timeline
from workbench.results import ProfileResult

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
        fresh = step_timeline(rows, f"Decode step {self.step.value}") if len(rows) else go.Figure()
        with self.timeline.batch_update():
            self.timeline.data = []
            for trace in fresh.data:
                self.timeline.add_trace(trace)
            self.timeline.layout = fresh.layout

    def view(self) -> widgets.VBox:
        controls = widgets.HBox([self.run, self.phase, self.metric])
        return widgets.VBox([controls, self.bars, self.step, self.timeline])
