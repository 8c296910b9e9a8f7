"""`workbench report`: the seed report's tables rebuilt from artifacts, on one offline page.

Each section of the seed report (`seed-report.txt`) is fed by a kind of artifact: profile runs
give the per-category prefill and decode tables, ncu reports the "Nsight Compute on the stock
kernel" table, sweeps "Things that did not help", the dense benchmark and A/B runs the
controlled A/B, benchmark runs the kernel tables. A section whose artifacts are absent says so
and names the command that makes them: the page never fills a gap with a number that was not
measured. Written by the one HtmlPage writer (plotly.js inlined once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from workbench.analysis.ncu_catalog import variant_label
from workbench.analysis.ncu_files import DECODE_STEP
from workbench.analysis.tables import short_kernel_name
from workbench.collection import Collection, collect, environment_row
from workbench.report.experiment_figures import bench_lines
from workbench.report.html import HtmlPage
from workbench.results import Comparison, ProfileResult

if TYPE_CHECKING:
    from workbench.capture.experiments import SweepResult

DEFAULT_PATHS = ("raw", "ncu")
SEED_VARIANTS = ("stock", "multirow", "flat")  # the seed's profile columns, in its order
SEED_TOKENS = (6, 4096)  # the seed's ncu columns
ABSENT = "Absent from these artifacts: {what}. To make them, run {command} on the GPU machine."


@dataclass(frozen=True)
class Section:
    """A section of the page: the seed's table it rebuilds (or the workbench's kernel-level
    table), the artifact kinds that feed it, and the command that makes such artifacts."""

    title: str
    kinds: tuple[str, ...]
    command: str
    in_seed: bool = True
    note: str = ""  # how the workbench's table differs from the seed's, shown when rebuilt


SECTIONS = (
    Section(
        "Dense MXFP8 backend",
        ("bench-dense",),
        "`workbench bench dense`",
        note="The seed's table ran each backend in a serving engine; here each backend runs all "
        "dense GEMMs of a layer, times the model's layers, per decode step and for a 46K-token "
        "prefill (tokens per second). Accuracy is the kernel's error against bf16 weights "
        "(error_vs_bf16), not GSM8K.",
    ),
    Section(
        "Kernel profiles in the server",
        ("profile",),
        "`workbench profile --prompt-tokens 33863 --decode-tokens 64 --moe stock` (and "
        "`--moe multirow`, `--moe flat`)",
    ),
    Section(
        "Nsight Compute on the stock kernel",
        ("ncu",),
        "`workbench ncu moe stock --tokens 6 4096 --param fmt=fp8` (and `flat`)",
    ),
    Section(
        "Things that did not help",
        ("sweep",),
        "`workbench sweep moe num_stages 3 5 8 12 --tokens 6 4096 --param variant=stock "
        "--baseline 3`",
    ),
    Section(
        "Hybrid dense GEMM, controlled A/B",
        ("bench-dense", "ab"),
        "`workbench ab profile --a dense=w8a16 --b dense=hybrid --b hybrid_m=128 --tokens "
        "46000 --param moe=flat --param attention=triton`, `workbench bench dense` and "
        "`workbench ab moe --a variant=stock --b variant=flat --tokens 6 4096 --param fmt=fp8`",
        note="The seed's A/B ran a serving engine. Here: the synthetic model through profile(), "
        "W8A16 against the hybrid (W8A16 up to M rows, W8A8 above), a 46K-token prefill and "
        "decode steps at that context, each step's span a sample; the dense GEMMs of all layers "
        "per backend in tokens per second, with the error against bf16 weights standing in for "
        "GSM8K (acceptance length has no kernel counterpart); and kernel A/B runs. Ratios are "
        "b/a of the medians with a bootstrap 95% interval (significant: it excludes 1).",
    ),
    Section("MoE kernels against their floor", ("bench-moe",), "`workbench bench moe`", False),
    Section("Sparse attention kernels", ("bench-attention",), "`workbench bench attention`", False),
)


def _absent(page: HtmlPage, what: str, command: str) -> None:
    page.text(ABSENT.format(what=what, command=command), css="note")


# ---- profile runs ----------------------------------------------------------------------------
def profile_label(run: ProfileResult, with_prompt: bool = False) -> str:
    """What sets a profile apart in the seed's columns: `flat MoE, CUDA graphs, TP2`."""
    p = run.meta.get("params", {})
    parts = [f"{p.get('moe', '?')} MoE", "CUDA graphs" if p.get("cuda_graphs") else "eager"]
    if p.get("tp"):
        parts.append(f"TP{p['tp']}")
    if with_prompt:
        parts.append(f"{p.get('prompt_tokens')} tokens")
    return ", ".join(parts)


def seed_order(runs: Iterable[ProfileResult]) -> list[ProfileResult]:
    """Profiles in the seed's column order: one process before tensor parallelism, then stock,
    multi-row, flat (other kernels after), CUDA graphs before eager."""

    def key(run: ProfileResult) -> tuple:
        p = run.meta.get("params", {})
        moe = p.get("moe")
        rank = SEED_VARIANTS.index(moe) if moe in SEED_VARIANTS else len(SEED_VARIANTS)
        return (p.get("tp") or 1, rank, str(moe), not p.get("cuda_graphs"))

    return sorted(runs, key=key)


def _profiles(page: HtmlPage, runs: list[ProfileResult], section: Section) -> None:
    runs = seed_order(runs)
    prompts = {r.meta.get("params", {}).get("prompt_tokens") for r in runs}
    labels = [profile_label(r, len(prompts) > 1) for r in runs]
    comparison = Comparison(runs, labels)
    page.text(
        "Summed GPU kernel time by category of the synthetic model's runs (prompt "
        f"{', '.join(map(str, sorted(p for p in prompts if p)))} tokens), like the seed's "
        "server profiles; the decode table's last row is the idle time between kernels."
    )
    page.figure(comparison.figure())
    page.table(comparison.prefill(), "Prefill: summed kernel time, ms", digits=1)
    captions = "; ".join(f"{n}: {r.decode_caption()}" for n, r in zip(comparison.names, runs))
    page.table(comparison.decode(), f"Decode, per step: mean ms ({captions})", digits=2)
    present = {r.meta.get("params", {}).get("moe") for r in runs}
    missing = [v for v in SEED_VARIANTS if v not in present]
    if missing:
        _absent(
            page,
            f"profiles with the {', '.join(missing)} MoE kernel (the seed's other columns)",
            " and ".join(f"`workbench profile --prompt-tokens 33863 --decode-tokens 64 --moe {v}`"
                         for v in missing),
        )  # fmt: skip
    tp_runs = [(n, r) for n, r in zip(comparison.names, runs) if r.ranks]
    for name, run in tp_runs:
        page.table(run.rank_skew(), f"All-reduce, {name}: waiting for the last rank vs the "
                   "transfer itself (ms)", digits=3)  # fmt: skip
    if not tp_runs:
        _absent(
            page,
            "a tensor-parallel run, so all-reduce time is zero and no rank waits for another",
            "`workbench profile --tp 2 --prompt-tokens 33863 --decode-tokens 64` on two GPUs",
        )


# ---- Nsight Compute --------------------------------------------------------------------------
def _ncu(page: HtmlPage, collection: Collection, section: Section) -> None:
    catalog = collection.ncu_catalog()
    variant = "stock" if "stock" in catalog.variants else catalog.variants[0]
    page.table(catalog.entries().set_index("file"), "Reports")
    if variant != "stock":
        _absent(page, f"a report of the stock kernel; showing {variant}", section.command)
    missing = [t for t in SEED_TOKENS if t not in catalog.tokens(variant)]
    if missing and variant == "stock":
        _absent(
            page,
            f"stock at {', '.join(map(str, missing))} tokens",
            f"`workbench ncu moe stock --tokens {' '.join(map(str, missing))} --param fmt=fp8`",
        )
    page.text(
        f"The seed's table for the main launches of {variant} (each at least a tenth of its "
        "call's kernel time; the routing kernels are listed under Launches)."
    )
    page.table(catalog.seed_table(variant), "Nsight Compute summary", digits=2)
    stalls = catalog.stalls(variant)
    if not stalls.empty:
        page.figure(catalog.figure("stalls", variant))
        page.table(stalls, "Warp stalls: cycles per issued instruction; % of PC samples")
    page.figure(catalog.figure("occupancy", variant))
    page.table(catalog.occupancy(variant), "Occupancy and its limiter", digits=1)
    hot = catalog.hotspots(variant, n=8)
    if not hot.empty:
        page.figure(catalog.figure("hotspots", variant))
        hot = hot.assign(file=hot["file"].map(lambda f: Path(f).name if f else f))
        page.table(hot.drop(columns=["level"]), "Hot spots: most sampled source lines", 1)
    if variant == "stock" and "flat" in catalog.variants:
        page.table(catalog.diff("flat", "stock"), "flat against stock, launch by launch", 2)
    elif variant == "stock":
        _absent(page, "a report of the flat kernel to diff against",
                "`workbench ncu moe flat --tokens 6 4096 --param fmt=fp8`")  # fmt: skip
    steps = [r for r in catalog.reports if r.meta.get("kernel") == DECODE_STEP]
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
        page.figure(step.figure("kernel_time"))
        page.table(step.kernel_time().head(20), "One decode step: profiled time by kernel", 1)
    if not steps:
        _absent(page, "a report of one decode step", "`workbench ncu model-decode-step stock "
                "--tokens 1 --param layers=1 --param attention=triton`")  # fmt: skip


# ---- experiments -----------------------------------------------------------------------------
def sweep_baseline(sweep: SweepResult) -> object:
    """The value a sweep is judged against: its recorded baseline, else the first value swept
    (the seed's "depth 3 -> 5, 8, 12" names its baseline first)."""
    params = sweep.meta["params"]
    return params.get("baseline", params["values"][0])


def did_not_help(sweeps: Mapping[str, SweepResult]) -> pd.DataFrame:
    """The seed's "Things that did not help" over several sweeps (by name), each against its
    baseline: the effect range over token counts, and the failures."""
    frames = [s.did_not_help(sweep_baseline(s)).assign(sweep=n) for n, s in sweeps.items()]
    return pd.concat(frames, ignore_index=True)


def _sweeps(page: HtmlPage, collection: Collection, section: Section) -> None:
    sweeps = {item.path.name: item.result for item in collection.items if item.kind == "sweep"}
    page.table(did_not_help(sweeps), "Each sweep against its baseline (its first value): the "
               "effect range over token counts, and failures")  # fmt: skip
    for name, sweep in sweeps.items():
        page.figure(sweep.figure().update_layout(title=f"{name}: {sweep.param}"))
        page.table(sweep.table(), f"{name}: ms is the median, ci its 95% interval", digits=4)


def hybrid_ab_table(table: pd.DataFrame, hybrid_m: object = "M") -> pd.DataFrame:
    """bench dense's A/B rows shaped like the seed's hybrid A/B: a row per scenario (tokens per
    second) and the error against bf16 weights, for W8A16 (the default), the hybrid, and their
    ratio. Empty when the run has not both backends."""
    rows = table[(table["kernel"] == DENSE_AB) & table["variant"].isin(["w8a16", "hybrid"])]
    if set(rows["variant"]) != {"w8a16", "hybrid"}:
        return pd.DataFrame()
    wide = dense_ab_table(rows).T
    if "error_vs_bf16" in rows:
        wide.loc["error vs bf16 weights (max)"] = rows.groupby("variant")["error_vs_bf16"].max()
    hybrid = f"hybrid, W8A16 up to M={hybrid_m}"
    wide = wide[["w8a16", "hybrid"]].rename(columns={"w8a16": "W8A16 (default)", "hybrid": hybrid})
    wide["hybrid / default"] = wide[hybrid] / wide["W8A16 (default)"]
    wide.index.name, wide.columns.name = None, None
    return wide


def _abs(page: HtmlPage, collection: Collection, section: Section) -> None:
    for item in (i for i in collection.items if i.kind == "bench-dense"):
        table = hybrid_ab_table(item.result.get("bench", pd.DataFrame(columns=["kernel"])),
                                item.meta.get("params", {}).get("hybrid_m", "M"))  # fmt: skip
        if table.empty:
            _absent(page, f"both the W8A16 and hybrid backends in {item.path.name}",
                    "`workbench bench dense`")  # fmt: skip
        else:
            caption = f"{item.path.name}: dense GEMMs of all layers, tokens per second"
            page.table(table, caption, digits=3)
    for item in (i for i in collection.items if i.kind == "ab"):
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
DENSE_AB = "dense-ab"  # bench dense's rows of the seed's A/B scenarios


def dense_ab_table(table: pd.DataFrame) -> pd.DataFrame:
    """bench dense's A/B rows shaped like the seed's "Dense backend" table: a row per backend,
    tokens per second per scenario (decode with 1 and 4 streams, the 46K-token prefills)."""
    rows = table[table["kernel"] == DENSE_AB]
    wide = rows.pivot_table(index="variant", columns="scenario", values="tokens_per_s", sort=False)
    return wide.reindex(columns=list(dict.fromkeys(rows["scenario"])))


def _benches(kind: str) -> Callable[[HtmlPage, Collection, Section], None]:
    def write(page: HtmlPage, collection: Collection, section: Section) -> None:
        for item in (i for i in collection.items if i.kind == kind):
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
def coverage(collection: Collection) -> pd.DataFrame:
    """Per section: the seed's table or not, what feeds it, how many artifacts are here, and
    whether it is rebuilt or absent (with the command that makes its artifacts)."""
    kinds = collection.kinds()
    rows = []
    for s in SECTIONS:
        count = sum(kinds.get(k, 0) for k in s.kinds)
        rows.append(
            {
                "section": s.title,
                "in the seed report": "yes" if s.in_seed else "no (kernel level)",
                "fed by": ", ".join(s.kinds),
                "artifacts": count,
                "status": "rebuilt" if count else f"absent: run {s.command}",
            }
        )
    return pd.DataFrame(rows).set_index("section")


def artifact_table(collection: Collection) -> pd.DataFrame:
    rows = [
        {"artifact": item.path.name, "kind": item.kind, **environment_row(item.meta)}
        for item in collection.items
    ]
    return pd.DataFrame(rows).set_index("artifact")


def build(collection: Collection) -> HtmlPage:
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
            _absent(page, f"no {' or '.join(section.kinds)} artifact", section.command)
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
