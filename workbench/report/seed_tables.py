"""The seed report's sections and the tables they share, without drawing.

`workbench report` writes the seed study's tables twice from one `Collection`: as an offline
HTML page with figures (`seed_report`) and as GitHub Markdown (`markdown`, which is how
`docs/results.md` is made). Both need the same answers to the same questions: which sections
there are, which artifacts feed each, which command makes the missing ones, how a profile run
is labelled, which sweep value is the baseline, which benchmark run is the newest. They live
here so the two writers cannot drift apart, and so the Markdown writer needs no plotly. So
do the notes for what is absent: each an `Absence` (what is missing, the command that makes
it), which either writer shows in its own style.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from workbench.analysis.collection import NOT_RECORDED, Artifact, Collection, environment_row
from workbench.analysis.experiments import SweepResult
from workbench.analysis.ncu_files import DECODE_STEP
from workbench.analysis.profile import (
    SEED_VARIANTS,
    ProfileResult,
    device_name,
    profile_label,
    seed_order,
)

if TYPE_CHECKING:  # reading reports needs NVIDIA's ncu_report (the [ncu] extra); tables do not
    from workbench.analysis.ncu import NcuReport
    from workbench.analysis.ncu_catalog import NcuCatalog

DEFAULT_PATHS = ("raw", "ncu")
SEED_TOKENS = (6, 4096)  # the seed's ncu columns
# The seed study's server profile (33,863-token prompt, 64 decode steps, two RTX PRO 6000 in
# TP2, Marlin W8A16 dense, stock exl3 MoE on 4-bit experts), ms by category as it reported
# them, for its three columns: stock, + multi-row prefill kernel, + flat scheduler. It gave no
# decode step for stock alone, nor Other or sparse attention per decode step.
SEED_SERVED = {
    "prefill": {
        "stock": {"MoE": 5771, "Dense GEMM": 2002, "Sparse attention": 555, "All-reduce": 749,
                  "Total": 9938},
        "multirow": {"MoE": 4455, "Dense GEMM": 2003, "Sparse attention": 555,
                     "All-reduce": 857, "Total": 8731},
        "flat": {"MoE": 4470, "Dense GEMM": 2038, "Sparse attention": 568, "All-reduce": 783,
                 "Total": 8719},
    },
    "decode": {
        "multirow": {"MoE": 16.1, "Dense GEMM": 8.0, "All-reduce": 0.6, "Total": 28.9},
        "flat": {"MoE": 8.9, "Dense GEMM": 8.2, "All-reduce": 1.6, "Total": 23.5},
    },
}  # fmt: skip
SERVED_COLUMNS = ("stock", "multirow", "flat")
ABSENT = "Absent from these artifacts: {what}. To make them, run {command} on the GPU machine."
PROFILE_COMMAND = "`workbench profile --prompt-tokens 33863 --decode-tokens 64 --param moe={}`"

Absence = tuple[str, str]  # what these artifacts lack, and the command that makes it (ABSENT)
NO_TP_RUN: Absence = (
    "a tensor-parallel run (two GPUs), so all-reduce time is zero and no rank waits",
    "`workbench profile --prompt-tokens 33863 --decode-tokens 64 --param tp=2`",
)
NO_FLAT_REPORT: Absence = (
    "a report of the flat kernel to diff against",
    "`workbench ncu moe flat --tokens 6 4096 --param fmt=fp8`",
)
NO_DECODE_STEP: Absence = (
    "a report of one decode step",
    "`workbench ncu model-decode-step stock --tokens 1 --param layers=1 --param attention=triton`",
)


@dataclass(frozen=True)
class Section:
    """A section of the report: the seed's table it rebuilds (or the workbench's kernel-level
    table), the artifact kinds that feed it, and the command that makes such artifacts."""

    title: str
    kinds: tuple[str, ...]
    command: str
    in_seed: bool = True
    note: str = ""  # how the workbench's table differs from the seed's, shown when rebuilt

    @property
    def absence(self) -> Absence:
        """The note in place of the section when no artifact of its kinds is here."""
        return f"no {' or '.join(self.kinds)} artifact", self.command


SECTIONS = (
    Section(
        "Dense MXFP8 backend",
        ("bench-dense",),
        "`workbench bench dense`",
        note="The seed's table ran each backend in a serving engine; here each backend runs all "
        "dense GEMMs of a layer, times the model's layers, per decode step and for a 46K-token "
        "prefill (tokens per second). Accuracy is the kernel's error against bf16 weights "
        "(rel. error vs bf16 weights), not GSM8K.",
    ),
    Section(
        "Kernel profiles in the server",
        ("profile",),
        "`workbench profile --prompt-tokens 33863 --decode-tokens 64 --param moe=stock` (and "
        "`moe=multirow`, `moe=flat`)",
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
    Section(
        "Kernel targets",
        ("bench-dense", "bench-moe", "ab"),
        "`workbench bench dense --peers cublas_fp8 deepgemm humming` and `workbench bench moe "
        "--peers torch_grouped_mm_bare deepgemm humming`",
        False,
        note="Each target is a ratio measured within one run: our layer over cuBLAS bf16 and "
        "over the fastest peer (bench dense), a MoE kernel over its roofline floor, cuBLAS's "
        "rate or a peer (bench moe), the hybrid's prefill over W8A16's (a profile A/B with its "
        "bootstrap interval). A target whose rows the run lacks is not measured, never met.",
    ),
)


# ---- profile runs ----------------------------------------------------------------------------
def profile_columns(runs: Iterable[ProfileResult]) -> tuple[list[ProfileResult], list[str]]:
    """Profiles in the seed's column order with column labels that tell them apart: what
    `profile_label` says (kernels, graphs, TP; machine and preset on a CPU), with the prompt
    length, the GPU and the preset added where the runs differ in them, and the run's time
    stamp where two runs still read alike."""
    runs = seed_order(runs)
    params = [r.meta.get("params", {}) for r in runs]
    prompts = {p.get("prompt_tokens") for p in params}
    labels = [profile_label(r, len(prompts) > 1) for r in runs]
    on_cpu = [device_name(r.meta) == "CPU" for r in runs]  # labelled with both already
    for values in ([device_name(r.meta) for r in runs], [str(p.get("preset")) for p in params]):
        if len(set(values)) > 1:
            labels = [label if cpu else f"{label}, {value}"
                      for label, value, cpu in zip(labels, values, on_cpu)]  # fmt: skip
    repeated = {label for label in labels if labels.count(label) > 1}
    stamps = [str(r.path.name if r.path else "").rsplit("-", 1)[-1] for r in runs]
    labels = [f"{label} ({stamp})" if label in repeated and stamp else label
              for label, stamp in zip(labels, stamps)]  # fmt: skip
    return runs, labels


def prompt_lengths(runs: Iterable[ProfileResult]) -> list[int]:
    """The distinct prompt lengths of the runs, ascending."""
    prompts = {r.meta.get("params", {}).get("prompt_tokens") for r in runs}
    return sorted(p for p in prompts if p)


def missing_profiles(runs: Iterable[ProfileResult]) -> list[Absence]:
    """The seed's profile columns that no run has: one note naming the seed's MoE kernels that
    no run used (in the seed's order) and the profile command for each; none when all ran."""
    present = {r.meta.get("params", {}).get("moe") for r in runs}
    missing = [v for v in SEED_VARIANTS if v not in present]
    if not missing:
        return []
    what = f"profiles with the {', '.join(missing)} MoE kernel (the seed's other columns)"
    return [(what, " and ".join(PROFILE_COMMAND.format(v) for v in missing))]


# ---- Nsight Compute --------------------------------------------------------------------------
def ncu_variant(catalog: NcuCatalog) -> str:
    """The variant the seed's ncu table is about: stock when there is a report of it."""
    return "stock" if "stock" in catalog.variants else catalog.variants[0]


def missing_stock(catalog: NcuCatalog, command: str) -> list[Absence]:
    """What the seed's ncu table lacks: a report of the stock kernel at all (`command` makes
    one; the table shows another variant), or stock at some of the seed's token counts."""
    variant = ncu_variant(catalog)
    if variant != "stock":
        return [(f"a report of the stock kernel; showing {variant}", command)]
    missing = [t for t in SEED_TOKENS if t not in catalog.tokens(variant)]
    if not missing:
        return []
    tokens = f"`workbench ncu moe stock --tokens {' '.join(map(str, missing))} --param fmt=fp8`"
    return [(f"stock at {', '.join(map(str, missing))} tokens", tokens)]


def decode_step_reports(catalog: NcuCatalog) -> list[NcuReport]:
    """The reports of a whole decode step (every kernel of it), as opposed to kernel captures."""
    return [r for r in catalog.reports if r.meta.get("kernel") == DECODE_STEP]


def kernel_variants(catalog: NcuCatalog) -> list[str]:
    """The variants of kernel captures (not decode steps): the seed's MoE kernels first in the
    seed's order, then the rest in the catalog's order."""
    steps = {r.path.name for r in decode_step_reports(catalog)}
    variants = list(
        dict.fromkeys(x.variant for x in catalog.all if x.report.path.name not in steps)
    )

    def key(variant: str) -> int:
        first = variant.split()[0]
        return SEED_VARIANTS.index(first) if first in SEED_VARIANTS else len(SEED_VARIANTS)

    return sorted(variants, key=key)


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


# ---- benchmarks ------------------------------------------------------------------------------
DENSE_AB = "dense-ab"  # bench dense's rows of the seed's A/B scenarios
BF16_ERROR = "rel. error vs bf16 weights (max)"  # hybrid_ab_table's row of errors, not tokens/s


def dense_ab_table(table: pd.DataFrame) -> pd.DataFrame:
    """bench dense's A/B rows shaped like the seed's "Dense backend" table: a row per backend,
    tokens per second per scenario (decode with 1 and 4 streams, the 46K-token prefills)."""
    rows = table[table["kernel"] == DENSE_AB]
    wide = rows.pivot_table(index="variant", columns="scenario", values="tokens_per_s", sort=False)
    return wide.reindex(columns=list(dict.fromkeys(rows["scenario"])))


def bench_rows(item: Artifact) -> pd.DataFrame:
    """A benchmark run's rows (its `bench` table), or none when the run has no such table."""
    return item.result.get("bench", pd.DataFrame(columns=["kernel"]))


def hybrid_ab_table(table: pd.DataFrame, hybrid_m: object = "M") -> pd.DataFrame:
    """bench dense's A/B rows shaped like the seed's hybrid A/B: a row per scenario (tokens per
    second) and the error against bf16 weights, for W8A16 (the default), the hybrid, and their
    ratio. Empty when the run has not both backends."""
    rows = table[(table["kernel"] == DENSE_AB) & table["variant"].isin(["w8a16", "hybrid"])]
    if set(rows["variant"]) != {"w8a16", "hybrid"}:
        return pd.DataFrame()
    wide = dense_ab_table(rows).T
    if "error_vs_bf16" in rows:
        wide.loc[BF16_ERROR] = rows.groupby("variant")["error_vs_bf16"].max()
    hybrid = f"hybrid, W8A16 up to M={hybrid_m}"
    wide = wide[["w8a16", "hybrid"]].rename(columns={"w8a16": "W8A16 (default)", "hybrid": hybrid})
    wide["hybrid / default"] = wide[hybrid] / wide["W8A16 (default)"]
    wide.index.name, wide.columns.name = None, None
    return wide


def hybrid_ab(item: Artifact) -> pd.DataFrame:
    """A bench dense run's `hybrid_ab_table`, at the M the run recorded for the hybrid."""
    return hybrid_ab_table(bench_rows(item), item.meta.get("params", {}).get("hybrid_m", "M"))


def no_hybrid(name: str) -> Absence:
    """The note for a bench dense run (named `name`) whose `hybrid_ab` is empty."""
    return f"both the W8A16 and hybrid backends in {name}", "`workbench bench dense`"


def started(item: Artifact) -> str:
    """When an artifact's capture started (ISO text, so it sorts), from its metadata; the run
    id's stamp when the metadata has no date."""
    env = item.meta.get("environment") or {}
    return str(env.get("date") or item.meta.get("started") or item.path.name)


def newest_rows(
    items: Iterable[Artifact], keys: Iterable[str], table: str = "bench"
) -> pd.DataFrame:
    """The rows of several benchmark runs of one kind, each configuration (`keys`) from the
    newest run that measured it, with the run's path in a `run` column.

    Runs of one kind differ in what they cover (one times decode sizes, a later one adds a
    format), so "the newest run" alone would drop configurations that only older runs hold;
    when the newest run covers everything, every row is its."""
    frames = [
        item.result[table].assign(run=str(item.path), _started=started(item))
        for item in sorted(items, key=started)
        if table in item.result
    ]
    if not frames:
        return pd.DataFrame()
    rows = pd.concat(frames, ignore_index=True)
    keys = [k for k in keys if k in rows]
    newest = rows.drop_duplicates(keys, keep="last")
    return newest.drop(columns="_started").reset_index(drop=True)


# ---- coverage and metadata -------------------------------------------------------------------
def artifacts(collection: Collection, kind: str) -> list[Artifact]:
    """The artifacts of one kind, in the collection's order (`Collection.of` gives their
    results, without the path and metadata a table names its sources by)."""
    return [item for item in collection.items if item.kind == kind]


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


PROVENANCE_DRIVER = re.compile(r",\s*driver\s+\S+$")


def origin(meta: Mapping) -> dict[str, str]:
    """GPU, driver, CUDA, torch, Triton, date and commit of an artifact (`environment_row`);
    artifacts captured before runs recorded their environment carry a `provenance` note
    (GPU and commit as shipped and logged), which fills in what it knows."""
    row = environment_row(dict(meta))
    provenance = meta.get("provenance") or {}
    if row["GPU"] == NOT_RECORDED and provenance.get("gpu"):
        row["GPU"] = PROVENANCE_DRIVER.sub("", str(provenance["gpu"]))
    if row["commit"] == NOT_RECORDED and provenance.get("commit"):
        row["commit"] = str(provenance["commit"])[:10]
    return row


def artifact_table(
    collection: Collection, name: Callable[[Path], str] = lambda path: path.name
) -> pd.DataFrame:
    """What each artifact ran on: kind, GPU, driver, CUDA, torch, Triton, date (to the minute),
    commit; `name` makes the artifact column from its path."""
    rows = [{"artifact": name(item.path), "kind": item.kind, **origin(item.meta)}
            for item in collection.items]  # fmt: skip
    table = pd.DataFrame(rows).set_index("artifact")
    if not table.empty:
        table["date"] = table["date"].map(lambda d: str(d)[:16].replace("T", " "))
    return table


def default_paths() -> tuple[list[str], list[str]]:
    """The default artifact folders (`DEFAULT_PATHS`) that are here, and those that are not:
    a checkout with runs but no ncu reports yet is reported from what it has."""
    here = [p for p in DEFAULT_PATHS if Path(p).exists()]
    return here, [p for p in DEFAULT_PATHS if p not in here]
