"""Profiles with their figures and pages: the analysis results, drawn by `workbench.report`.

`workbench.analysis` holds the tables and never imports plotly; these subclasses add
`.figure()` and `.to_html()`, so a notebook user keeps one object per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from workbench.analysis import profile


class ProfileResult(profile.ProfileResult):
    """A profile (own run or external trace) with its figure and page."""

    def figure(self):
        """Stacked bar of category time: prefill total and mean decode step."""
        from workbench.report import profile_page

        return profile_page.profile_figure(self)

    def to_html(self, path: str | Path) -> Path:
        """A self-contained page: notes, tables, figures, top kernels and the metadata."""
        from workbench.report import profile_page

        return profile_page.write_profile_page(self, path)

    def compare(self, *others: profile.ProfileResult, labels: Sequence[str] | None = None):
        """This run and `others` side by side, with a figure and a page."""
        return Comparison([self, *others], labels)


class Comparison(profile.Comparison):
    """Several profiles side by side, like the seed study's "stock / + multi-row / + flat"."""

    def figure(self):
        from workbench.report import profile_page

        return profile_page.comparison_figure(self)

    def to_html(self, path: str | Path) -> Path:
        from workbench.report import profile_page

        return profile_page.write_comparison_page(self, path)


def view(result: profile.ProfileResult) -> ProfileResult:
    """`result` with its figure and page: the same frames, not a copy, and a kernel table not
    read yet stays unread (the view reads it when a method needs it)."""
    viewed = ProfileResult.__new__(ProfileResult)
    viewed.__dict__.update(vars(result))
    viewed._answers = dict(result._answers)
    return viewed


def load(path: str | Path) -> ProfileResult:
    """A profile from its run directory under `raw/`, without a GPU and without torch."""
    return view(profile.load(path))


def load_trace(path: str | Path, rules=(), label: str = "") -> ProfileResult:
    """An external torch.profiler Chrome trace (vLLM, SGLang, HF...) as a profile.

    `rules` go ahead of the default rules, so a user can claim kernels for a category.
    """
    return view(profile.load_trace(path, rules, label))
