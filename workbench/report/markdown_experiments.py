"""The results document's experiment sections: sweeps ("Things that did not help") and A/Bs.

An experiment is judged against a baseline, so its tables put the baseline beside the change:
a sweep's effect range over token counts, an A/B's b / a with its interval. Sweeps and A/B runs
are named by their settings rather than their run ids, which say nothing to a reader.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from workbench.analysis.collection import Artifact, Collection
from workbench.report.markdown_benchmarks import newest, scenario
from workbench.report.markdown_page import MarkdownPage, cell, display, short_status, sources
from workbench.report.seed_tables import (
    BF16_ERROR,
    Section,
    artifacts,
    did_not_help,
    hybrid_ab,
    no_hybrid,
)


def _settings(settings: Mapping | None) -> str:
    """Parameter settings as `k=v` text in name order; `none` when there are none."""
    return ", ".join(f"{k}={v}" for k, v in sorted((settings or {}).items())) or "none"


def _sweep_name(item: Artifact) -> str:
    """A sweep's name: the kernel, the parameter swept and what was held fixed."""
    p = item.meta.get("params", {})
    return f"{p.get('kernel', '?')} {p.get('param', '?')} ({_settings(p.get('fixed'))})"


def write_sweeps(page: MarkdownPage, collection: Collection, section: Section) -> None:
    """Each sweep against its baseline, then each sweep's rows: time, interval, registers."""
    items = artifacts(collection, "sweep")
    names = {_sweep_name(item): item for item in items}
    table = did_not_help({name: item.result for name, item in names.items()})
    table = table[["sweep", "change", "effect", "failures"]].rename(
        columns={"effect": "effect across token counts"}
    )
    page.table(table, "Each sweep against its baseline (its first value): the effect range "
               "over token counts, and failures", sources(items), index=False)  # fmt: skip
    for name, item in names.items():
        rows = item.result.table()
        shown = pd.DataFrame(
            {
                "value": rows["value"],
                "tokens": rows["tokens"],
                "status": rows["status"].map(short_status),
                "median (ms)": rows["ms"],
                "95% interval (ms)": [
                    "" if pd.isna(lo) else f"{cell(lo, 3)} – {cell(hi, 3)}"
                    for lo, hi in zip(rows["ci_low"], rows["ci_high"])
                ],
                "registers": rows["regs"],
                "spills": rows["spills"],
            }
        )
        page.table(shown, f"{name}", sources([item]), digits=3, index=False, trim=False)


def _ab_runs(page: MarkdownPage, collection: Collection) -> None:
    """Each A/B run's rows: both arms' times, b / a with its interval, statuses when not ok."""
    for item in artifacts(collection, "ab"):
        p = item.meta["params"]
        table = item.result.table()
        columns = {"phase": "phase", "tokens": "tokens", "ms_a": "a (ms)", "ms_b": "b (ms)",
                   "tokens_per_s_a": "a (tokens/s)", "tokens_per_s_b": "b (tokens/s)",
                   "dense_ms_a": "a dense GEMM (ms)", "dense_ms_b": "b dense GEMM (ms)",
                   "ratio": "b / a"}  # fmt: skip
        shown = table[[c for c in columns if c in table]].rename(columns=columns)
        shown["95% interval"] = [
            "" if pd.isna(lo) else f"{lo:.3f} – {hi:.3f}"
            for lo, hi in zip(table["ci_low"], table["ci_high"])
        ]
        shown["significant"] = table["significant"]
        status = table[["status_a", "status_b"]].map(short_status)
        if (status != "ok").any().any():
            shown["status (a, b)"] = status["status_a"] + ", " + status["status_b"]
        caption = (f"{p.get('kernel', '?')} A/B: a = {_settings(p.get('a'))}; b = "
                   f"{_settings(p.get('b'))}; both: {_settings(p.get('fixed'))}")  # fmt: skip
        page.table(shown, caption, sources([item]),
                   digits={"b / a": 3, "a (ms)": 2, "b (ms)": 2, "a (tokens/s)": 1,
                           "b (tokens/s)": 1, "a dense GEMM (ms)": 2, "b dense GEMM (ms)": 2},
                   index=False)  # fmt: skip
    if collection.of("ab"):
        page.text(
            "Profile A/Bs: ms is the median prefill chunk or decode step, each a sample paired "
            "across the arms (the same chunk did the same work); b / a is the ratio of their "
            "total time with a bootstrap 95% interval, significant when it excludes 1."
        )


def write_hybrid(page: MarkdownPage, collection: Collection, section: Section) -> None:
    """The newest dense benchmark's W8A16 against the hybrid per scenario, then the A/B runs."""
    dense = newest(collection, "bench-dense")
    if dense is not None:
        table = hybrid_ab(dense)
        if table.empty:
            page.absent(*no_hybrid(display(dense.path)))
        else:
            shown = pd.DataFrame(index=pd.Index([scenario(i) for i in table.index], name=" "))
            for column in table.columns:
                shown[column] = [
                    f"{v:.3f}" if column.endswith("default") and column.startswith("hybrid /")
                    else f"{100 * v:.2f}%" if row == BF16_ERROR else cell(v, 1)
                    for row, v in zip(table.index, table[column])
                ]  # fmt: skip
            page.table(shown, "Dense GEMMs of all layers, tokens per second: W8A16 against the "
                       "hybrid", sources([dense]))  # fmt: skip
    _ab_runs(page, collection)
