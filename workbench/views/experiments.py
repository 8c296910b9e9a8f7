"""Sweeps and A/B runs with their figures and pages (see `workbench.views.profile`)."""

from __future__ import annotations

from pathlib import Path

from workbench.analysis import experiments


class SweepResult(experiments.SweepResult):
    """A sweep with its figure and page."""

    def figure(self):
        """ms against tokens, one line per value, the median's 95% interval as a band."""
        from workbench.report import experiment_figures

        return experiment_figures.sweep_figure(self)

    def to_html(self, path: str | Path, baseline_value=None) -> Path:
        """A self-contained page: the figure, the table, optionally "did not help"."""
        from workbench.report import experiment_figures

        return experiment_figures.write_sweep_page(self, path, baseline_value)


def view_sweep(result: experiments.SweepResult) -> SweepResult:
    """`result` with its figure and page (the same rows, not a copy)."""
    return SweepResult(result.meta, result.rows)


def load_sweep(run_dir: str | Path) -> SweepResult:
    """A sweep from its run directory, without a GPU or torch."""
    return view_sweep(experiments.load_sweep(run_dir))
