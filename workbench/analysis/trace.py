"""Read a `torch.profiler` Chrome trace into a kernel table with categories, phases and layers.

One path for the workbench's own traces and for external ones (vLLM, SGLang, HF
transformers): every GPU kernel is linked to the runtime call that launched it through its
correlation id, and the host ranges (record_function scopes, aten ops) open on the launching
thread at that moment form its *stack*. The category comes from that stack and the kernel name
through the ordered rules of `rules.py`. A trace with no GPU kernels (a CPU run) gives one row
per op instead, timed by its self time (excluding child ops) so that sums count time once.
Pure Python and pandas: no torch.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.analysis.rules import (
    DEFAULT_RULES,
    LAYER_PATTERN,
    OPAQUE_RANGES,
    OTHER,
    PHASE_PATTERNS,
    Rule,
)
from workbench.errors import ArtifactError

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
RANGE_CATS = {"user_annotation"}
OP_CATS = {"cpu_op"}
GRAPH_LAUNCH = "cudaGraphLaunch"

# The kernel table's schema: one dtype per column, applied on capture and on load alike.
KERNEL_DTYPES: dict[str, str] = {
    "name": "string",
    "category": "string",
    "source": "string",
    "phase": "string",
    "step": "Int64",
    "layer": "Int64",
    "start_us": "float64",
    "dur_us": "float64",
    "kind": "string",
    "stream": "Int64",
    "grid": "string",
    "block": "string",
    "registers": "Int64",
    "launch": "string",
    "correlation": "Int64",
    "op": "string",
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


def read_chrome_trace(path: str | Path) -> ChromeTrace:
    """Parse a `.json` or `.json.gz` Chrome trace, with a clear error for every kind of damage."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(
            f"trace {path} does not exist; give the path of a torch.profiler trace."
        )
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
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    if not complete:
        raise ArtifactError(
            f"{path} holds no complete ('X') events, so no op or kernel can be read; "
            "was the profiler stopped before any work ran?"
        )
    meta = {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}
    return ChromeTrace(complete, meta)


@dataclass
class _Interval:
    end: float
    name: str
    is_op: bool
    row: int  # index of the op in the leaf bookkeeping, -1 for ranges


def _host_stacks(
    events: Sequence[dict],
) -> tuple[dict[int, tuple], list[tuple[dict, tuple, float]]]:
    """Sweep each host thread once: the open ranges and ops at every launch, and every op.

    Returns (stack of each launch's correlation id, [(op event, its stack, self time in us)]).
    Self time excludes child ops, so summing it over ops counts every microsecond once. An
    opaque range (OPAQUE_RANGES) is one row of its whole duration instead of its ops. A stack
    is a tuple of (name, is_op) pairs from outermost to innermost.
    """
    by_thread: dict[tuple, list[dict]] = {}
    for e in events:
        cat = e.get("cat")
        if cat in RANGE_CATS or cat in OP_CATS or cat in LAUNCH_CATS:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    launch_stacks: dict[int, tuple] = {}
    op_rows: list[tuple[dict, tuple, float]] = []
    for thread_events in by_thread.values():
        # Enclosing ranges first at equal start: longer first; launches after ranges.
        thread_events.sort(
            key=lambda e: (e["ts"], e.get("cat") in LAUNCH_CATS, -float(e.get("dur", 0)))
        )
        stack: list[_Interval] = []
        ops: list[dict] = []
        child_us: list[float] = []
        op_stacks: list[tuple] = []
        for e in thread_events:
            ts = e["ts"]
            while stack and stack[-1].end <= ts:
                stack.pop()
            names = tuple((s.name, s.is_op) for s in stack)
            cat = e.get("cat")
            if cat in LAUNCH_CATS:
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    launch_stacks[corr] = (*names, (e["name"], False))
                continue
            is_op = cat in OP_CATS
            dur = float(e.get("dur", 0))
            row = -1
            inside_opaque = any(not s.is_op and OPAQUE_RANGES.search(s.name) for s in stack)
            if not is_op and OPAQUE_RANGES.search(e["name"]) and not inside_opaque:
                op_rows.append((e, (*names, (e["name"], False)), dur))
            elif is_op and not inside_opaque:
                parent = next((s for s in reversed(stack) if s.is_op), None)
                if parent is not None:
                    child_us[parent.row] += dur
                row = len(ops)
                ops.append(e)
                child_us.append(0.0)
                op_stacks.append((*names, (e["name"], True)))
            stack.append(_Interval(ts + dur, e["name"], is_op, row))
        op_rows.extend(
            (op, st, max(float(op.get("dur", 0)) - child, 0.0))
            for op, st, child in zip(ops, op_stacks, child_us)
        )
    return launch_stacks, op_rows


class _Resolver:
    """Resolves stacks to (category, source, phase, step, layer, op), caching per name."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = list(rules)
        self._name_cache: dict[tuple[str, str], str | None] = {}
        self._struct_cache: dict[str, tuple] = {}

    def _rule_category(self, kind: str, name: str) -> str | None:
        key = (kind, name)
        if key not in self._name_cache:
            self._name_cache[key] = next(
                (r.category for r in self.rules if r.match_on == kind and r.regex.search(name)),
                None,
            )
        return self._name_cache[key]

    def _structure(self, name: str) -> tuple[str | None, int | None, int | None]:
        if name not in self._struct_cache:
            phase = step = layer = None
            for pattern, fixed_phase in PHASE_PATTERNS:
                m = pattern.search(name)
                if m:
                    groups = m.groupdict()
                    phase = fixed_phase or groups.get("phase", "").lower() or None
                    step = int(groups["step"]) if groups.get("step") else None
                    break
            m = LAYER_PATTERN.search(name)
            if m:
                layer = int(m.group("layer") or m.group("module_layer"))
            self._struct_cache[name] = (phase, step, layer)
        return self._struct_cache[name]

    def resolve(self, stack: tuple, kernel_name: str, by_stack: bool = True) -> tuple:
        """(category, source, phase, step, layer, op). With `by_stack` False (a kernel replayed
        from a CUDA graph, whose launch site is not where it was captured) the stack still
        gives phase and step, but only the kernel name gives the category."""
        category = source = phase = step = layer = op = None
        for name, is_op in reversed(stack):
            if is_op and op is None:
                op = name
            if category is None and not is_op and by_stack:
                category = self._rule_category("range", name)
                source = "range" if category else None
            if phase is None or layer is None:
                p, s, lay = self._structure(name)
                if phase is None and p is not None:
                    phase, step = p, s
                if layer is None and lay is not None:
                    layer = lay
        if category is None and by_stack:
            for name, is_op in reversed(stack):
                if is_op:
                    category = self._rule_category("op", name)
                    if category:
                        source = "op"
                        break
        if category is None:
            category = self._rule_category("kernel", kernel_name)
            source = "kernel" if category else "default"
        return category or OTHER, source, phase, step, layer, op


def _dims(value) -> str | None:
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return None


def kernel_table(
    trace: ChromeTrace, rules: Iterable[Rule] = DEFAULT_RULES, origin_us: float | None = None
) -> pd.DataFrame:
    """One row per GPU kernel (or, for a CPU-only trace, per op with its self time), attributed.

    Columns: see KERNEL_COLUMNS. `source` says what decided the category (`range`, `op`,
    `kernel` name, or `default`), so a user sees how much of a table rests on names alone.
    Times are microseconds from `origin_us` (default: the first row's start); ranks of one
    host share a clock, so a common origin lines their tables up.
    """
    resolver = _Resolver(tuple(rules))
    launch_stacks, ops = _host_stacks(trace.events)
    gpu = [e for e in trace.events if e.get("cat") in GPU_CATS]
    rows = []
    if gpu:
        for e in gpu:
            args = e.get("args") or {}
            correlation = args.get("correlation")
            stack = launch_stacks.get(correlation, ())
            launch = stack[-1][0] if stack else None
            rows.append(
                (
                    e["name"],
                    *resolver.resolve(stack[:-1], e["name"], by_stack=launch != GRAPH_LAUNCH),
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
            rows.append(
                (
                    e["name"],
                    *resolver.resolve(stack, e["name"]),
                    e["ts"],
                    self_us,
                    "cpu_op" if e.get("cat") in OP_CATS else "cpu_range",
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                )
            )
    columns = [
        "name",
        "category",
        "source",
        "phase",
        "step",
        "layer",
        "op",
        "start_us",
        "dur_us",
        "kind",
        "stream",
        "grid",
        "block",
        "registers",
        "launch",
        "correlation",
    ]
    table = pd.DataFrame(rows, columns=columns)
    if table.empty:
        raise ArtifactError(
            "the trace has neither GPU kernels nor CPU ops; was anything run under the profiler?"
        )
    table = table.sort_values("start_us", kind="stable").reset_index(drop=True)
    table["start_us"] = table["start_us"] - (
        table["start_us"].iloc[0] if origin_us is None else origin_us
    )
    table["rank"] = pd.NA
    table["phase"] = table["phase"].fillna("all" if table["phase"].isna().all() else "other")
    table["graph"] = table["launch"].eq(GRAPH_LAUNCH).fillna(False)
    return with_schema(table)


# Columns added after the first artifacts were written: older tables load with them empty.
LATER_COLUMNS = ("correlation", "rank")


def with_schema(table: pd.DataFrame) -> pd.DataFrame:
    """The kernel table's columns in order with their dtypes (a CSV round trip loses them)."""
    table = table.assign(**{c: pd.NA for c in LATER_COLUMNS if c not in table.columns})
    missing = sorted(set(KERNEL_DTYPES) - set(table.columns))
    if missing:
        raise ArtifactError(f"kernel table lacks columns {missing}; re-run the capture.")
    table = table[list(KERNEL_DTYPES)].copy()
    for col, dtype in KERNEL_DTYPES.items():
        if dtype == "Int64":
            table[col] = pd.array(pd.to_numeric(table[col]).to_numpy(dtype=float), dtype="Int64")
        elif dtype == "string":
            table[col] = table[col].astype(object).where(table[col].notna(), None).astype("string")
        else:
            table[col] = table[col].astype(dtype)
    return table


def device_of(table: pd.DataFrame) -> str:
    """'cuda' when the table holds GPU kernels, 'cpu' when it holds CPU ops."""
    return "cpu" if bool(table["kind"].str.startswith("cpu").all()) else "cuda"
