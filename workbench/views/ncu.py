"""Nsight Compute reports and capture sets with their figures and pages: what
`workbench.load_ncu` and `workbench.ncu` return, and what a notebook loads.

The tables come from workbench.analysis (NcuReport, NcuCatalog), the drawing from
workbench.report.ncu_page; these subclasses only join the two, so the analysis stays free of
plotly and a user still calls `report.figure("stalls")` or `report.to_html(path)`. The report
module is imported when a figure or page is asked for, as in every view.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from workbench.analysis.ncu import NcuReport
from workbench.analysis.ncu_catalog import NcuCatalog

if TYPE_CHECKING:
    import plotly.graph_objects as go


class NcuResult(NcuReport):
    """An NcuReport that draws itself: `NcuResult.load(path)` reads a report as this class,
    and select() keeps it."""

    def figure(self, kind: str = "summary") -> go.Figure:
        """A plotly figure: "kernel_time", "summary", "stalls", "hotspots" or "occupancy"."""
        from workbench.report.ncu_page import ncu_figure

        return ncu_figure(self, kind)

    def to_html(self, path: str | Path, baseline: NcuReport | None = None) -> Path:
        """A self-contained page: every table with its figure, the change from `baseline`
        (another report; NcuReport.diff) if given, ncu's rules and the metadata."""
        from workbench.report.ncu_page import write_ncu_page

        return write_ncu_page(self, path, baseline)


class NcuCatalogResult(NcuCatalog):
    """An NcuCatalog that draws itself; `NcuCatalogResult.load(...)` reads each report as an
    NcuResult, so `catalog.reports[i].figure(...)` works too."""

    report_type = NcuResult

    def figure(self, kind: str, variant: str = "stock") -> go.Figure:
        """A plotly figure of the set: "seed" (the seed table's percentages), "stalls",
        "occupancy" or "hotspots"."""
        from workbench.report.ncu_page import catalog_figure

        return catalog_figure(self, kind, variant)


def load_ncu(path: str | Path) -> NcuResult:
    """Every profiled launch of an Nsight Compute report, checked, with figures and a page."""
    return NcuResult.load(path)
