"""Sweeps and A/B runs of a kernel's parameters, with statistics, one worker per configuration.

`ab(..., kernel="profile")` compares two whole `profile()` settings instead (the seed's
"Hybrid dense GEMM, controlled A/B": `dense="w8a16"` against `dense="hybrid"`): each arm runs
profiles of the synthetic model, each in its own worker (two by default, in the order a b b
a), and the samples are each phase's steps (each prefill chunk, each decode step), timed from
its first kernel's start to its last kernel's end, which is what sets tokens per second.

Each (setting, tokens) runs in its own process under a watchdog (`workers.run_configs`), so a
configuration that does not compile, spills, runs out of memory, crashes or deadlocks becomes
a row with that status, like the seed's "Things that did not help" table, and the sweep goes
on. Inside the worker the inputs come from the one MoE workload builder
(`workbench.workloads.moe`, the same inputs `bench` and `ncu` use), the output is checked
against its reference (a wrong kernel is not timed), and the launch is timed by the one timer
(`workbench.capture.timing`) until the median's 95% interval is tight. This module imports no
torch at the top; only the worker functions do. The results are read by
`workbench.analysis.experiments`.

Before any worker starts, every configuration is checked and the workers placed
(`experiment_checks`): without a GPU they run preset `tiny` under the Triton interpreter, and
what does not fit the host's memory is refused. A run whose every configuration failed says
so (`AllFailedWarning`; the CLI exits non-zero).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pandas as pd

from workbench.analysis.experiments import PHASES, AbResult, SweepResult, load_ab, load_sweep
from workbench.analysis.stats import Repeats, summarise
from workbench.analysis.tables import mean_over_ranks, per_step_table
from workbench.artifacts import run_stamp, unique_run_dir
from workbench.capture.code_versions import WORKTREE, arm_packages, code_version, use_kernels_from
from workbench.capture.experiment_checks import (
    DENSE_WORKLOAD,
    SHAPE_FIELDS,
    WORKLOAD,
    Placement,
    distinct,
    place_dense,
    place_moe,
    place_profile,
    repeats,
    token_counts,
)
from workbench.capture.workers import run_configs
from workbench.errors import WorkbenchError
from workbench.workloads.profile_params import split_settings

# kernel -> worker function
MEASURE = {"moe": "measure_moe", "dense": "measure_dense", "profile": "measure_profile"}
PROFILE_DECODE_TOKENS = 32  # decode steps of a profile A/B arm: 32 samples per arm
PROFILE_RUNS = 2  # profiles per arm of a profile A/B, in the order a b b a (`ab_order`)
MEASURED = ("ok", "spills")  # statuses of rows that were timed; the others failed


class AllFailedWarning(UserWarning):
    """Every configuration of a sweep or A/B run failed: nothing was measured."""


def _split(fixed: dict, kernel: str = "moe") -> tuple[dict, dict, dict]:
    """Keyword arguments -> (workload, shape overrides, kernel parameters)."""
    defaults = DENSE_WORKLOAD if kernel == "dense" else WORKLOAD
    workload = {k: fixed.get(k, v) for k, v in defaults.items()}
    shapes = {k: v for k, v in fixed.items() if k in SHAPE_FIELDS}
    params = {k: v for k, v in fixed.items() if k not in defaults and k not in SHAPE_FIELDS}
    return workload, shapes, params


def measure_moe(config: dict) -> dict:
    """Worker entry point: build one MoE problem, check it, time it; return the result row,
    with each kernel's time per call on a GPU (`kernel_times`)."""
    use_kernels_from(config.get("code_key"))  # an A/B arm's code: before kernels is imported
    from dataclasses import replace

    import torch

    from kernels.moe import VARIANTS, last_facts, trusted_routing
    from workbench.capture.bench_rows import compile_facts
    from workbench.capture.timing import time_launch
    from workbench.capture.worker_memory import moe_bytes, oom_row
    from workbench.presets import get_preset
    from workbench.workloads.checks import moe_check_key, passes, relative_error
    from workbench.workloads.moe import expert_weights, moe_problem, reference
    from workbench.workloads.seeds import serving_dtype

    w, tokens = config["workload"], config["tokens"]
    dev = torch.device(w["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    s = replace(get_preset(w["preset"]).rank_shapes(), **config["shapes"])
    if dev.type == "cuda":  # the parent planned host memory; the GPU's is known only here
        need, free = moe_bytes(s, w["fmt"], tokens, on_gpu=True), torch.cuda.mem_get_info(dev)[0]
        if need > free:
            return oom_row(need, free, "GPU")
    dtype = serving_dtype(dev)
    weights = expert_weights(s, w["fmt"], w["seed"], dev, dtype)
    problem = moe_problem(s, tokens, w["routing"], w["seed"], dev, dtype)
    call = partial(VARIANTS[w["variant"]], *problem.args(), weights, **config["params"])
    error = relative_error(call(), reference(problem, weights))
    row = {"rel_error": error, **compile_facts([last_facts()])}
    if not passes(error, "moe", moe_check_key(w["variant"], w["fmt"])):
        return row | {"status": "wrong"}
    # checked above: the samples skip the ids' readback, as bench moe's do
    timed = trusted_routing()(call)
    timing = time_launch(timed, dev, tokens, repeats=Repeats(**config["repeats"]))
    return _timed_row(row, timing) | _kernel_parts(config, timed, dev)


def _kernel_parts(config: dict, call, device, units: int = 1) -> dict:
    """A kernel A/B row's kernels (`kernel_times.kernel_ms`, on a GPU); a sweep's row none. A
    profiler that fails leaves the measured row as it was, saying why."""
    if not config.get("kernel_times"):
        return {}
    from workbench.capture.kernel_times import kernel_ms

    try:
        return {"kernel_ms": kernel_ms(call, device, units)}
    except Exception as err:  # noqa: BLE001 (the timing stands; the breakdown is extra)
        return {"kernel_ms_error": f"{type(err).__name__}: {err}"[:300]}


def _timed_row(row: dict, timing) -> dict:
    """A checked row with its timing: status (spills or ok), median ms, its statistics and
    samples, why sampling stopped, and how it was timed."""
    stats = dict(timing.stats)
    return row | {
        "status": "spills" if row.get("spills") else "ok",
        "ms": stats.pop("median"),
        **stats,
        "samples_ms": timing.samples_ms,
        "stopped": timing.stopped,
        "timing": timing.method.record(),
    }


def measure_dense(config: dict) -> dict:
    """Worker entry point of a dense A/B arm: one layer's dense GEMMs by a backend at M rows,
    built, checked and timed as `bench dense` does its rows (`bench_dense.layer_row_plan`),
    with each kernel's time per layer on a GPU (`kernel_times`)."""
    use_kernels_from(config.get("code_key"))  # an A/B arm's code: before kernels is imported
    from dataclasses import replace

    import torch

    import kernels.dense as dense
    from workbench.capture.bench_dense import layer_copies, layer_row_plan
    from workbench.capture.timing import time_launch
    from workbench.presets import get_preset
    from workbench.workloads.dense import Layer, activations
    from workbench.workloads.seeds import serving_dtype

    w, m = config["workload"], config["tokens"]
    dev = torch.device(w["device"] or ("cuda" if torch.cuda.is_available() else "cpu"))
    s = replace(get_preset(w["preset"]).rank_shapes(), **config["shapes"])
    dtype = serving_dtype(dev)
    layer = Layer(s, layer_copies(dev), w["block"] or dense.DEFAULT_BLOCK, dtype, dev, w["seed"])
    xs = activations(m, layer.input_widths, w["seed"], dev, dtype)
    plan = layer_row_plan(w["variant"], m, layer, xs, config["params"])
    row = plan.check()
    if not row["rel_error"] <= plan.tolerance:  # NaN too
        return row | {"status": "wrong"}
    launch = plan.launch
    timing = time_launch(launch.fn, dev, m, graph=launch.graph, units=launch.units,
                         repeats=Repeats(**config["repeats"]))  # fmt: skip
    return _timed_row(row, timing) | _kernel_parts(config, launch.fn, dev, launch.units)


def _step_spans_ms(kernels: pd.DataFrame) -> pd.Series:
    """Per step: from its first kernel's start to its last kernel's end, in ms."""
    ends = kernels["start_us"] + kernels["dur_us"]
    steps = kernels.assign(end_us=ends).groupby("step")
    return (steps["end_us"].max() - steps["start_us"].min()) / 1e3


def _step_parts_ms(kernels: pd.DataFrame, phase: str) -> dict[str, float]:
    """The mean step of `phase` by part, in ms: each category's kernel time (a step without
    its kernels counts 0), their total, and the gaps between kernels inside the step's span
    (`tables.per_step_table`, which the profile's own decode table is); over the ranks of a
    tensor-parallel run, the mean of each rank's (`tables.mean_over_ranks`), as the profile's.

    Why: the ratio says a change made a step slower; these say whether its kernels got longer
    or the GPU waited between them; means add up (the categories to the total, the total and
    the gaps to the step's span where no launches overlap), where medians would not."""
    if kernels.empty:
        return {}
    table_of = partial(per_step_table, phase=phase)
    ranked = "rank" in kernels and kernels["rank"].notna().any()
    table = mean_over_ranks(kernels, table_of) if ranked else table_of(kernels)
    return {str(part): float(ms) for part, ms in table["mean_ms"].items()}


def _dense_ms(kernels: pd.DataFrame) -> float:
    """The median step's Dense GEMM kernel time in ms, a step without one counting 0, as in
    `_step_parts_ms`; over the ranks of a tensor-parallel run, each step's mean of the ranks'
    (summed over both GPUs it read twice a rank's time)."""
    dense = kernels[kernels["category"] == "Dense GEMM"]
    steps = kernels["step"].dropna().unique()
    if dense.empty or not len(steps):
        return 0.0
    if "rank" in kernels and kernels["rank"].notna().any():
        every = pd.MultiIndex.from_product(
            [steps, kernels["rank"].dropna().unique()], names=["step", "rank"]
        )
        by_rank = dense.groupby(["step", "rank"])["dur_us"].sum().reindex(every, fill_value=0)
        per_step = by_rank.groupby(level="step").mean()
    else:
        per_step = dense.groupby("step")["dur_us"].sum().reindex(steps, fill_value=0)
    return float(per_step.median() / 1e3)


def measure_profile(config: dict) -> dict:
    """Worker entry point of a profile A/B: one `profile()` run of an arm's settings; per phase
    its step spans as samples, with tokens per second, the Dense GEMM kernel time, and the
    mean step by part (`_step_parts_ms`)."""
    use_kernels_from(config.get("code_key"))  # the arm's code: before kernels is imported
    import tempfile

    from workbench.capture.debris import TEMP_PREFIX, owned_prefix
    from workbench.capture.profile_run import resolve, run_profile

    settings = {"decode_tokens": PROFILE_DECODE_TOKENS, **config["settings"]}
    if "decode" not in config["phases"]:
        settings["decode_tokens"] = 1  # the fewest the model takes; only prefill is read
    decode_tokens = settings.pop("decode_tokens")
    params, overrides = split_settings(settings)
    spec = resolve(config["tokens"], decode_tokens, **params, shape_overrides=overrides)
    with tempfile.TemporaryDirectory(prefix=owned_prefix(TEMP_PREFIX + "ab")) as tmp:
        result = run_profile(spec, tmp, progress=False)
    phases = {}
    for phase in config["phases"]:
        kernels = result.kernels[result.kernels["phase"] == phase]
        spans = _step_spans_ms(kernels)
        # The prompt is prefilled once however many streams decode after it.
        streams = int(settings.get("streams", 1))
        tokens = config["tokens"] if phase == "prefill" else len(spans) * streams
        samples = spans.tolist()
        stats = summarise(samples)
        phases[phase] = {
            "ms": stats.pop("median"),
            **stats,
            "samples_ms": samples,
            "tokens_per_s": tokens / (spans.sum() / 1e3),
            "dense_ms": _dense_ms(kernels),
            "steps": len(spans),
            "step_parts_ms": _step_parts_ms(kernels, phase),
        }
    return {"status": "ok", "by_phase": phases}


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


def _configs(settings: dict[str, dict], tokens: Sequence[int], fixed: dict,
             kernel: str = "moe") -> list[dict]:  # fmt: skip
    """One worker config per (label, setting) x tokens; a setting may override the workload."""
    timing = repeats(fixed.pop("repeats", {}))
    configs = []
    for label, setting in settings.items():
        workload, shapes, params = _split({**fixed, **setting}, kernel)
        for t in tokens:
            configs.append({"kernel": kernel, "label": label, "workload": workload,
                            "shapes": shapes, "params": params, "tokens": int(t),
                            "repeats": timing})  # fmt: skip
    return configs


def all_failed(rows: pd.DataFrame) -> str | None:
    """What to say when no configuration of a run was measured (None when one was)."""
    statuses = rows["status"] if "status" in rows else pd.Series(dtype=object)
    if statuses.isin(MEASURED).any():
        return None
    counts = ", ".join(f"{status}: {n}" for status, n in statuses.value_counts().items())
    return f"every configuration failed ({counts}); the rows' `error` says why."


def _run(kind: str, fn: str, configs: list[dict], place: Placement, meta: dict, path: Path,
         timeout_s: float, workers: int | None, progress: bool) -> None:  # fmt: skip
    """Run the placed configurations into `path`; warn when every one of them failed."""
    keywords = place.keywords()
    meta = {"kind": kind, **meta, "placement": {"gpus": place.gpus, "env": keywords["env"]},
            "environment": _environment()}  # fmt: skip
    rows = run_configs(f"{__name__}.{fn}", configs, path, meta, timeout_s, workers, progress,
                       **keywords)  # fmt: skip
    failed = all_failed(pd.DataFrame(rows))
    if failed:
        warnings.warn(failed, AllFailedWarning, stacklevel=3)


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
    (RankShapes fields, for small tests), `repeats` (adaptive_rounds' arguments) and further
    kernel keywords. Rerunning with the same `run_dir` resumes an interrupted sweep.
    """
    _check_kernel(kernel)
    tokens = token_counts(tokens)
    distinct("values", [str(v) for v in values])  # a value's label is its text
    settings = {str(v): {param: v} for v in values}
    configs = _configs(settings, tokens, dict(fixed))
    for config, value in zip(configs, [v for v in values for _ in tokens]):
        config |= {"param": param, "value": value}
    place = place_moe(configs)
    meta = {"params": {"kernel": kernel, "param": param, "values": list(values),
            "tokens": tokens, "timeout_s": timeout_s, "fixed": fixed}}  # fmt: skip
    path = _run_dir(out, run_dir, f"sweep-{kernel}-{param}")
    _run("sweep", "measure_moe", configs, place, meta, path, timeout_s, workers, progress)
    return load_sweep(path)


def ab_order(runs: int) -> list[tuple[int, str]]:
    """(run, arm) in the order the profiles of an A/B run: a b, then b a, and so on, so a
    drift over time (clocks warming, a host getting busy) weighs on both arms alike."""
    return [(r, arm) for r in range(runs) for arm in (("a", "b") if r % 2 == 0 else ("b", "a"))]


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
    runs: int | None = None,
    **fixed,
) -> AbResult:
    """Run settings `a` and `b` of the same workload at each token count; `AbResult.table()`
    gives the ratio b/a with its interval.

    kernel "moe": a and b are kernel keywords or workload keys (variant, fmt, ...). kernel
    "dense": one layer's dense GEMMs as `bench dense` times them, a and b the backend's
    keywords or workload keys (variant, block, ...), `tokens` its rows (M). Each arm runs in
    `runs` workers (default 1) at each size, in the order `ab_order`; with three or more the
    ratio's interval covers the noise between processes too, with two there is none
    (`stats.runs_median_ratio`).
    kernel "profile": they are `profile()` keywords (dense, hybrid_m, moe, streams, ...),
    `tokens` are prompt lengths, and each arm runs `runs` profiles (default PROFILE_RUNS), each
    in a fresh process, in the order `ab_order`, read for each phase in `phases` (prefill and
    decode); the ratio's interval covers the noise between runs as well as between steps
    (`stats.runs_ratio`).

    Every kind takes `code` in `a` or `b`: the kernels package that arm runs, "worktree" (the
    default: the files as they are), a git revision ("HEAD", a sha) or a folder holding one
    (`workbench.capture.code_versions`), so an edited kernel can be timed against the
    committed one by the same workload builders and timer; the metadata says which commit.
    """
    _check_kernel(kernel, tuple(MEASURE))
    tokens = token_counts(tokens)
    fixed, recorded = dict(fixed), {}
    if "code" in fixed:
        raise WorkbenchError(
            "code= says which kernels package one arm runs (a={'code': 'HEAD'}, "
            "b={'code': 'worktree'}); give it to the arms, not to both."
        )
    a, b = dict(a), dict(b)
    versions = {arm: code_version(s.pop("code", WORKTREE)) for arm, s in (("a", a), ("b", b))}
    runs = (PROFILE_RUNS if kernel == "profile" else 1) if runs is None else runs
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise WorkbenchError(f"runs={runs!r} must be an integer >= 1 (workers per arm).")
    recorded["runs"] = runs
    if kernel == "profile":
        phases = recorded["phases"] = list(_phases(fixed.pop("phases", PHASES)))
        settings = {"a": a, "b": b}
        configs = [{"kernel": "profile", "label": arm, "arm": arm, "run": r, "phases": phases,
                    "settings": {**fixed, **settings[arm]}, "tokens": t}
                   for t in tokens for r, arm in ab_order(runs)]  # fmt: skip
        place = place_profile(configs)
    else:
        by_arm = {(c["label"], c["tokens"]): c for c in _configs({"a": a, "b": b}, tokens,
                                                                 fixed, kernel)}  # fmt: skip
        # each arm's worker `runs` times at each size, in the order a b b a (`ab_order`)
        configs = [{**copy.deepcopy(by_arm[arm, t]), "arm": arm, "run": r, "kernel_times": True}
                   for t in tokens for r, arm in ab_order(runs)]  # fmt: skip
        place = place_dense(configs) if kernel == "dense" else place_moe(configs)
    for config in configs:
        version = versions[config["arm"]]
        config |= {"code": version.record(), "code_key": version.key}
    meta = {"params": {"kernel": kernel, "a": a, "b": b, "tokens": tokens,
            "timeout_s": timeout_s, "fixed": fixed, **recorded,
            "code": {arm: v.record() for arm, v in versions.items()}}}  # fmt: skip
    path = _run_dir(out, run_dir, f"ab-{kernel}")
    with arm_packages(versions.values()):
        _run("ab", MEASURE[kernel], configs, place, meta, path, timeout_s, workers, progress)
    return load_ab(path)
