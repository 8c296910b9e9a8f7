"""`workbench report`: the seed report's tables rebuilt from artifacts, on one offline page.

The seed study (`docs/seed-study.md` says what it measured) is the report kernel engineers
write by hand today; each of its sections is fed here by a kind of artifact: profile runs
give the per-category prefill and decode tables, ncu reports the "Nsight Compute on the stock
kernel" table, sweeps "Things that did not help", the dense benchmark and A/B runs the
controlled A/B, benchmark runs the kernel tables. A section whose artifacts are absent says so
and names the command that makes them: the page never fills a gap with a number that was not
measured. Written by the one HtmlPage writer (plotly.js inlined once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from workbench.analysis.collection import Collection, collect
from workbench.analysis.ncu_catalog import variant_label
from workbench.analysis.profile import Comparison, ProfileResult
from workbench.analysis.tables import short_kernel_name
from workbench.report.experiment_figures import bench_lines, sweep_figure
from workbench.report.html import HtmlPage
from workbench.report.ncu_page import catalog_figure, ncu_figure
from workbench.report.profile_page import comparison_figure
from workbench.report.seed_tables import (
    ABSENT,
    DEFAULT_PATHS,
    DENSE_AB,
    NO_DECODE_STEP,
    NO_FLAT_REPORT,
    NO_TP_RUN,
    SECTIONS,
    Section,
    artifact_table,
    artifacts,
    coverage,
    decode_step_reports,
    dense_ab_table,
    did_not_help,
    hybrid_ab,
    hybrid_ab_table,
    missing_profiles,
    missing_stock,
    ncu_variant,
    no_hybrid,
    profile_columns,
    prompt_lengths,
)

__all__ = ["SECTIONS", "build", "coverage", "dense_ab_table", "did_not_help", "hybrid_ab_table",
           "write_report"]  # fmt: skip


def _absent(page: HtmlPage, what: str, command: str) -> None:
    page.text(ABSENT.format(what=what, command=command), css="note")


# ---- profile runs ----------------------------------------------------------------------------
def _profiles(page: HtmlPage, runs: list[ProfileResult], section: Section) -> None:
    runs, labels = profile_columns(runs)
    comparison = Comparison(runs, labels)
    page.text(
        "Summed GPU kernel time by category of the synthetic model's runs (prompt "
        f"{', '.join(map(str, prompt_lengths(runs)))} tokens), like the seed's "
        "server profiles; the decode table's last row is the idle time between kernels."
    )
    page.figure(comparison_figure(comparison))
    page.table(comparison.prefill(), "Prefill: summed kernel time, ms", digits=1)
    captions = "; ".join(f"{n}: {r.decode_caption()}" for n, r in zip(comparison.names, runs))
    page.table(comparison.decode(), f"Decode, per step: mean ms ({captions})", digits=2)
    for absence in missing_profiles(runs):
        _absent(page, *absence)
    tp_runs = [(n, r) for n, r in zip(comparison.names, runs) if r.ranks]
    for name, run in tp_runs:
        page.table(run.rank_skew(), f"All-reduce, {name}: waiting for the last rank vs the "
                   "transfer itself (ms)", digits=3)  # fmt: skip
    if not tp_runs:
        _absent(page, *NO_TP_RUN)


# ---- Nsight Compute --------------------------------------------------------------------------
def _ncu(page: HtmlPage, collection: Collection, section: Section) -> None:
    catalog = collection.ncu_catalog()
    variant = ncu_variant(catalog)
    page.table(catalog.entries().set_index("file"), "Reports")
    for absence in missing_stock(catalog, section.command):
        _absent(page, *absence)
    page.text(
        f"The seed's table for the main launches of {variant} (each at least a tenth of its "
        "call's kernel time; the routing kernels are listed under Launches)."
    )
    page.table(catalog.seed_table(variant), "Nsight Compute summary", digits=2)
    stalls = catalog.stalls(variant)
    if not stalls.empty:
        page.figure(catalog_figure(catalog, "stalls", variant))
        page.table(stalls, "Warp stalls: cycles per issued instruction; % of PC samples")
    page.figure(catalog_figure(catalog, "occupancy", variant))
    page.table(catalog.occupancy(variant), "Occupancy and its limiter", digits=1)
    hot = catalog.hotspots(variant, n=8)
    if not hot.empty:
        page.figure(catalog_figure(catalog, "hotspots", variant))
        hot = hot.assign(file=hot["file"].map(lambda f: Path(f).name if f else f))
        page.table(hot.drop(columns=["level"]), "Hot spots: most sampled source lines", 1)
    if variant == "stock" and "flat" in catalog.variants:
        page.table(catalog.diff("flat", "stock"), "flat against stock, launch by launch", 2)
    elif variant == "stock":
        _absent(page, *NO_FLAT_REPORT)
    steps = decode_step_reports(catalog)
    launches = catalog.launches()
    launches = launches[~launches["file"].isin([r.path.name for r in steps])]
    launches["kernel"] = launches.pop("launch").map(short_kernel_name)
    page.table(launches, "Launches: every profiled kernel and its share of its call", 1)
    for step in steps:
        page.text(
            f"Every kernel of one decode step ({variant_label(step.meta, step.path)}, "
            f"{len(step)} launches, {step.path.name}): ncu replays each alone with its caches "
            "flushed, so this ranks the step's kernels; the profile above adds them up."
        )
        page.figure(ncu_figure(step, "kernel_time"))
        page.table(step.kernel_time().head(20), "One decode step: profiled time by kernel", 1)
    if not steps:
        _absent(page, *NO_DECODE_STEP)


# ---- experiments -----------------------------------------------------------------------------
def _sweeps(page: HtmlPage, collection: Collection, section: Section) -> None:
    sweeps = {item.path.name: item.result for item in artifacts(collection, "sweep")}
    page.table(did_not_help(sweeps), "Each sweep against its baseline (its first value): the "
               "effect range over token counts, and failures")  # fmt: skip
    for name, sweep in sweeps.items():
        page.figure(sweep_figure(sweep).update_layout(title=f"{name}: {sweep.param}"))
        page.table(sweep.table(), f"{name}: ms is the median, ci its 95% interval", digits=4)


def _abs(page: HtmlPage, collection: Collection, section: Section) -> None:
    for item in artifacts(collection, "bench-dense"):
        table = hybrid_ab(item)
        if table.empty:
            _absent(page, *no_hybrid(item.path.name))
        else:
            caption = f"{item.path.name}: dense GEMMs of all layers, tokens per second"
            page.table(table, caption, digits=3)
    for item in artifacts(collection, "ab"):
        p = item.meta["params"]
        caption = f"{item.path.name}: a = {p['a']}, b = {p['b']}, fixed {p.get('fixed') or {}}"
        page.table(item.result.table(), caption, digits=4)


# ---- benchmarks ------------------------------------------------------------------------------
# Per benchmark kind: the size column its figure runs along and the columns naming a line; a kind
# without an entry gets its tables only.
BENCH_LINES = {
    "bench-moe": ("tokens", ("kernel", "variant", "weight_dtype", "routing")),
    "bench-dense": ("m", ("kernel", "variant")),
}


def _benches(kind: str) -> Callable[[HtmlPage, Collection, Section], None]:
    def write(page: HtmlPage, collection: Collection, section: Section) -> None:
        for item in artifacts(collection, kind):
            for name, table in item.result.items():
                title = f"{item.path.name}: {name}"
                if kind == "bench-dense" and (table.get("kernel") == DENSE_AB).any():
                    page.table(dense_ab_table(table), f"{title}, tokens per second", digits=1)
                    table = table[table["kernel"] != DENSE_AB]
                if kind in BENCH_LINES and {"ms", BENCH_LINES[kind][0]} <= set(table.columns):
                    x, keys = BENCH_LINES[kind]
                    page.figure(bench_lines(table, title, keys, x))
                page.table(table, title, digits=4)

    return write


WRITERS: dict[str, Callable[[HtmlPage, Collection, Section], None]] = {
    "Dense MXFP8 backend": _benches("bench-dense"),
    "Kernel profiles in the server": lambda page, c, s: _profiles(page, c.of("profile"), s),
    "Nsight Compute on the stock kernel": _ncu,
    "Things that did not help": _sweeps,
    "Hybrid dense GEMM, controlled A/B": _abs,
    "MoE kernels against their floor": _benches("bench-moe"),
    "Sparse attention kernels": _benches("bench-attention"),
}


# ---- the page --------------------------------------------------------------------------------
def build(collection: Collection) -> HtmlPage:
    """The page: coverage, a section per seed table (or why it is absent), then what each
    artifact ran on and its full metadata."""
    page = HtmlPage("The seed report, rebuilt from artifacts")
    page.text(
        "Every table below is computed from the artifacts listed under Artifacts (GPU, versions, "
        "date and commit of each); a section without artifacts says so and names the command "
        "that makes them."
    )
    page.heading("Coverage").table(coverage(collection))
    for section in SECTIONS:
        page.heading(section.title)
        if any(collection.kinds().get(k) for k in section.kinds):
            if section.note:
                page.text(section.note)
            WRITERS[section.title](page, collection, section)
        else:
            _absent(page, *section.absence)
    page.heading("Artifacts")
    if collection.items:
        page.table(artifact_table(collection), "What each artifact ran on")
    for item in collection.items:
        page.metadata(item.meta, f"{item.kind}: {item.path}")
    for path, why in collection.unread:
        page.text(f"Not read: {path}: {why}", css="note")
    return page


def write_report(paths: Iterable[str | Path] = (), html: str | Path = "report.html") -> Path:
    """Collect the artifacts at `paths` (none given: raw and ncu) and write the page to `html`."""
    return build(collect(list(paths) or DEFAULT_PATHS)).write(html)
