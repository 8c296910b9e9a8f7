"""The report's benchmark sections: dense GEMMs, MoE kernels, sparse attention.

A benchmark run is a long table, one row per kernel, variant and size; a reader compares
variants at one size, so each table here is pivoted wide (a row per size, a column per variant
and measure) with a row's status riding in its time's cell, and the columns a reader does not
compare (spread, repeats, floors in ms) stay in the artifact. Runs of one kind differ in what
they cover, so the MoE table takes each configuration from the newest run that measured it
(`seed_tables.newest_rows`). The dense tables come from the newest whole run (with the A/B
table), and each newer partial run gets a table of its own, so a ratio never mixes runs; the
attention tables come from the newest run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pandas as pd

from workbench.analysis.best_peer import ours_vs_best_peer
from workbench.analysis.collection import Artifact, Collection
from workbench.analysis.targets import DENSE_LAYER
from workbench.report.cells import format_value
from workbench.report.page import ReportPage, short_status, sources
from workbench.report.seed_tables import (
    DENSE_AB,
    Section,
    artifacts,
    bench_rows,
    dense_ab_table,
    newest_rows,
    started,
)

MOE_ORDER = ("stock", "multirow", "flat", "padded")
MOE_OURS = (
    "moe",
    "torch_grouped_mm",
    "torch_grouped_mm_bare",
    "cublas_loop",
)  # bench_moe.BASELINES
DENSE_ORDER = ("bf16", "w8a16", "w8a8", "hybrid")
ATTENTION_ORDER = ("torch", "triton")
MOE_SHOWN = 12  # rows of a MoE table before the rest fold away: the decode sizes 1 and 6
ACCURACY = {  # bench dense's accuracy and compile facts, each the most over all M
    "rel_error": "rel. error vs the weights it holds (max)",
    "error_vs_bf16": "rel. error vs bf16 weights (max)",
    "regs": "registers (max)",
    "spills": "spills (max)",
}


def newest(
    collection: Collection, kind: str, has: Callable[[pd.DataFrame], bool] | None = None
) -> Artifact | None:
    """The newest artifact of a kind (by the date its capture started) whose benchmark rows
    `has` what a table needs: a run that skipped the A/B scenarios must not hide the A/B
    table an older run holds."""
    items = [item for item in sorted(artifacts(collection, kind), key=started)
             if has is None or has(bench_rows(item))]  # fmt: skip
    return items[-1] if items else None


def _holds(kernel: str) -> Callable[[pd.DataFrame], bool]:
    """Whether benchmark rows hold rows of `kernel`."""
    return lambda rows: bool((rows["kernel"] == kernel).any())


def scenario(name: str) -> str:
    """bench dense's scenario names as headers: `prefill-46000-4` -> `prefill 46,000, 4 streams`."""
    found = re.fullmatch(r"(decode|prefill)(?:-(\d+))?-(\d+)", str(name))
    if not found:
        return str(name)
    phase, prompt, streams = found.groups()
    size = f" {int(prompt):,}" if prompt else ""
    return f"{phase}{size}, {streams} stream{'s' if streams != '1' else ''}"


def run_conditions(item: Artifact) -> str:
    """The device ceilings a benchmark measured beside its rows, and what NVML read of the GPU
    while they and its rows were timed (runs before 2026-12-04T05:02 have no such reading), as
    text."""
    c = item.meta.get("ceilings") or {}
    parts = []
    if {"copy_bytes_per_s", "bf16_flops", "fp8_flops"} <= set(c):
        parts.append(f"copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, cuBLAS bf16 "
                     f"{c['bf16_flops'] / 1e12:.0f} TFLOP/s, FP8 {c['fp8_flops'] / 1e12:.0f} "
                     "TFLOP/s measured in the same run")  # fmt: skip
    gpu_state = item.meta.get("gpu_state") or {}
    at_ceilings = (gpu_state.get("ceilings") or {}).get("description")
    if at_ceilings:
        parts.append(f"the GPU while the ceilings were timed: {at_ceilings}")
    if gpu_state.get("description"):
        parts.append(f"the GPU while the rows were timed: {gpu_state['description']}")
    return "; ".join(parts)


def _timed(ms: object, status: object) -> object:
    """A time, or with its status when that is not `ok` (`3.58 (spills)`), or the status alone
    when the row was not timed."""
    note = "" if status is None or pd.isna(status) or status == "ok" else short_status(status)
    if ms is None or pd.isna(ms):
        return note
    return f"{format_value(ms, 'time')} ({note})" if note else ms


def _wide(
    rows: pd.DataFrame, index: Sequence[str], across: str, order: Sequence[str], measures: dict
) -> pd.DataFrame:
    """One row per `index`, and per value of `across` (in `order`) a column per measure:
    `measures` maps a column of `rows` to its header's suffix (which names the unit); `ms`
    cells carry the row's status when it is not ok."""
    out: dict[tuple, dict[str, object]] = {}
    for record in rows.to_dict("records"):
        line = out.setdefault(tuple(record[k] for k in index), {})
        for column, suffix in measures.items():
            value = record.get(column)
            line[f"{record[across]} {suffix}"] = (
                _timed(value, record.get("status")) if column == "ms" else value
            )
    present = list(dict.fromkeys(str(v) for v in rows[across]))
    values = [v for v in order if v in present] + [v for v in present if v not in order]
    headers = [f"{v} {suffix}" for v in values for suffix in measures.values()]
    frame = pd.DataFrame.from_dict(out, orient="index").reindex(columns=headers)
    frame.index = pd.MultiIndex.from_tuples(list(out), names=list(index))
    return frame


def _covered(rows: pd.DataFrame, size: str) -> Callable[[Artifact], str]:
    """A source detail: the sizes a run contributed to `rows`, and its ceilings."""

    def detail(item: Artifact) -> str:
        sizes = sorted(set(rows.loc[rows["run"] == str(item.path), size]))
        return f"{size} {', '.join(f'{s:,}' for s in sizes)}; {run_conditions(item)}"

    return detail


def _without_unloaded_peers(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(bench-moe rows without those of peers a run could not load, one such row for each peer
    no run timed, with the newest run's reason).

    An unloaded peer's row has no weight format and no time: kept, it became a column group of
    its own in the MoE table. Rows run oldest to newest, and newest_rows numbers them afresh,
    so dropping by index takes these rows only."""
    if rows.empty:
        return rows, rows
    unloaded = rows[rows["weight_dtype"].isna() & rows["ms"].isna()]
    kept = rows.drop(unloaded.index)
    never = unloaded[~unloaded["kernel"].isin(kept["kernel"])]
    return kept, never.drop_duplicates("kernel", keep="last")


def _floor_figure(page: ReportPage, rows: pd.DataFrame, title: str, keys: tuple[str, ...],
                  x: str) -> None:  # fmt: skip
    """The rows' time over their roofline floor against size, where they have floors (the
    runs before floors were recorded have none)."""
    if (
        "ratio_to_floor" in rows
        and pd.to_numeric(rows["ratio_to_floor"], errors="coerce").notna().any()
    ):
        page.figure("floor", rows, title, keys, x)


def write_moe(page: ReportPage, collection: Collection, section: Section) -> None:
    """Per routing, each MoE scheduler and weight format by token count: time, × the HBM
    floor, TFLOP/s."""
    items = artifacts(collection, "bench-moe")
    rows, never = _without_unloaded_peers(
        newest_rows(items, ("kernel", "variant", "weight_dtype", "tokens", "routing"))
    )
    if rows.empty:
        page.absent("a benchmark table in the bench-moe runs", section.command)
        return
    rows["kernel"] = [
        v if k == "moe" else f"{k} (peer)" for k, v in zip(rows["kernel"], rows["variant"])
    ]
    rows["order"] = [MOE_ORDER.index(k) if k in MOE_ORDER else len(MOE_ORDER) for k in
                     rows["kernel"]]  # fmt: skip
    rows = rows.sort_values(["tokens", "order", "kernel"], kind="stable")
    used = [item for item in items if str(item.path) in set(rows["run"])]
    page.text(
        "Each MoE scheduler and weight format at the TP2-rank shape, checked against the fp32 "
        "reference before it is timed; decode sizes (up to 48 tokens) as CUDA graph replays, "
        "the L2 flushed between repeats. ms is the median; × floor is the time over the floor "
        "the run recorded: the roofline (bytes at the copy bandwidth or FLOPs at the bf16 "
        "peak, both measured in the same run) for runs since it was introduced, the touched "
        "experts' weight bytes alone before, which only means something at decode sizes. "
        "Each configuration comes from the newest run that measured it."
    )
    measures = {"ms": "(ms)", "ratio_to_floor": "× floor", "tflops": "TFLOP/s"}
    for routing in dict.fromkeys(rows["routing"]):
        part = rows[rows["routing"] == routing]
        page.figure("bench", part, f"MoE, {routing} routing", ("kernel", "weight_dtype"), "tokens")
        _floor_figure(page, part, f"MoE, {routing} routing: time over the roofline floor",
                      ("kernel", "weight_dtype"), "tokens")  # fmt: skip
        table = _wide(part, ["tokens", "kernel"], "weight_dtype", ("bf16", "fp8", "int4"), measures)
        page.table(table, f"MoE, {routing} routing", sources(used, _covered(rows, "tokens")),
                   head=MOE_SHOWN)  # fmt: skip
    if not never.empty:
        named = [f"`{k}` ({short_status(s)})" for k, s in zip(never["kernel"], never["status"])]
        page.text(f"Peers no run measured: {', '.join(named)}.")
    _write_moe_best_peer(page, collection)


def _write_moe_best_peer(page: ReportPage, collection: Collection) -> None:
    """Ours against the fastest peer, from the newest run with a peer besides the torch
    baselines: both sides measured in one run, so the ratio is one run's."""
    item = newest(collection, "bench-moe", lambda r: bool((~r["kernel"].isin(MOE_OURS)).any()))
    if item is None:
        return
    rows = bench_rows(item)
    named = rows.assign(name=[v if k == "moe" else k for k, v in zip(rows["kernel"],
                                                                    rows["variant"])])  # fmt: skip
    named["name"] = named["name"] + " " + named["weight_dtype"].astype(str)
    best = ours_vs_best_peer(named, ["routing", "tokens"], rows["kernel"] == "moe")
    if not best.empty:
        where = sources([item], _covered(named.assign(run=str(item.path)), "tokens"))
        page.table(best, "MoE: our fastest scheduler and format against the fastest peer in "
                   "one run (any format; the torch baseline counts as a peer)", where)  # fmt: skip


def _peers(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """bench dense's peer rows (other libraries' kernels at the same M) that were timed, a row
    per M and peer, and the peers that were not (with why: `missing-peer`, an error)."""
    timed = rows[rows["ms"].notna()]
    table = pd.DataFrame(
        {
            "M": timed["m"],
            "peer": timed["kernel"],
            "format": timed["variant"],
            "median (ms)": timed["ms"],
            "× floor": timed.get("ratio_to_floor"),
            "rel. error": timed.get("rel_error"),
        }
    ).sort_values(["M", "peer"], kind="stable")
    untimed = rows[rows["ms"].isna()].drop_duplicates("kernel")
    why = [f"`{k}` ({short_status(s)})" for k, s in zip(untimed["kernel"], untimed["status"])]
    return table, why


def _dense_named(rows: pd.DataFrame) -> pd.DataFrame:
    """bench dense rows with a `name`: our backend (the variant) for the layer rows, else the
    peer (the kernel)."""
    return rows.assign(name=rows["kernel"].where(rows["kernel"] != DENSE_LAYER, rows["variant"]))


def _newer_partial_runs(page: ReportPage, collection: Collection, main: Artifact) -> None:
    """Each run newer than `main` (they skipped the A/B table: a peer that compiles per shape
    gets a run of its own at the sizes where it competes), as one table of its own: our
    backends and the peers it timed, all from that run, so its ratios stay within one run."""
    later = [item for item in artifacts(collection, "bench-dense") if started(item) > started(main)]
    for item in sorted(later, key=started):
        rows = bench_rows(item)
        timed = rows[(rows["kernel"] != DENSE_AB) & rows["ms"].notna()]
        if timed.empty:
            continue
        named = _dense_named(timed)
        order = [v for v in DENSE_ORDER if v in set(named["name"])]
        order += [n for n in named["name"].unique() if n not in order]
        table = named.pivot_table(index="m", columns="name", values="ms")[order]
        page.table(table.rename_axis("M").add_suffix(" (ms)"), "A newer run without the A/B "
                   "table: our backends and the peers it timed, in that run",
                   sources([item], run_conditions))  # fmt: skip
        _, untimed = _peers(rows[~rows["kernel"].isin([DENSE_AB, DENSE_LAYER])])
        if untimed:
            page.text(f"Peers not measured in that run: {', '.join(untimed)}.")


def dense_run(collection: Collection) -> Artifact | None:
    """The bench dense run the dense tables come from: the newest whole run (the one that
    holds the A/B table), else the newest that timed our layer kernels."""
    return newest(collection, "bench-dense", _holds(DENSE_AB)) or newest(
        collection, "bench-dense", _holds(DENSE_LAYER)
    )


def write_dense(page: ReportPage, collection: Collection, section: Section) -> None:
    """The seed's backend table (tokens per second per scenario), one layer's projections at
    each M against its roofline floor, the peers at the same M, and each backend's accuracy,
    from `dense_run`; then each newer run on its own."""
    ab_run = newest(collection, "bench-dense", _holds(DENSE_AB))
    if ab_run is not None:
        ab = dense_ab_table(bench_rows(ab_run))
        ab.index = pd.Index([f"{v} (cuBLAS)" if v == "bf16" else v for v in ab.index],
                            name="backend")  # fmt: skip
        ab.columns = [f"{scenario(c)} (tokens/s)" for c in ab.columns]
        page.table(ab, "The seed's backend table: dense GEMMs of all layers, tokens per second",
                   sources([ab_run], run_conditions))  # fmt: skip
    item = dense_run(collection)
    if item is None:
        return
    rows = bench_rows(item)
    layer, where = rows[rows["kernel"] == DENSE_LAYER], sources([item], run_conditions)
    page.figure("bench", layer, "Dense projections of one layer", ("variant",), "m")
    named = _dense_named(rows)
    _floor_figure(page, named[named["m"].isin(layer["m"])], "Dense projections of one layer, "
                  "the peers beside: time over the roofline floor", ("name",), "m")  # fmt: skip
    page.table(_wide(layer, ["m"], "variant", DENSE_ORDER, {"ms": "(ms)",
               "ratio_to_floor": "× floor"}).rename_axis("M"), "All dense projections of one "
               "TP2-rank layer at M rows: median ms, and × the roofline floor (bytes or FLOPs)",
               where)  # fmt: skip
    peers, untimed = _peers(rows[~rows["kernel"].isin([DENSE_AB, DENSE_LAYER])])
    if not peers.empty:
        page.table(peers, "Peers at the same M: other libraries' kernels for the layer's "
                   "projections", where, index=False)  # fmt: skip
    if untimed:
        page.text(f"Peers not measured in this run: {', '.join(untimed)}.")
    fp8 = rows[(rows["kernel"] != DENSE_AB) & ~rows["variant"].isin(["bf16", "w4a16-group128"])]
    named = _dense_named(fp8)
    best = ours_vs_best_peer(named, ["m"], fp8["kernel"] == DENSE_LAYER)
    if not best.empty:
        page.table(best.rename_axis("M"), "Our fastest FP8 backend against the fastest FP8 "
                   "peer at each M", where)  # fmt: skip
    _newer_partial_runs(page, collection, item)
    present = [c for c in ACCURACY if c in layer]
    if not present:
        return
    accuracy = layer.groupby("variant", sort=False)[present].max()
    order = [v for v in DENSE_ORDER if v in accuracy.index]
    accuracy = accuracy.reindex(order + [v for v in accuracy.index if v not in order])
    shown = accuracy.rename(columns=ACCURACY).rename_axis("backend")
    page.table(shown, "Accuracy against an fp32 GEMM, over all M", where)


def write_attention(page: ReportPage, collection: Collection, section: Section) -> None:
    """The indexer and sparse attention per scenario: time and × the floor, per variant."""
    item = newest(collection, "bench-attention")
    table = bench_rows(item)
    if table.empty:
        return
    page.text(
        "The indexer, the top-k sparse attention, and both with the selection between them, at "
        "decode (one query at 2K and 46K context) and for a 4096-query prefill chunk ending at "
        "46K. × floor is the time over the larger of the bytes a step must move and its FLOPs "
        "at the rates measured in the same run."
    )
    measures = {"ms": "(ms)", "ratio_to_floor": "× floor"}
    page.table(_wide(table, ["scenario", "kernel"], "variant", ATTENTION_ORDER, measures),
               "Sparse attention at the TP2-rank shape: median ms",
               sources([item], run_conditions))  # fmt: skip
