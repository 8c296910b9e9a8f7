"""The report's experiment sections: sweeps ("Things that did not help") and A/Bs.

An experiment is judged against a baseline, so its tables put the baseline beside the change:
a sweep's effect range over token counts, an A/B's b / a with its interval. Sweeps and A/B runs
are named by their settings rather than their run ids, which say nothing to a reader.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from workbench.analysis.collection import Artifact, Collection
from workbench.report.cells import format_value
from workbench.report.page import ReportPage, display, short_status, sources
from workbench.report.sections_benchmarks import newest, scenario
from workbench.report.seed_tables import (
    BF16_ERROR,
    Section,
    artifacts,
    did_not_help,
    hybrid_ab,
    hybrid_ab_table,
    no_hybrid,
)

AB_COLUMNS = {"phase": "phase", "tokens": "tokens", "ms_a": "a (ms)", "ms_b": "b (ms)",
              "dense_ms_a": "a dense GEMM (ms)", "dense_ms_b": "b dense GEMM (ms)",
              "ratio": "b / a"}  # fmt: skip


WHERE_COLUMNS = {"ms_a": "a (ms)", "ms_b": "b (ms)",
                 "change_ms": "b - a (ms)", "change_pct": "b - a (%)"}  # fmt: skip


def _settings(settings: Mapping | None) -> str:
    """Parameter settings as `k=v` text in name order; `none` when there are none."""
    return ", ".join(f"{k}={v}" for k, v in sorted((settings or {}).items())) or "none"


def _arm(params: Mapping, arm: str) -> str:
    """An A/B arm's settings, and its code where the arms ran different code (`code=`: a
    commit's first 12 hex digits, a folder's name and digest, or the working tree)."""
    codes = params.get("code") or {}
    code = codes.get(arm, {})
    settings = _settings(params.get(arm))
    if code.get("code") == "commit":
        label = f"code=commit {code['commit'][:12]}"
    elif code.get("code") == "folder":
        label = f"code=folder {code.get('folder')} ({str(code.get('digest'))[:12]})"
    elif any(c.get("code") not in (None, "worktree") for c in codes.values()):
        label = "code=worktree"
    else:
        return settings
    return label if settings == "none" else f"{label}, {settings}"


def _sweep_name(item: Artifact) -> str:
    """A sweep's name: the kernel, the parameter swept and what was held fixed."""
    p = item.meta.get("params", {})
    return f"{p.get('kernel', '?')} {p.get('param', '?')} ({_settings(p.get('fixed'))})"


def _interval(low: object, high: object, unit: str) -> str:
    """A 95% interval as one cell, `0.98 – 1.02`, each end rounded for `unit`."""
    return "" if pd.isna(low) else f"{format_value(low, unit)} – {format_value(high, unit)}"


def write_sweeps(page: ReportPage, collection: Collection, section: Section) -> None:
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
        page.figure("sweep", item.result, name)
        shown = pd.DataFrame(
            {
                "value": rows["value"],
                "tokens": rows["tokens"],
                "status": rows["status"].map(short_status),
                "median (ms)": rows["ms"],
                "95% interval (ms)": [
                    _interval(lo, hi, "time") for lo, hi in zip(rows["ci_low"], rows["ci_high"])
                ],
                "registers": rows["regs"],
                "spills": rows["spills"],
            }
        )
        page.table(shown, f"{name}", sources([item]), index=False)


def _ab_runs(page: ReportPage, collection: Collection) -> None:
    """Each A/B run's rows: both arms' times, b / a with its interval, statuses when not ok
    (tokens per second, the same times per token, stay in the artifact)."""
    for item in artifacts(collection, "ab"):
        p = item.meta["params"]
        table = item.result.table()
        shown = table[[c for c in AB_COLUMNS if c in table]].rename(columns=AB_COLUMNS)
        shown["95% interval"] = [_interval(lo, hi, "ratio") for lo, hi in
                                 zip(table["ci_low"], table["ci_high"])]  # fmt: skip
        shown["significant"] = table["significant"]
        status = table[["status_a", "status_b"]].map(short_status)
        if (status != "ok").any().any():
            shown["status (a, b)"] = status["status_a"] + ", " + status["status_b"]
        caption = (f"{p.get('kernel', '?')} A/B: a = {_arm(p, 'a')}; b = {_arm(p, 'b')}; "
                   f"both: {_settings(p.get('fixed'))}")  # fmt: skip
        page.table(shown, caption, sources([item]), index=False)
        where = item.result.where()
        if not where.empty:
            part = {"part": "mean step's" if "phase" in where else "kernel (per call or layer)"}
            shown = where.rename(columns=WHERE_COLUMNS | part)
            page.table(shown, f"Where the change went: {caption}", sources([item]), index=False)
    if collection.of("ab"):
        page.text(
            "Profile A/Bs: ms is the median prefill chunk or decode step, each a sample paired "
            "across the arms (the same chunk did the same work); b / a is the ratio of their "
            "total time with a bootstrap 95% interval, significant when it excludes 1. Where "
            "the change went (runs since it was recorded): the mean step's kernel time by "
            "category, its gaps between kernels, and its total kernel time (the categories' "
            "sum), in each arm (the median over its runs), largest change first, the total "
            "last. Kernel A/Bs on a GPU likewise give each kernel's time per call (per layer "
            "for dense), from eager calls without the L2 flush, so their total is not the "
            "timed ms, and a launch that overlaps another counts its whole span."
        )


def write_hybrid(page: ReportPage, collection: Collection, section: Section) -> None:
    """W8A16 against the hybrid per scenario, from the newest dense benchmark that ran both
    (a later run may have skipped the A/B scenarios), then the A/B runs."""
    dense = newest(collection, "bench-dense", lambda rows: not hybrid_ab_table(rows).empty)
    if dense is not None:  # a row per scenario in tokens per second, and the error row
        table = hybrid_ab(dense)
        units = ["error" if row == BF16_ERROR else "rate" for row in table.index]
        shown = pd.DataFrame(index=pd.Index([scenario(i) for i in table.index], name=" "))
        for column in table.columns:
            ratio = column.startswith("hybrid /")
            shown[column] = [format_value(v, "ratio" if ratio else unit)
                             for v, unit in zip(table[column], units)]  # fmt: skip
        page.table(shown, "Dense GEMMs of all layers, tokens per second: W8A16 against the "
                   "hybrid", sources([dense]))  # fmt: skip
    elif artifacts(collection, "bench-dense"):
        page.absent(*no_hybrid(display(newest(collection, "bench-dense").path)))
    _ab_runs(page, collection)
