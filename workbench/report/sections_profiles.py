"""The report's sections on where a run's time goes: profile runs and ncu reports.

Both artifacts answer "which kernel, and why", so their tables share a shape: one column per
run or launch, trimmed to the numbers a reader compares, each table naming the artifacts (GPU,
commit) it came from. What goes in a section and what counts as absent is `seed_tables`', the
same for the HTML page and the Markdown document; this module writes it to either
(`page.ReportPage`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from workbench.analysis.collection import Artifact, Collection
from workbench.analysis.profile import Comparison, device_name
from workbench.analysis.tables import short_kernel_name
from workbench.report.cells import format_value, unit_of
from workbench.report.page import ReportPage, sources
from workbench.report.seed_tables import (
    NO_DECODE_STEP,
    NO_FLAT_REPORT,
    NO_TP_RUN,
    SEED_SERVED,
    SERVED_COLUMNS,
    Section,
    artifacts,
    decode_step_reports,
    kernel_variants,
    missing_profiles,
    missing_stock,
    ncu_variant,
    profile_columns,
    prompt_lengths,
)

if TYPE_CHECKING:  # reading reports needs NVIDIA's ncu_report (the [ncu] extra); tables do not
    from workbench.analysis.ncu_catalog import NcuCatalog

HOT_SPOTS = 3  # source lines per launch
STEP_KERNELS = 10  # kernels of a decode-step report
SOURCE_WIDTH = 70  # characters of a hot spot's source line
SKEW = {"time_ms": "in collectives (ms)", "wait_ms": "waiting for the last rank (ms)",
        "transfer_ms": "transfer (ms)"}  # fmt: skip


def _listed(values: Iterable[object]) -> str:
    """Distinct values as `a`, `b` (code), in their order."""
    return ", ".join(f"`{v}`" for v in dict.fromkeys(str(v) for v in values))


# ---- profile runs ----------------------------------------------------------------------------
# The GPU default's parameters, on the design's preset (the seed's model as the design gives
# it) at the seed's prompt length: a profile of another preset or prompt is not a column of
# the seed's headline table.
SERVED = {"dense": "w8a16", "attention": "fp8", "moe_format": "fp8", "cuda_graphs": True,
          "tp": None, "preset": "dsv4-flash-tp2", "prompt_tokens": 33863}  # fmt: skip


def served_runs(collection: Collection) -> dict[str, Artifact]:
    """The newest one-GPU profile of the served configuration (the GPU default) per MoE kernel
    of the seed's three columns."""
    found: dict[str, Artifact] = {}
    for item in sorted(artifacts(collection, "profile"), key=lambda i: str(i.path)):
        p = item.result.meta.get("params", {})
        if all(p.get(k) == v for k, v in SERVED.items()) and p.get("moe") in SERVED_COLUMNS:
            found[p["moe"]] = item
    return {moe: found[moe] for moe in SERVED_COLUMNS if moe in found}


def served_table(runs: dict[str, Artifact], phase: str) -> pd.DataFrame:
    """Category ms of `phase` (prefill: summed; decode: mean per step), ours beside the
    seed's, a pair of columns per MoE kernel in the seed's order."""
    columns = {}
    for moe, item in runs.items():
        ours = item.result.prefill()["time_ms"] if phase == "prefill" else (
            item.result.decode()["mean_ms"])  # fmt: skip
        columns[f"{moe} (H200)"] = ours
        columns[f"{moe} (seed)"] = pd.Series(SEED_SERVED[phase].get(moe, {}), dtype=float)
    table = pd.DataFrame(columns)
    order = [c for c in ours.index if c in table.index]
    return table.reindex(order + [c for c in table.index if c not in order]).rename_axis("category")


def write_served(page: ReportPage, collection: Collection) -> None:
    """The seed's headline table from the served-configuration runs, the seed's numbers beside
    each column."""
    runs = served_runs(collection)
    if not runs:
        return
    page.text(
        "The seed's headline profile in its served configuration, as the GPU default runs it: "
        "dense W8A16 (FP8 weights, 128x128 blocks), the FP8 sparse attention (Triton), FP8 experts "
        "(the seed's were 4-bit; INT4 still spills here), fused glue, decode as CUDA graphs, "
        "one H200. The seed ran two RTX PRO 6000 in TP2 (so it has all-reduce time), Marlin "
        "W8A16 and exl3's 4-bit MoE kernel; it gave no decode step for stock alone."
    )
    where = sources(list(runs.values()))
    page.table(served_table(runs, "prefill"), "Served configuration, prefill of 33,863 tokens: "
               "summed time (ms), ours and the seed's", where, unit="ms")  # fmt: skip
    page.table(served_table(runs, "decode"), "Served configuration, decode: mean time per step "
               "(ms), ours and the seed's", where, unit="ms")  # fmt: skip


def write_profiles(page: ReportPage, collection: Collection, section: Section) -> None:
    """Prefill and decode time by category, one column per run in the seed's order; the rank
    skew of tensor-parallel runs."""
    write_served(page, collection)
    items = {id(item.result): item for item in artifacts(collection, "profile")}
    results = [item.result for item in items.values()]
    groups: dict[tuple[int | None, str], list] = {}
    for run in results:
        params = run.meta.get("params", {})
        groups.setdefault((params.get("prompt_tokens"), str(params.get("preset"))), []).append(run)
    for key in sorted(groups, key=lambda k: (k[0] is None, k[0] or 0, k[1])):
        _write_profile_group(page, groups[key], items, len(groups) > 1)
    for absence in missing_profiles(results):
        page.absent(*absence)
    if not any(r.ranks for r in results):
        page.absent(*NO_TP_RUN)


def _write_profile_group(page: ReportPage, results: list, items: dict, titled: bool) -> None:
    """The profiles of one prompt length and preset: their text, figure and tables, side by
    side (a table a model and prompt compares like with like, and stays as wide as the page)."""
    runs, labels = profile_columns(results)
    comparison = Comparison(runs, labels)
    ordered = [items[id(run)] for run in runs]
    params = [r.meta.get("params", {}) for r in runs]
    steps = sorted({p.get("decode_tokens") for p in params if p.get("decode_tokens")})
    on_cpu = all(device_name(r.meta) == "CPU" for r in runs)
    time = "CPU op time of the torch references" if on_cpu else "GPU kernel time"
    tp = any(r.ranks for r in runs)
    prompt = " / ".join(f"{p:,}" for p in prompt_lengths(runs))
    page.text(
        f"Summed {time} by category of the synthetic model "
        f"({_listed(p.get('preset') for p in params)}) on "
        f"{', '.join(dict.fromkeys(device_name(r.meta) for r in runs))}, a "
        f"{prompt}-token prompt then "
        f"{' / '.join(map(str, steps))} decode steps, like the seed's server profiles."
        + (" Tensor-parallel runs show the mean of their ranks (one GPU's view)." if tp else "")
    )
    page.figure("profiles", comparison)
    where = sources(ordered)
    presets = ", ".join(dict.fromkeys(str(p.get("preset")) for p in params))
    of = f", {presets}, a {prompt}-token prompt" if titled and prompt else ""
    page.table(comparison.prefill(), f"Prefill: summed time (ms){of}", where, unit="ms")
    page.table(comparison.decode(), f"Decode: mean time per step (ms){of}; the last row is the "
               "idle time between kernels inside a step", where, unit="ms")  # fmt: skip
    page.bullets([f"{n}: {r.decode_caption()}" for n, r in zip(comparison.names, runs)])
    for name, run, item in zip(comparison.names, runs, ordered):
        if run.ranks:
            page.table(run.rank_skew().rename(columns=SKEW), f"All-reduce, {name}: waiting for "
                       "the last rank against the transfer itself", sources([item]))  # fmt: skip


# ---- Nsight Compute --------------------------------------------------------------------------
def launch_name(label: object) -> str:
    """A launch's label as a reader's words: `6 tokens, gate_up` -> `6 tokens, gate up`."""
    return str(label).replace("_", " ")


def _version(text: object) -> str:
    """ncu's version number alone, out of its banner."""
    found = re.search(r"\d{4}\.\d+\.\d+(?:\.\d+)?", str(text))
    return found.group(0) if found else str(text)


def _collected(meta: Mapping) -> str:
    """What ncu collected, from the capture's command: a section set or how many sections, and
    whether ncu locked the clocks (its default, base clocks) or left them as the GPU runs."""
    command = [str(c) for c in meta.get("command") or []]
    if not command:
        return ""
    sections = command.count("--section")
    what = f"{sections} sections" if sections else "set full"
    if "--set" in command[:-1]:
        what = f"set {command[command.index('--set') + 1]}"
    clocks = "base"
    if "--clock-control" in command[:-1]:
        clocks = command[command.index("--clock-control") + 1]
    return what + ("" if clocks == "none" else f", clocks locked ({clocks})")


def _reports(catalog: NcuCatalog) -> pd.DataFrame:
    """The catalog's reports, one row each: what was captured, how, where and when."""
    entries = catalog.entries()
    return pd.DataFrame(
        {
            "report": [f"`ncu/{f}`" for f in entries["file"]],
            "variant": entries["variant"],
            "collected": [_collected(r.meta) for r in catalog.reports],
            "tokens": entries["tokens"],
            "weights": entries["format"],
            "launches": entries["launches"],
            "GPU": entries["gpu"],
            "ncu": entries["ncu"].map(_version),
            "date": entries["date"].map(lambda d: str(d)[:16].replace("T", " ")),
            "commit": entries["commit"],
        }
    )


def _by_launch(table: pd.DataFrame) -> pd.DataFrame:
    """A table with a column per launch, the launches named in words."""
    return table.rename(columns=launch_name, level=0 if table.columns.nlevels > 1 else None)


def _change(diff: pd.DataFrame, baseline: str, variant: str) -> pd.DataFrame:
    """A catalog diff as one cell per launch and metric: `411 → 255 (-38%)`, each number
    rounded for the metric's unit."""
    out = {}
    for launch in dict.fromkeys(diff.columns.get_level_values(0)):
        part = diff[launch]
        units = [unit_of(metric) for metric in diff.index]
        out[launch_name(launch)] = [
            f"{format_value(a, u, True)} → {format_value(b, u, True)}"
            + ("" if pd.isna(c) else f" ({c:+.0f}%)")
            for a, b, c, u in zip(part[baseline], part[variant], part["change_pct"], units)
        ]
    return pd.DataFrame(out, index=pd.Index(diff.index, name="metric"))


def _hot_spots(catalog: NcuCatalog, variant: str) -> pd.DataFrame:
    """The most sampled source lines of each main launch, the source shortened to fit a cell."""
    hot = catalog.hotspots(variant, n=HOT_SPOTS)
    if hot.empty:
        return hot

    def code(text: object) -> str:
        text = " ".join(str(text).split())
        text = text if len(text) <= SOURCE_WIDTH else text[: SOURCE_WIDTH - 1] + "…"
        return f"`{text}`"

    return pd.DataFrame(
        {
            "launch": hot["launch"].map(launch_name),
            "line": [f"{Path(f).name}:{n}" if f else "" for f, n in zip(hot["file"], hot["line"])],
            "source": hot["text"].map(code),
            "stall samples (%)": hot["share_pct"],
            "top stall": hot["top_stall"],
        }
    )


def _launches(catalog: NcuCatalog, steps: set[str]) -> pd.DataFrame:
    """Every profiled launch of the kernel captures and its share of its call."""
    launches = catalog.launches()
    launches = launches[~launches["file"].isin(steps)]
    return pd.DataFrame(
        {
            "variant": launches["variant"],
            "tokens": launches["tokens"],
            "kernel": launches["launch"].map(lambda k: f"`{short_kernel_name(k, 60)}`"),
            "duration (us)": launches["duration_us"],
            "share of its call (%)": launches["share_pct"],
            "main": launches["main"],
        }
    )


def write_ncu(page: ReportPage, collection: Collection, section: Section) -> None:
    """The reports, the seed's table per kernel captured, the stock kernel's stalls, occupancy
    and hot spots and its diff against flat, and the kernels of each decode-step report."""
    from workbench.analysis.ncu_catalog import variant_label

    catalog = collection.ncu_catalog()
    variant = ncu_variant(catalog)
    page.table(_reports(catalog), "Reports: what ncu collected (at the clocks the GPU ran at, "
               "unless it says they were locked), on which GPU, when, at which commit",
               index=False)  # fmt: skip
    for absence in missing_stock(catalog, section.command):
        page.absent(*absence)
    page.text(
        "The seed's table for each kernel captured, one column per main launch (a launch "
        "holding at least a tenth of its call's kernel time; the routing kernels of a MoE call "
        "take microseconds). The top stall is the reason with the most cycles per issued "
        "instruction."
    )
    for name in kernel_variants(catalog):
        files = sorted({x.report.path.name for x in catalog.main(name)})
        page.table(_by_launch(catalog.seed_table(name)).rename_axis("metric"), launch_name(name),
                   "From " + ", ".join(f"`ncu/{f}`" for f in files) + ".",
                   by_row=True)  # fmt: skip
    stalls = catalog.stalls(variant)
    if not stalls.empty:
        page.figure("ncu", catalog, "stalls", variant)
        cycles = _by_launch(stalls.xs("cycles_per_issue", axis=1, level=1))
        page.table(cycles.rename_axis("stall reason"), f"Warp stalls of {variant}: cycles per "
                   "issued instruction, by reason", extra=True)  # fmt: skip
    page.figure("ncu", catalog, "occupancy", variant)
    page.table(_by_launch(catalog.occupancy(variant)).rename_axis("occupancy"),
               f"Occupancy of {variant} and its limiter", by_row=True, extra=True)  # fmt: skip
    hot = _hot_spots(catalog, variant)
    if not hot.empty:
        page.figure("ncu", catalog, "hotspots", variant)
        page.table(hot, f"Hot spots of {variant}: the most sampled source lines of each main "
                   "launch, with their share of its stall samples", index=False)  # fmt: skip
    if variant == "stock" and "flat" in catalog.variants:
        page.table(_change(catalog.diff("flat", "stock"), "stock", "flat"),
                   "flat against stock, launch by launch: stock → flat (change)")  # fmt: skip
    elif variant == "stock":
        page.absent(*NO_FLAT_REPORT)
    steps = decode_step_reports(catalog)
    page.table(_launches(catalog, {r.path.name for r in steps}), "Launches: every profiled "
               "kernel and its share of its call", index=False, extra=True)  # fmt: skip
    for step in steps:
        times = step.kernel_time().head(STEP_KERNELS)
        times.index = pd.Index([f"`{short_kernel_name(k, 70)}`" for k in times.index],
                               name="kernel")  # fmt: skip
        page.text(
            f"Every kernel of one decode step ({variant_label(step.meta, step.path)}, "
            f"{len(step)} launches): ncu replays each launch alone with its caches flushed, so "
            "this ranks the step's kernels; the profile above adds them up."
        )
        page.figure("ncu-step", step)
        page.table(times, f"One decode step: profiled time by kernel, the {STEP_KERNELS} "
                   "longest", f"From `ncu/{step.path.name}`.")  # fmt: skip
    if not steps:
        page.absent(*NO_DECODE_STEP)
