"""Read a `torch.profiler` Chrome trace into a kernel table with categories, phases and layers.

One path for the workbench's own traces and for external ones (vLLM, SGLang, HF
transformers): every GPU kernel is linked to the runtime call that launched it through its
correlation id, and the host frames (record_function scopes, `nn.Module` scopes, aten ops)
open on the launching thread at that moment form its *stack* (`attribute.py`). The category
comes from that stack and the kernel name through the ordered rules of `rules.py`, and the
`rule` column names the rule that decided. A trace with no GPU kernels (a CPU run) gives one
row per op instead, timed by its self time (excluding child ops) so that sums count time once.
Pure Python and pandas: no torch.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.attribute import (
    OP_CATS,
    RANGE_CATS,
    Resolver,
    host_stacks,
    recorded_rule,
    structure,
)
from workbench.analysis.rules import DEFAULT_RULES, Rule
from workbench.artifacts import RUN_FILE
from workbench.errors import ArtifactError

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
GRAPH_LAUNCH = "cudaGraphLaunch"
TRACE_SUFFIXES = (".json", ".json.gz")
RUN_DIR_HINT = " It is a workbench run directory: workbench.load() reads its tables."

# The kernel table's schema: one dtype per column, applied on capture and on load alike.
KERNEL_DTYPES: dict[str, str] = {
    "name": "string",
    "category": "string",
    "source": "string",
    "rule": "string",
    "phase": "string",
    "step": "Int64",
    "layer": "Int64",
    "start_us": "float64",
    "dur_us": "float64",
    "waited_us": "float64",
    "kind": "string",
    "stream": "Int64",
    "grid": "string",
    "block": "string",
    "registers": "Int64",
    "launch": "string",
    "correlation": "Int64",
    "op": "string",
    "module": "string",
    "graph": "bool",
    "rank": "Int64",
}


@dataclass
class ChromeTrace:
    """The complete ('X') events of a trace, and its top-level metadata."""

    events: list[dict]
    meta: dict

    def first_us(self) -> float:
        """The earliest event's start, on the host clock."""
        return min(e["ts"] for e in self.events)


def _trace_files(folder: Path) -> list[str]:
    """Trace files in `folder` and one level below, as paths relative to it."""
    found = [
        p
        for pattern in ("*", "*/*")
        for p in folder.glob(pattern)
        if p.is_file()
        and p.name.endswith(TRACE_SUFFIXES)
        and p.name != RUN_FILE
        and not p.name.startswith(".")
    ]
    return sorted(str(p.relative_to(folder)) for p in found)


def check_trace_path(path: object) -> Path:
    """`path` as a Path to a trace file, or an ArtifactError saying what was given instead."""
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise ArtifactError(
            f"load_trace() needs the path of a torch.profiler trace (.json or .json.gz); "
            f"got {path!r}."
        )
    path = Path(path).expanduser()
    if path.is_dir():
        files = _trace_files(path)
        inside = (
            f"trace files inside: {', '.join(files[:10])}{' ...' if len(files) > 10 else ''}"
            if files
            else "it holds no .json or .json.gz files"
        )
        raise ArtifactError(
            f"{path} is a directory; give the trace file itself (.json or .json.gz): {inside}."
            + (RUN_DIR_HINT if (path / RUN_FILE).is_file() else "")
        )
    if not path.is_file():
        raise ArtifactError(
            f"trace {path} does not exist; give the path of a torch.profiler trace."
        )
    return path


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector, as a context or a decorator. Parsing a trace makes
    millions of dicts, lists and tuples that nearly all live on, so the collector's passes
    over them find nothing and cost half the time json.loads and kernel_table take on a
    100 MB trace. The collector's previous state is restored after, even on an error."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _complete(event: object) -> bool:
    """A complete ('X') event with a start and a name: the only events the tables read."""
    return (
        isinstance(event, dict)
        and event.get("ph") == "X"
        and "ts" in event
        and isinstance(event.get("name"), str)
    )


@_gc_paused()
def read_chrome_trace(path: str | Path) -> ChromeTrace:
    """Parse a `.json` or `.json.gz` Chrome trace, with a clear error for every kind of damage."""
    path = check_trace_path(path)
    raw = path.read_bytes()
    if not raw.strip():
        raise ArtifactError(f"trace {path} is empty; re-export it with prof.export_chrome_trace().")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise ArtifactError(
                f"trace {path} is gzip-compressed but corrupt or truncated ({err}); "
                "copy it again or re-export it."
            ) from None
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(
            f"trace {path} is not valid JSON ({err}); it is probably truncated: the profiler "
            "may have been killed while writing it. Re-export it."
        ) from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ArtifactError(
            f"{path} is JSON but not a Chrome trace: it has no 'traceEvents' list. "
            "Give a trace written by torch.profiler's export_chrome_trace()."
        )
    complete = [e for e in events if _complete(e)]
    if not complete:
        raise ArtifactError(
            f"{path} holds no complete ('X') events, so no op or kernel can be read; "
            "was the profiler stopped before any work ran?"
        )
    meta = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
    return ChromeTrace(complete, meta)


def _dims(value: object) -> str | None:
    """A launch's grid or block as text, [128, 1, 1] -> "128x1x1" (None where it has none)."""
    if isinstance(value, list):
        return "x".join(map(str, value))
    return None


@_gc_paused()
def kernel_table(
    trace: ChromeTrace, rules: Iterable[Rule] = DEFAULT_RULES, origin_us: float | None = None
) -> pd.DataFrame:
    """One row per GPU kernel (or, for a CPU-only trace, per op with its self time), attributed.

    Columns: see KERNEL_DTYPES. `source` says what kind of rule decided the category (`range`,
    `module`, `op`, `kernel` name, or `default`) and `rule` which one, so a user sees how much
    of a table rests on names alone. `module` is the module class path of a `with_stack`
    trace. Times are microseconds from `origin_us` (default: the first row's start); ranks of
    one host share a clock, so a common origin lines their tables up.
    """
    resolver = Resolver(tuple(rules))
    launch_stacks, ops = host_stacks(trace.events)
    gpu = [e for e in trace.events if e.get("cat") in GPU_CATS]
    rows = []
    if gpu:
        for e in gpu:
            args = e.get("args") or {}
            correlation = args.get("correlation")
            stack = launch_stacks.get(correlation, ())
            launch = stack[-1].name if stack else None
            r = resolver.resolve(stack[:-1], e["name"], by_stack=launch != GRAPH_LAUNCH)
            rows.append(
                (
                    e["name"],
                    *r,
                    e["ts"],
                    float(e.get("dur", 0)),
                    e["cat"],
                    args.get("stream"),
                    _dims(args.get("grid")),
                    _dims(args.get("block")),
                    args.get("registers per thread"),
                    launch,
                    correlation,
                )
            )
    else:
        for e, stack, self_us in ops:
            kind = "cpu_op" if e.get("cat") in OP_CATS else "cpu_range"
            r = resolver.resolve(stack, e["name"])
            rows.append((e["name"], *r, e["ts"], self_us, kind, *[None] * 6))
    columns = ["name", "category", "source", "rule", "phase", "step", "layer", "op", "module",
               "start_us", "dur_us", "kind", "stream", "grid", "block", "registers", "launch",
               "correlation"]  # fmt: skip
    table = pd.DataFrame(rows, columns=columns)
    if table.empty:
        raise ArtifactError(
            "the trace has neither GPU kernels nor CPU ops; was anything run under the profiler?"
        )
    table = _one_at_a_time_per_stream(table.sort_values("start_us", kind="stable"))
    table = table.reset_index(drop=True)
    table["start_us"] = table["start_us"] - (
        table["start_us"].iloc[0] if origin_us is None else origin_us
    )
    table["rank"] = pd.NA
    table["phase"] = table["phase"].fillna("all" if table["phase"].isna().all() else "other")
    table["graph"] = table["launch"].eq(GRAPH_LAUNCH).fillna(False)
    return with_schema(table)


def _one_at_a_time_per_stream(table: pd.DataFrame) -> pd.DataFrame:
    """Each GPU row starts no earlier than the one before it on its stream ended.

    Work on one stream runs in order, except under programmatic dependent launch (PDL, Hopper
    and newer): a kernel launched early starts while the one before it still runs, prefetches,
    then waits for it (cuBLAS's split-K reduce does this, and so do the workbench's W8A16
    GEMMs with pdl on). Its span in the trace then holds that wait, and summing spans would count
    those microseconds twice. So such a row starts where the one before it ended, and the
    part cut off is its `waited_us` (0 for every other row; NaN for CPU rows).
    """
    gpu = table["stream"].notna() & table["kind"].isin(GPU_CATS)
    waited = pd.Series(np.where(gpu, 0.0, np.nan), index=table.index)
    if gpu.any():
        rows = table[gpu]
        ends = rows["start_us"] + rows["dur_us"]
        stream = rows["stream"].astype("int64")
        before = ends.groupby(stream).cummax().groupby(stream).shift()
        cut = (before - rows["start_us"]).clip(lower=0).fillna(0.0)
        cut = np.minimum(cut, rows["dur_us"])
        waited[gpu] = cut
        table.loc[gpu, "start_us"] = rows["start_us"] + cut
        table.loc[gpu, "dur_us"] = rows["dur_us"] - cut
    return table.assign(waited_us=waited)


def early_launch_notes(kernels: pd.DataFrame) -> list[str]:
    """What the tables did with kernels that started before the one ahead of them ended (none:
    no note)."""
    early = kernels["waited_us"][kernels["waited_us"] > 0]
    if early.empty:
        return []
    return [
        f"{len(early)} GPU kernels started before the one ahead of them on their stream had "
        f"ended (programmatic dependent launch, as cuBLAS's split-K reduce and the workbench's "
        f"W8A16 GEMMs with pdl on): each is timed from where the one ahead ended, and the "
        f"{early.sum():.1f} us they spent waiting is in waited_us, so a stream's time counts "
        "once."
    ]


# Columns added after the first artifacts were written: older tables load with them empty,
# except `rule`, which `_recorded_rules` fills in where the row shows it.
LATER_COLUMNS = ("correlation", "rank", "module", "waited_us")


def _recorded_rules(table: pd.DataFrame) -> np.ndarray:
    """The `rule` of each row of a table saved before the column existed. Scope, default and
    graph-position rows follow from source and category; only the (few) rows decided by op
    or kernel name need their names. The rule is found once per distinct key, not per row:
    the committed runs' ~10^6 rows hold a few hundred keys."""
    if not {"source", "category", "name", "op"} <= set(table.columns) or not len(table):
        return np.full(len(table), None, dtype=object)
    resolver = Resolver(DEFAULT_RULES)
    known = (table["source"].notna() & table["category"].notna()).to_numpy()
    by_name = table["source"].isin(["kernel", "op"]).to_numpy() & known
    group = _key_codes([table["source"], table["category"]])
    # Names matter only where a name decided (few rows): only those are keyed by them too.
    named = np.flatnonzero(by_name)
    if len(named):
        rows = table.iloc[named]
        extra = _key_codes([rows["name"], rows["op"]]) + 1
        group[named] = _key_codes([pd.Series(group[named]), pd.Series(extra)]) + group.max() + 1
    group = pd.factorize(group)[0]  # dense codes 0..k-1
    first = np.empty(group.max() + 1, dtype=np.int64)
    first[group] = np.arange(len(group))  # a row of each key (any: its rule is the same)
    rules = np.full(len(first), None, dtype=object)
    source, category = table["source"].to_numpy(object), table["category"].to_numpy(object)
    name, op = table["name"].to_numpy(object), table["op"].to_numpy(object)
    for g, row in enumerate(first):
        if not known[row]:
            continue
        if by_name[row]:
            row_op = op[row] if isinstance(op[row], str) else None
            rules[g] = recorded_rule(resolver, source[row], category[row], str(name[row]), row_op)
        else:
            rules[g] = recorded_rule(resolver, source[row], category[row], "", None)
    return rules[group]


def _key_codes(keys: list[pd.Series]) -> np.ndarray:
    """One integer per row, equal where the rows' `keys` (missing values included) are equal."""
    group = np.zeros(len(keys[0]), dtype=np.int64)
    for key in keys:  # factorized at every step, so the codes stay below the row count
        codes, uniques = pd.factorize(key.to_numpy(object), use_na_sentinel=True)
        group = pd.factorize(group * (len(uniques) + 1) + codes + 1)[0]
    return group


def _as_string(values: pd.Series) -> pd.Series:
    """A text column as the `string` dtype, missing values as NA (a CSV round trip gives
    pandas' default text dtype, or object with NaN)."""
    if isinstance(values.dtype, pd.StringDtype):
        return values.astype("string")  # direct: no detour through Python objects
    return values.astype(object).where(values.notna(), None).astype("string")


def with_schema(table: pd.DataFrame) -> pd.DataFrame:
    """The kernel table's columns in order with their dtypes (a CSV round trip loses them)."""
    table = table.assign(**{c: pd.NA for c in LATER_COLUMNS if c not in table.columns})
    if "rule" not in table.columns:
        table = table.assign(rule=_recorded_rules(table))
    missing = sorted(set(KERNEL_DTYPES) - set(table.columns))
    if missing:
        raise ArtifactError(f"kernel table lacks columns {missing}; re-run the capture.")
    columns = {}
    for col, dtype in KERNEL_DTYPES.items():
        if dtype == "Int64":
            values = pd.to_numeric(table[col]).to_numpy(dtype=float)
            columns[col] = pd.array(values, dtype="Int64")
        elif dtype == "string":
            columns[col] = _as_string(table[col]).array
        elif dtype == "float64":  # NA (a later column in an older table) as NaN
            columns[col] = pd.to_numeric(table[col]).to_numpy(dtype=float, na_value=np.nan)
        else:
            columns[col] = table[col].astype(dtype).to_numpy()
    # Built from the converted columns: no copy of the whole table first.
    return pd.DataFrame(columns, index=table.index)


def device_of(table: pd.DataFrame) -> str:
    """'cuda' when the table holds GPU kernels, 'cpu' when it holds CPU ops."""
    return "cpu" if bool(table["kind"].str.startswith("cpu").all()) else "cuda"


def numbered_scopes(trace: ChromeTrace) -> dict[str, int]:
    """Phase scopes without a step number ("decode", as users write it around every step)
    that number the steps, and how many times each occurs: those not inside another
    step-less scope of the same phase on their thread (as `attribute._phase_and_step`)."""
    ranges = sorted(
        (e for e in trace.events if e.get("cat") in RANGE_CATS),
        key=lambda e: (e.get("pid"), e.get("tid"), e["ts"], -float(e.get("dur", 0))),
    )
    counts: Counter[str] = Counter()
    open_until: dict[tuple, float] = {}  # (pid, tid, phase) -> end of the outer scope
    for e in ranges:
        phase, step, _ = structure(e["name"])
        if phase is None or step is not None:
            continue
        where = (e.get("pid"), e.get("tid"), phase)
        if e["ts"] < open_until.get(where, float("-inf")):
            continue  # nested inside an outer scope of its phase
        open_until[where] = e["ts"] + float(e.get("dur", 0))
        counts[e["name"]] += 1
    return dict(counts)


def trace_notes(
    trace: ChromeTrace, kernels: pd.DataFrame, path: str | Path | None = None
) -> list[str]:
    """What a reader of an external trace's tables must know: rows that are CPU ops, kernels
    whose category rests on names alone, module scopes used, how steps were numbered, and
    that a workbench run's own table is better than its trace re-read."""
    notes = []
    if path is not None and (Path(path).parent / RUN_FILE).is_file():
        notes.append(
            f"This is the trace of a workbench run: workbench.load('{Path(path).parent}') reads "
            "the run's own kernel table, which attributes CUDA-graph replays by their eager "
            "signature rather than by kernel names."
        )
    if device_of(kernels) == "cpu":
        notes.append(
            "This trace holds no GPU kernels (a CPU run, or profiled without "
            "ProfilerActivity.CUDA): every row is a CPU op timed by its self time, so the "
            "tables give CPU op time, and their 'kernels' counts are ops."
        )
    else:
        unlinked = int(kernels["launch"].isna().sum())
        if unlinked == len(kernels):
            notes.append(
                f"None of the {unlinked} GPU kernels could be linked to its launching call (the "
                "trace holds no CPU activity, or no correlation ids): categories rest on kernel "
                "names alone, and phases and steps are unknown."
            )
        elif unlinked:
            notes.append(
                f"{unlinked} of {len(kernels)} GPU kernels have no launching call in the trace "
                "(launched before the profiler started, or on an unprofiled thread): their "
                "categories rest on kernel names alone."
            )
    notes += early_launch_notes(kernels)
    under_modules = int(kernels["module"].notna().sum())
    if under_modules:
        notes.append(
            f"{under_modules} of {len(kernels)} rows ran under nn.Module scopes (a with_stack "
            "trace): module classes decide before launching ops and kernel names (MoE block -> "
            "MoE; Linear inside an attention -> Dense GEMM; the rest of an attention -> "
            "Attention; MLP -> Dense GEMM)."
        )
    for name, count in numbered_scopes(trace).items():
        if count > 1:
            notes.append(
                f"{count} scopes named '{name}' are taken as {structure(name)[0]} steps 0 to "
                f"{count - 1}, in order."
            )
    return notes
