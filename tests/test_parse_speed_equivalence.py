"""The fast paths of trace parsing give what the plain definitions give.

`host_stacks` carries each open interval's context (its frames, whether it is inside an
opaque range, its innermost op) instead of rescanning the stack per event; `Resolver`
caches results per stack; `kernel_table` and `read_chrome_trace` pause the garbage
collector; `attribute_graph_replays` sorts once and writes all replays at once. Each is
checked here against a plain, slow reading of the same input (a brute-force scan of random
well-nested events, a fresh resolver, the rows in another order), and the collector is
checked to be left as it was.
"""

import gc
import json
import random
import warnings
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

import workbench
from workbench.analysis.attribute import (
    LAUNCH_CATS,
    OP_CATS,
    PYTHON_CATS,
    RANGE_CATS,
    Frame,
    Resolver,
    host_stacks,
)
from workbench.analysis.graphs import attribute_graph_replays
from workbench.analysis.rules import DEFAULT_RULES, MODULE_EVENT, OPAQUE_RANGES
from workbench.analysis.trace import ChromeTrace, kernel_table, read_chrome_trace
from workbench.artifacts import read_table
from workbench.errors import ArtifactError

FIXTURES = Path(__file__).parent / "fixtures"
RANGES = ["moe", "dense", "allreduce", "decode", "decode_attention", "wb.layer#0", "wb.layer#1"]
OPS = ["aten::mm", "aten::add", "aten::_grouped_mm", "c10d::allreduce_", "aten::linear"]
MODULES = ["Qwen2MoeSparseMoeBlock", "Linear", "Qwen2Attention", "MLP"]
KERNELS = ["nvjet_sm90_tst", "fused_moe_kernel", "elementwise_kernel", "ncclDevKernel_AllReduce"]


def _nest(rng: random.Random, start: int, end: int, depth: int, thread: dict, out: list) -> None:
    """Well-nested random children of the interval [start, end): ranges, ops, module scopes
    and launches, some starting together (ties) and some of zero duration."""
    t = start
    while depth < 6 and rng.random() < 0.85:
        t += rng.choice([0, 0, 1, 3])
        if t >= end:
            return
        kind = rng.choice(["range", "op", "op", "module", "python", "launch"])
        dur = rng.choice([0, rng.randint(0, end - t), end - t])
        event = {"ph": "X", "ts": t, "dur": dur, **thread}
        if kind == "launch":
            event |= {"cat": "cuda_runtime", "name": "cudaLaunchKernel",
                      "args": {"correlation": len(out)}}  # fmt: skip
            out.append(_kernel(rng, t + 1, len(out)))
        elif kind == "range":
            event |= {"cat": "user_annotation", "name": rng.choice(RANGES)}
        elif kind == "op":
            event |= {"cat": "cpu_op", "name": rng.choice(OPS)}
        elif kind == "module":
            event |= {"cat": "python_function", "name": f"nn.Module: {rng.choice(MODULES)}_0"}
        else:  # a Python frame that is no module: not part of the stack
            event |= {"cat": "python_function", "name": "torch/nn/functional.py(1): relu"}
        out.append(event)
        if kind != "launch":
            _nest(rng, t, t + dur, depth + 1, thread, out)
        t += dur


def _kernel(rng: random.Random, ts: int, correlation: int) -> dict:
    # A stream each: random launch times would overlap on one stream, which the kernel table
    # serialises (trace._one_at_a_time_per_stream); this test is about attribution.
    args = {"correlation": correlation, "stream": correlation, "grid": [rng.randint(1, 9), 1, 1],
            "block": [128, 1, 1], "registers per thread": 32}  # fmt: skip
    return {"ph": "X", "cat": "kernel", "name": rng.choice(KERNELS), "ts": ts, "dur": 2,
            "pid": 0, "tid": 7, "args": args}  # fmt: skip


def _random_events(seed: int) -> list[dict]:
    """Two host threads of random well-nested events, each a sequence of 20 windows."""
    rng = random.Random(seed)
    events: list[dict] = []
    for tid in (1, 2):
        for window in range(20):
            _nest(rng, 100 * window, 100 * (window + 1), 0, {"pid": 1, "tid": tid}, events)
    return events


def _is_frame(e: dict) -> bool:
    module = e["cat"] in PYTHON_CATS and MODULE_EVENT.match(e["name"]) is not None
    return e["cat"] in RANGE_CATS or e["cat"] in OP_CATS or module


def _is_opaque(e: dict) -> bool:
    return e["cat"] in RANGE_CATS and OPAQUE_RANGES.search(e["name"]) is not None


def _frames(thread: list[dict]) -> dict[int, Frame]:
    """The frame each event of a thread (sorted) opens, by the event's id."""
    seen: Counter[str] = Counter()
    frame = {}
    for e in thread:
        if e["cat"] in RANGE_CATS:
            frame[id(e)] = Frame(e["name"], "range", seen[e["name"]])
            seen[e["name"]] += 1
        elif e["cat"] in OP_CATS:
            frame[id(e)] = Frame(e["name"], "op")
        elif _is_frame(e):
            frame[id(e)] = Frame(MODULE_EVENT.match(e["name"]).group("cls"), "module")
    return frame


def _brute_force_stacks(events: list[dict]) -> tuple[dict, list]:
    """`host_stacks` by its definition: for every event, scan all the intervals of its thread
    that are open at its start (well-nested events: the sweep's stack is exactly those)."""
    threads: dict[tuple, list[dict]] = {}
    for e in events:
        if _is_frame(e) or e["cat"] in LAUNCH_CATS:
            threads.setdefault((e["pid"], e["tid"]), []).append(e)
    launch_stacks, rows = {}, []
    for thread in threads.values():
        thread.sort(key=lambda e: (e["ts"], e["cat"] in LAUNCH_CATS, -float(e["dur"])))
        frame = _frames(thread)
        self_us, stacks, opaque_rows = {}, {}, []
        for i, e in enumerate(thread):
            outer = [
                o for o in thread[:i] if id(o) in frame and o["ts"] <= e["ts"] < o["ts"] + o["dur"]
            ]
            stack = tuple(frame[id(o)] for o in outer)
            if e["cat"] in LAUNCH_CATS:
                launch_stacks[e["args"]["correlation"]] = (*stack, Frame(e["name"], "launch"))
            elif not any(_is_opaque(o) for o in outer):
                if _is_opaque(e):
                    opaque_rows.append((e, (*stack, frame[id(e)]), float(e["dur"])))
                elif e["cat"] in OP_CATS:
                    stacks[id(e)] = (e, (*stack, frame[id(e)]))
                    self_us[id(e)] = float(e["dur"])
                    parent = [o for o in outer if o["cat"] in OP_CATS]
                    if parent:
                        self_us[id(parent[-1])] -= float(e["dur"])
        rows += opaque_rows
        rows += [(e, stack, max(self_us[key], 0.0)) for key, (e, stack) in stacks.items()]
    return launch_stacks, rows


@pytest.mark.parametrize("seed", range(8))
def test_host_stacks_equal_a_brute_force_scan(seed):
    events = _random_events(seed)
    launches, rows = host_stacks(events)
    expected_launches, expected_rows = _brute_force_stacks(events)
    assert launches == expected_launches
    assert [(id(e), s, t) for e, s, t in rows] == [(id(e), s, t) for e, s, t in expected_rows]
    kinds = Counter(f.kind for _, s, _ in rows for f in s)
    assert kinds["range"] and kinds["op"] and kinds["module"]  # the seed exercises all kinds
    assert any(e["name"] == "allreduce" for e, _, _ in rows)  # opaque ranges are rows,
    op_rows = sum(e["cat"] in OP_CATS for e, _, _ in rows)
    assert op_rows < sum(e["cat"] in OP_CATS for e in events)  # and hide the ops inside


def _plain(value: object) -> object:
    """A table cell as the resolver gives it: missing values as None."""
    return None if pd.isna(value) else value


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("seed", range(4))
def test_kernel_table_attributes_each_row_as_a_fresh_resolver_would(seed, device):
    events = _random_events(seed)
    launches, ops = _brute_force_stacks(events)
    if device == "cuda":
        kernels = sorted((e for e in events if e["cat"] == "kernel"), key=lambda e: e["ts"])
        stacks = [launches[k["args"]["correlation"]][:-1] for k in kernels]
        expected = [(k["name"], float(k["dur"])) for k in kernels]
    else:
        events = [e for e in events if e["cat"] != "kernel"]
        ops = sorted(ops, key=lambda row: row[0]["ts"])
        stacks = [stack for _, stack, _ in ops]
        expected = [(e["name"], self_us) for e, _, self_us in ops]
    table = kernel_table(ChromeTrace(events, {}))
    assert list(zip(table["name"], table["dur_us"])) == expected
    fields = ["category", "source", "rule", "phase", "step", "layer", "op", "module"]
    for row, stack, (name, _) in zip(table[fields].itertuples(index=False), stacks, expected):
        fresh = Resolver(DEFAULT_RULES).resolve(stack, name)
        got = tuple(map(_plain, row))
        assert got[:3] + got[4:] == fresh[:3] + fresh[4:]
        assert got[3] == fresh.phase or (fresh.phase is None and got[3] in ("other", "all"))


def test_cached_resolutions_equal_fresh_ones_on_real_traces():
    resolver = Resolver(DEFAULT_RULES)
    for name in ("hf-qwen2moe-modules-h200.json.gz", "h200-model-2layers/trace.json.gz"):
        launches, _ = host_stacks(read_chrome_trace(FIXTURES / name).events)
        for stack in launches.values():
            for by_stack in (True, False):
                again = tuple(Frame(*f) for f in stack[:-1])  # equal, not the same object
                assert resolver.resolve(stack[:-1], "k", by_stack) == resolver.resolve(
                    again, "k", by_stack
                ) == Resolver(DEFAULT_RULES).resolve(again, "k", by_stack)  # fmt: skip


def test_the_cache_tells_graph_replays_from_eager_launches():
    resolver = Resolver(DEFAULT_RULES)
    stack = (Frame("moe", "range"), Frame("aten::mm", "op"))
    assert resolver.resolve(stack, "nvjet_sm90_tst").category == "MoE"
    assert resolver.resolve(stack, "nvjet_sm90_tst", by_stack=False).category == "Dense GEMM"
    assert resolver.resolve(stack, "nvjet_sm90_tst").category == "MoE"


@pytest.mark.parametrize("enabled", [True, False])
def test_parsing_leaves_the_garbage_collector_as_it_was(tmp_path, enabled):
    path = tmp_path / "t.json"
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0}]
    path.write_text(json.dumps({"traceEvents": events}))
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [')
    (gc.enable if enabled else gc.disable)()
    try:
        assert len(kernel_table(read_chrome_trace(path))) == 1
        assert gc.isenabled() == enabled
        with pytest.raises(ArtifactError, match="not valid JSON"):
            read_chrome_trace(broken)
        assert gc.isenabled() == enabled
        with pytest.raises(ArtifactError, match="neither GPU kernels nor CPU ops"):
            kernel_table(ChromeTrace([], {}))
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


def _attributed(kernels: pd.DataFrame, signature: pd.DataFrame) -> tuple:
    """attribute_graph_replays' table and summary, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table, summary = attribute_graph_replays(kernels, signature)
    return table, summary, [str(w.message) for w in caught]


def test_graph_replays_align_in_start_order_whatever_the_row_order():
    run = FIXTURES / "h200-graphs-2layers"
    signature = read_table(run, workbench.load(run).meta, "graph_signature")
    kernels = kernel_table(read_chrome_trace(run / "trace.json.gz"))
    shuffled = kernels.sample(frac=1.0, random_state=0)
    changed = signature.copy()
    changed.loc[10:29, "name"] = "a_kernel_the_eager_step_never_ran"
    for sig in (signature, changed):
        expected, summary, warned = _attributed(kernels, sig)
        got, shuffled_summary, shuffled_warned = _attributed(shuffled, sig)
        assert (shuffled_summary, shuffled_warned) == (summary, warned)
        assert bool(warned) == (sig is changed)
        pd.testing.assert_frame_equal(got.loc[expected.index], expected, check_exact=True)
