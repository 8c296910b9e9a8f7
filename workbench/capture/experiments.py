"""Sweeps and A/B runs of a kernel's parameters, with statistics, one worker per configuration.

`ab(..., kernel="profile")` compares two whole `profile()` settings instead (the seed's
"Hybrid dense GEMM, controlled A/B": `dense="w8a16"` against `dense="hybrid"`): each arm runs
one profile of the synthetic model in its worker, and the samples are each phase's steps
(each prefill chunk, each decode step), timed from its first kernel's start to its last
kernel's end, which is what sets tokens per second.

Each (setting, tokens) runs in its own process under a watchdog (`workers.run_configs`), so a
configuration that does not compile, spills, runs out of memory, crashes or deadlocks becomes
a row with that status, like the seed's "Things that did not help" table, and the sweep goes
on. Inside the worker the inputs are built at the preset's rank shape, the output is checked
against `moe_reference` (a wrong kernel is not timed), and the launch is timed with adaptive
repeats until the median's 95% interval is tight. This module imports no torch at the top:
`load_sweep` and the result objects work on a laptop; only `measure_moe` (run in the worker)
imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from workbench.analysis.stats import adaptive_repeats, paired_ratio, ratio, summarise
from workbench.artifacts import read_meta, run_stamp, unique_run_dir
from workbench.capture.workers import read_rows, run_configs
from workbench.errors import ArtifactError, WorkbenchError
from workbench.presets import RankShapes

WORKLOAD = {"variant": "stock", "fmt": "fp8", "routing": "uniform", "seed": 0,
            "preset": "dsv4-flash-tp2", "device": None}  # fmt: skip
# GPU defaults: at least 10 samples, at most 200 or 10 s, stop once the interval is < 2 %.
REPEATS = {"min_n": 10, "max_n": 200, "rel_width": 0.02, "budget_s": 10.0}
SHAPE_FIELDS = {f.name for f in fields(RankShapes)}
GRAPH_TOKENS = 48  # at or below: time CUDA graph replays, as `workbench bench moe` does
L2_FLUSH_BYTES = 256 * 2**20  # larger than any L2 (H200: 60 MB)
SWEEP_COLUMNS = ["param", "value", "tokens", "status", "ms", "q1", "q3", "ci_low", "ci_high",
                 "n", "regs", "spills", "rel_error", "error"]  # fmt: skip
FAILURE_LABELS = {"timeout": "timeout (deadlock?)"}
MEASURE = {"moe": "measure_moe", "profile": "measure_profile"}  # kernel -> worker function
PHASES = ("prefill", "decode")
PROFILE_DECODE_TOKENS = 32  # decode steps of a profile A/B arm: 32 samples per arm


def _split(fixed: dict) -> tuple[dict, dict, dict]:
    """Keyword arguments -> (workload, shape overrides, kernel parameters)."""
    workload = {k: fixed.get(k, v) for k, v in WORKLOAD.items()}
    shapes = {k: v for k, v in fixed.items() if k in SHAPE_FIELDS}
    params = {k: v for k, v in fixed.items() if k not in WORKLOAD and k not in SHAPE_FIELDS}
    return workload, shapes, params


def _timer(fn: Callable[[], object], device, tokens: int) -> Callable[[], float]:
    """One timed launch in ms. On a GPU: CUDA events after an L2 flush; decode sizes (tokens at
    or below GRAPH_TOKENS) replay a CUDA graph of the launch, so the CPU cost of launching a
    handful of small kernels is not counted as kernel time. On the CPU: wall clock (the
    interpreter's stand-in, for tests of this machinery only). Warms up (compiles) first."""
    import torch

    fn()
    if device.type != "cuda":

        def wall() -> float:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3

        return wall
    torch.cuda.synchronize()
    launch = fn
    if tokens <= GRAPH_TOKENS:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        launch = graph.replay
    cache = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)

    def events() -> float:
        cache.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    return events


def measure_moe(config: dict) -> dict:
    """Worker entry point: build one MoE problem, check it, time it; return the result row."""
    from dataclasses import replace
    from functools import partial

    import torch

    from kernels.moe import VARIANTS, MoeWeights, last_facts, moe_reference
    from workbench.capture.bench_moe import TOLERANCE
    from workbench.capture.bench_rows import compile_facts, relative_error
    from workbench.presets import draw_routing, get_preset

    w, tokens = config["workload"], config["tokens"]
    dev = torch.device(w["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    s = replace(get_preset(w["preset"]).rank_shapes(), **config["shapes"])
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(w["seed"])
    gate_up = torch.randn(s.experts, 2 * s.expert_intermediate, s.hidden, generator=gen,
                          device=dev, dtype=dtype) * s.hidden**-0.5  # fmt: skip
    down = torch.randn(s.experts, s.hidden, s.expert_intermediate, generator=gen, device=dev,
                       dtype=dtype) * s.expert_intermediate**-0.5  # fmt: skip
    weights = MoeWeights.quantize(gate_up, down, w["fmt"])
    ids, route = draw_routing(tokens, s.experts, s.top_k, w["routing"], w["seed"] + tokens)
    x = torch.randn(tokens, s.hidden, generator=gen, device=dev, dtype=dtype)
    args = (x, torch.from_numpy(ids).to(dev), torch.from_numpy(route).to(dev), weights)
    call = partial(VARIANTS[w["variant"]], *args, **config["params"])
    error = relative_error(call(), moe_reference(*args))
    row = {"rel_error": error, **compile_facts([last_facts()])}
    if not error <= TOLERANCE:  # NaN too
        return row | {"status": "wrong"}
    samples, stopped = adaptive_repeats(_timer(call, dev, tokens), **config["repeats"])
    stats = summarise(samples)
    return row | {
        "status": "spills" if row["spills"] else "ok",
        "ms": stats.pop("median"),
        **stats,
        "samples_ms": samples,
        "stopped": stopped,
    }


def _step_spans_ms(kernels: pd.DataFrame) -> pd.Series:
    """Per step: from its first kernel's start to its last kernel's end, in ms."""
    ends = kernels["start_us"] + kernels["dur_us"]
    steps = kernels.assign(end_us=ends).groupby("step")
    return (steps["end_us"].max() - steps["start_us"].min()) / 1e3


def measure_profile(config: dict) -> dict:
    """Worker entry point of a profile A/B: one `profile()` run of an arm's settings; per phase
    its step spans as samples, with tokens per second and the Dense GEMM kernel time."""
    import tempfile

    from workbench import profile

    settings = {"decode_tokens": PROFILE_DECODE_TOKENS, **config["settings"]}
    if "decode" not in config["phases"]:
        settings["decode_tokens"] = 1  # the fewest the model takes; only prefill is read
    with tempfile.TemporaryDirectory() as tmp:
        result = profile(prompt_tokens=config["tokens"], out=tmp, progress=False, **settings)
    phases = {}
    for phase in config["phases"]:
        kernels = result.kernels[result.kernels["phase"] == phase]
        spans = _step_spans_ms(kernels)
        # The prompt is prefilled once however many streams decode after it.
        streams = int(settings.get("streams", 1))
        tokens = config["tokens"] if phase == "prefill" else len(spans) * streams
        dense = kernels[kernels["category"] == "Dense GEMM"].groupby("step")["dur_us"].sum()
        samples = spans.tolist()
        stats = summarise(samples)
        phases[phase] = {
            "ms": stats.pop("median"),
            **stats,
            "samples_ms": samples,
            "tokens_per_s": tokens / (spans.sum() / 1e3),
            "dense_ms": float(dense.median() / 1e3) if len(dense) else 0.0,
            "steps": len(spans),
        }
    return {"status": "ok", "by_phase": phases}


def _phase_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """A profile A/B's rows, one per arm, tokens and phase: a worker's row holds every phase
    of its one profile run (`by_phase`); a failed run's status stands for each of its phases.
    Runs recorded with one row per phase pass as they are."""
    if "by_phase" not in rows:
        return rows
    out = []
    for row in rows.to_dict("records"):
        measured = row.pop("by_phase")
        measured = measured if isinstance(measured, dict) else {}
        for phase in row.get("phases") or measured:
            out.append({**row, "phase": phase, **measured.get(phase, {})})
    return pd.DataFrame(out)


def _environment() -> dict:
    """GPU, driver, versions and commit of the machine the workers run on (imports torch, which
    only capturing needs; loading a sweep does not)."""
    from workbench.capture.environment import describe

    return describe()


def _run_dir(out: str | Path, run_dir: str | Path | None, name: str) -> Path:
    if run_dir is not None:
        return Path(run_dir)
    return unique_run_dir(Path(out), f"{name}-{run_stamp()}")


def _phases(phases: str | Sequence[str]) -> tuple[str, ...]:
    """A profile A/B's phases: a sequence, or a comma list as the command line gives it."""
    chosen = tuple(phases.split(",")) if isinstance(phases, str) else tuple(phases)
    unknown = [p for p in chosen if p not in PHASES]
    if not chosen or unknown:
        raise WorkbenchError(
            f"phases={phases!r}: give one or more of {', '.join(PHASES)} (e.g. phases=decode)."
        )
    return chosen


def _check_kernel(kernel: str, allowed: Sequence[str] = ("moe",)) -> None:
    if kernel not in allowed:
        raise WorkbenchError(
            f"this experiment supports kernel {' or '.join(map(repr, allowed))}, not {kernel!r}."
        )


def _percent(change: float) -> str:
    return f"{-change:.0f}% faster" if change < 0 else f"{change:.0f}% slower"


@dataclass
class SweepResult:
    """Rows of a sweep (one per value x tokens) and the run's metadata."""

    meta: dict
    rows: pd.DataFrame

    @property
    def param(self) -> str:
        return self.meta["params"]["param"]

    def table(self) -> pd.DataFrame:
        """One row per value x tokens: status, median ms, quartiles, 95% interval, facts."""
        return self.rows.reindex(columns=SWEEP_COLUMNS).reset_index(drop=True)

    def figure(self):
        """ms against tokens, one line per value, the median's 95% interval as a band."""
        from workbench.report.experiment_figures import sweep_lines

        return sweep_lines(self.table(), self.param, f"{self.meta['params']['kernel']} sweep")

    def did_not_help(self, baseline_value) -> pd.DataFrame:
        """The seed's "Things that did not help": per value against the baseline, the effect
        range across token counts where both ran, and the failures (status at param=value)."""
        table = self.table()
        base = table[(table["value"] == baseline_value) & table["ms"].notna()]
        base_ms = base.set_index("tokens")["ms"]
        out = []
        for value, group in table.groupby("value", sort=False):
            failures = []
            for status, bad in group[~group["status"].isin(["ok"])].groupby("status"):
                label = FAILURE_LABELS.get(status, status)
                where = f"{label} at {self.param}={value}"
                if len(bad) < len(group):
                    where += f" (tokens {', '.join(str(t) for t in bad['tokens'])})"
                failures.append(where)
            if value == baseline_value and not failures:
                continue
            timed = group[group["ms"].notna() & group["tokens"].isin(base_ms.index)]
            changes = (timed["ms"].to_numpy() / base_ms[timed["tokens"]].to_numpy() - 1) * 100
            if value == baseline_value or not len(changes):
                effect = ""
            elif len(changes) == 1 or changes.min() == changes.max():
                effect = _percent(changes[0])
            else:
                effect = f"between {_percent(changes.min())} and {_percent(changes.max())}"
            change = f"{self.param}={baseline_value} -> {value}"
            if value == baseline_value:
                change = f"{self.param}={value} (the baseline)"
            out.append({"change": change,
                        "effect": effect, "failures": "; ".join(failures)})  # fmt: skip
        return pd.DataFrame(out, columns=["change", "effect", "failures"])

    def to_html(self, path: str | Path, baseline_value=None) -> Path:
        """A self-contained page: the figure, the table, optionally "did not help"."""
        from workbench.report.html import HtmlPage

        page = HtmlPage(f"Sweep of {self.param}").heading("Timings").figure(self.figure())
        page.table(self.table(), caption="ms: median; ci: the median's 95% interval", digits=4)
        if baseline_value is not None:
            page.heading("Things that did not help").table(self.did_not_help(baseline_value))
        return page.metadata(self.meta).write(path)


@dataclass
class AbResult:
    """Rows of an A/B run (one per arm x tokens) and the ratio b/a per token count."""

    meta: dict
    rows: pd.DataFrame

    def table(self) -> pd.DataFrame:
        """Per tokens (and phase, for profile A/Bs): both medians, ratio = median(b)/median(a)
        (below 1: b is faster), its bootstrap 95% interval and whether it excludes 1 (the
        change exceeds the noise). Profile A/Bs pair their steps: ratio = total time of b over
        a (`stats.paired_ratio`), and each arm's tokens per second."""
        keys = ["phase", "tokens"] if "phase" in self.rows else ["tokens"]
        extra = [c for c in ("tokens_per_s", "dense_ms") if c in self.rows]
        out = []
        for key, group in self.rows.groupby(keys, sort=False):
            arms = {arm: row for arm, row in zip(group["arm"], group.to_dict("records"))}
            a, b = arms.get("a", {}), arms.get("b", {})
            line = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
            line |= {"status_a": a.get("status"), "status_b": b.get("status"),
                     "ms_a": a.get("ms"), "ms_b": b.get("ms")}  # fmt: skip
            line |= {f"{c}_{arm}": row.get(c) for c in extra for arm, row in (("a", a), ("b", b))}
            if isinstance(a.get("samples_ms"), list) and isinstance(b.get("samples_ms"), list):
                line |= _compare(a["samples_ms"], b["samples_ms"], paired="phase" in keys)
            out.append(line)
        columns = [*keys, "status_a", "status_b", "ms_a", "ms_b",
                   *(f"{c}_{arm}" for c in extra for arm in "ab"), "ratio", "ci_low", "ci_high",
                   "significant"]  # fmt: skip
        table = pd.DataFrame(out).reindex(columns=columns)
        # rows arrive as workers finish: sort by size, prefill before decode as profiles show
        return table.sort_values(keys, key=lambda c: c.map(PHASES.index) if c.name == "phase"
                                 else c, ignore_index=True)  # fmt: skip


def _compare(a: list[float], b: list[float], paired: bool) -> dict:
    """The A/B ratio of two arms' samples: paired step by step when the arms ran the same steps
    (a profile's chunks and decode steps), else the unpaired ratio of medians."""
    if paired and len(a) == len(b):
        return paired_ratio(a, b)
    return ratio(a, b)


def _configs(settings: dict[str, dict], tokens: Sequence[int], fixed: dict) -> list[dict]:
    """One worker config per (label, setting) x tokens; a setting may override the workload."""
    repeats = {**REPEATS, **fixed.pop("repeats", {})}
    configs = []
    for label, setting in settings.items():
        workload, shapes, params = _split({**fixed, **setting})
        for t in tokens:
            configs.append({"kernel": "moe", "label": label, "workload": workload,
                            "shapes": shapes, "params": params, "tokens": int(t),
                            "repeats": repeats})  # fmt: skip
    return configs


def sweep(
    kernel: str,
    param: str,
    values: Sequence,
    tokens: Sequence[int],
    out: str | Path = "raw",
    timeout_s: float = 600.0,
    run_dir: str | Path | None = None,
    workers: int | None = None,
    progress: bool = True,
    **fixed,
) -> SweepResult:
    """Time `kernel` at each value of `param` x tokens, the other settings in `fixed`.

    `fixed` holds the workload (variant, fmt, routing, seed, preset, device), shape overrides
    (RankShapes fields, for small tests), `repeats` (adaptive_repeats' arguments) and further
    kernel keywords. Rerunning with the same `run_dir` resumes an interrupted sweep.
    """
    _check_kernel(kernel)
    settings = {str(v): {param: v} for v in values}
    configs = _configs(settings, tokens, dict(fixed))
    for config, value in zip(configs, [v for v in values for _ in tokens]):
        config |= {"param": param, "value": value}
    meta = {"kind": "sweep", "params": {"kernel": kernel, "param": param, "values": list(values),
            "tokens": list(tokens), "timeout_s": timeout_s, "fixed": fixed},
            "environment": _environment()}  # fmt: skip
    path = _run_dir(out, run_dir, f"sweep-{kernel}-{param}")
    run_configs(f"{__name__}.measure_moe", configs, path, meta, timeout_s, workers, progress)
    return load_sweep(path)


def ab(
    a: dict,
    b: dict,
    tokens: Sequence[int],
    kernel: str = "moe",
    out: str | Path = "raw",
    timeout_s: float = 600.0,
    run_dir: str | Path | None = None,
    workers: int | None = None,
    progress: bool = True,
    **fixed,
) -> AbResult:
    """Run settings `a` and `b` of the same workload at each token count; `AbResult.table()`
    gives the ratio b/a with its interval.

    kernel "moe": a and b are kernel keywords or workload keys (variant, fmt, ...). kernel
    "profile": they are `profile()` keywords (dense, hybrid_m, moe, streams, ...), `tokens` are
    prompt lengths, and each arm runs one profile, read for each phase in `phases` (prefill
    and decode).
    """
    _check_kernel(kernel, tuple(MEASURE))
    fixed, recorded = dict(fixed), {}
    if kernel == "profile":
        phases = recorded["phases"] = list(_phases(fixed.pop("phases", PHASES)))
        configs = [{"kernel": "profile", "label": arm, "arm": arm, "phases": phases,
                    "settings": {**fixed, **setting}, "tokens": int(t)}
                   for arm, setting in {"a": a, "b": b}.items() for t in tokens]  # fmt: skip
    else:
        configs = _configs({"a": a, "b": b}, tokens, fixed)
        for config in configs:
            config["arm"] = config["label"]
    meta = {"kind": "ab", "params": {"kernel": kernel, "a": a, "b": b, "tokens": list(tokens),
            "timeout_s": timeout_s, "fixed": fixed, **recorded},
            "environment": _environment()}  # fmt: skip
    path = _run_dir(out, run_dir, f"ab-{kernel}")
    run_configs(f"{__name__}.{MEASURE[kernel]}", configs, path, meta, timeout_s, workers, progress)
    return load_ab(path)


def _load(run_dir: str | Path, kind: str) -> tuple[dict, pd.DataFrame]:
    meta = read_meta(run_dir)
    if meta.get("kind") != kind:
        raise ArtifactError(f"{run_dir} holds a {meta.get('kind')!r} run, not a {kind!r} one.")
    rows = pd.DataFrame(read_rows(Path(run_dir)))
    return meta, rows


def load_sweep(run_dir: str | Path) -> SweepResult:
    """A sweep from its run directory (rows.jsonl + run.json); no torch needed."""
    meta, rows = _load(run_dir, "sweep")
    if len(rows):
        order = {v: i for i, v in enumerate(meta["params"]["values"])}
        rows = rows.sort_values(["value", "tokens"], key=lambda c: c.map(order) if
                                c.name == "value" else c, kind="stable")  # fmt: skip
    return SweepResult(meta, rows)


def load_ab(run_dir: str | Path) -> AbResult:
    """An A/B run from its run directory; no torch needed."""
    meta, rows = _load(run_dir, "ab")
    return AbResult(meta, _phase_rows(rows))
