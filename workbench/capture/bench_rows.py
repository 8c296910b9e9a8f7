"""What every benchmark row (MoE, dense, attention) shares: check, then time, then a status.

A row's output is compared with its fp32 reference first; a wrong kernel is reported `wrong`
and not timed, and one that runs out of memory, fails to compile or raises becomes a status
too, so a benchmark always finishes. The rows compared with each other (every contender at
one size) are checked one by one, then timed together, in turns (`capture.timing`), so no
contender's ratio carries its place in the run, and while they are timed NVML is read
(`capture.gpu_state`), so a run also says what the GPU's clocks did. Rows are printed as each
size finishes, so a run cut off by its time limit still shows what it did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import pandas as pd
import torch
from tqdm.auto import tqdm

from kernels.compiled import forget_facts, last_facts
from workbench.analysis.gpu_state import summarised
from workbench.analysis.stats import summarise
from workbench.artifacts import run_stamp, write_run
from workbench.capture.ceilings import measure_ceilings
from workbench.capture.environment import describe
from workbench.capture.gpu_state import COLUMNS as STATE_COLUMNS
from workbench.capture.gpu_state import GpuStateLog, max_sm_mhz
from workbench.capture.timing import CONTENDER_ORDER, Launch, method_for, time_launches
from workbench.errors import WorkbenchError
from workbench.presets import Preset, RankShapes, get_preset
from workbench.workloads.seeds import serving_dtype

SAMPLES_KEY = "samples_ms"  # a timed row's samples, kept out of the table (`samples_table`)
TURNS_KEY = "turns"  # the GpuStateLog of the check_then_time call that timed the row
# What a bench's GPU-state readings span; runs without it in run.json (2026-12-04, 05:02-05:13)
# read from each size's first warm-up to its last round, mostly warm-ups at decode sizes.
STATE_WINDOW = "rounds"


def time_calls(
    launches: Sequence[Launch], device: torch.device, log: GpuStateLog | None = None
) -> list[list[float] | Exception]:
    """Each launch's samples (ms per unit, one a round), all timed in turns by the workbench's
    one timer (`capture.timing.time_launches`), or the exception that stopped it; `log` is
    started as the rounds begin (the caller stops it)."""
    on_rounds = None if log is None else log.start
    timings = time_launches(launches, device, on_rounds=on_rounds)
    return [t if isinstance(t, Exception) else t.samples_ms for t in timings]


def _groups(rows: Sequence[dict]) -> dict[int, tuple[int, GpuStateLog]]:
    """Each check_then_time call's log (by id) -> (its group number, in order of first row,
    the log)."""
    groups: dict[int, tuple[int, GpuStateLog]] = {}
    for row in rows:
        if TURNS_KEY in row:
            groups.setdefault(id(row[TURNS_KEY]), (len(groups), row[TURNS_KEY]))
    return groups


def samples_table(rows: Sequence[dict]) -> pd.DataFrame:
    """The samples behind each timed row, one line a round: `row` (its position among `rows`,
    so in the bench table), `group` (the rows timed in turns together, numbered in order),
    `round`, `ms`. The i-th samples of the rows of one group come from one round, so two rows'
    ratio can be resampled by round (`stats.paired_median_ratio`)."""
    groups = _groups(rows)
    lines = [(i, groups[id(row[TURNS_KEY])][0], k, ms)
             for i, row in enumerate(rows) if SAMPLES_KEY in row
             for k, ms in enumerate(row[SAMPLES_KEY])]  # fmt: skip
    return pd.DataFrame(lines, columns=["row", "group", "round", "ms"])


def gpu_state_table(rows: Sequence[dict]) -> pd.DataFrame:
    """What NVML read while each group of `rows` was timed: `group` (as `samples_table`
    numbers it) and the sample's columns (`capture.gpu_state.COLUMNS`)."""
    lines = [{"group": group} | sample
             for group, log in _groups(rows).values() for sample in log.samples]  # fmt: skip
    return pd.DataFrame(lines, columns=["group", *STATE_COLUMNS])


def gpu_state_record(rows: Sequence[dict], state: pd.DataFrame, device: torch.device) -> dict:
    """For run.json: over what the readings span (`window`), the whole run's state summary and
    its one-line description, and the groups whose reading stopped early, with why (`gaps`);
    or why NVML was not read at all."""
    groups = _groups(rows)
    gaps = {str(group): log.unavailable for group, log in groups.values() if log.unavailable}
    if state.empty:
        why = "; ".join(sorted(set(gaps.values())))
        unread = "the GPU's state was not read" if groups else "no rows were timed"
        return {"sampled": False, "why": why or unread}
    top = max_sm_mhz(device)
    return {"sampled": True, "window": STATE_WINDOW, "max_sm_mhz": top,
            **summarised(state, top), "gaps": gaps}  # fmt: skip


def compile_facts(facts: Sequence[dict]) -> dict:
    """regs and spills: the most of any kernel in `facts` (last_facts() of several calls);
    None for torch ops and under the interpreter. `spills` is Triton's count, the kernel's
    local memory in 4-byte words (2 means 8 bytes spilled)."""
    compiled = [f for call in facts for f in call.values() if f.n_regs is not None]
    if not compiled:
        return {"regs": None, "spills": None}
    return {"regs": max(f.n_regs for f in compiled), "spills": max(f.n_spills for f in compiled)}


def call_with_facts(fn: Callable[[], torch.Tensor], facts: list[dict]) -> torch.Tensor:
    """fn(), noting the compile facts of the Triton kernels it launched (none for torch ops)."""
    forget_facts()
    out = fn()
    facts.append(last_facts())
    return out


def roofline_ms(nbytes: float, flops: float, ceilings: dict, peak: str = "bf16_flops") -> float:
    """The physical floor of a launch in ms: the larger of its bytes at the copy bandwidth and
    its FLOPs at the measured peak of the tensor-core dtype it computes in (`bf16_flops`, or
    `fp8_flops` for FP8 x FP8 kernels), both measured in the same run. A decode launch is bound
    by bytes, a prefill launch by FLOPs: its ratio to the floor means the same at every size."""
    rate = ceilings.get(peak) or ceilings["bf16_flops"]  # a CPU stand-in measures no FP8 rate
    return max(nbytes / ceilings["copy_bytes_per_s"], flops / rate) * 1e3


@dataclass(frozen=True)
class RowPlan:
    """One row to measure: its identifying columns (`row`), the check that adds `rel_error` and
    any other columns, the `tolerance` it must meet to be timed, what is timed (`launch`),
    and `judge`, the columns a timed row's `ms` gives (its floor and ratios)."""

    row: dict
    check: Callable[[], dict]
    tolerance: float
    launch: Launch
    judge: Callable[[dict], dict]


def check_then_time(plans: Sequence[RowPlan], device: torch.device) -> list[dict]:
    """Each plan's row: checked (a wrong or failing kernel is not timed), then every row that
    passed timed in turns with the others (`time_calls`), then judged, each with a status; a
    timed row carries its samples under SAMPLES_KEY and, under TURNS_KEY, the log of the GPU's
    state while this call timed (it marks the rows timed together, for `samples_table` and
    `gpu_state_table`)."""
    rows = [_checked(plan) for plan in plans]
    ready = [i for i, row in enumerate(rows) if "status" not in row]
    turns = GpuStateLog(device)
    try:
        results = time_calls([plans[i].launch for i in ready], device, turns)
    finally:
        turns.stop()
    for i, result in zip(ready, results, strict=True):
        if isinstance(result, Exception):
            rows[i] |= {"status": _failure(result)}
            continue
        summary = summarise(result)
        row = rows[i] | {
            "ms": summary["median"],
            "iqr_ms": summary["iqr"],
            SAMPLES_KEY: result,
            TURNS_KEY: turns,
        }
        rows[i] = row | plans[i].judge(row) | {"status": "spills" if row.get("spills") else "ok"}
    return rows


def _checked(plan: RowPlan) -> dict:
    """The plan's row with its check's columns, and a status if it is not to be timed."""
    try:
        row = plan.row | plan.check()
    except Exception as err:  # noqa: BLE001 (a failing configuration is a result of the sweep)
        return plan.row | {"status": _failure(err)}
    if not row["rel_error"] <= plan.tolerance:  # NaN too
        return row | {"status": "wrong"}
    return row


def _failure(err: Exception) -> str:
    """The status of a row whose check or timing raised: out of memory, a compile error, or
    another error with its message."""
    if isinstance(err, torch.OutOfMemoryError):
        torch.cuda.empty_cache()
        return "oom"
    kind = "compile-error" if "Compil" in type(err).__name__ else "error"
    return f"{kind}: {type(err).__name__}: {str(err)[:120]}"


def print_row(bar: tqdm, row: dict, keys: Sequence[str]) -> None:
    """One line per finished row, through the progress bar so they do not collide."""
    bar.write(" ".join(f"{k}={row[k]:.4g}" if isinstance(row.get(k), float) else
                       f"{k}={row.get(k)}" for k in keys))  # fmt: skip
    bar.update()


@dataclass(frozen=True)
class BenchSetup:
    """What every benchmark starts from: its device, the preset and its rank shapes (shrunk by
    overrides in the harness's tests), the ceilings measured in this run and the GPU's state
    while they were (None when the caller gave them), the seed of its workloads and the serving
    dtype (bf16; fp32 for the interpreter's CPU stand-in)."""

    device: torch.device
    preset: Preset
    shapes: RankShapes
    ceilings: dict
    seed: int
    dtype: torch.dtype
    ceilings_state: GpuStateLog | None = None


def bench_setup(
    preset: str, device: str, seed: int, ceilings: dict | None, shape_overrides: dict
) -> BenchSetup:
    """The setup of a bench run; the ceilings are measured here, NVML read meanwhile (a GEMM
    ceiling is a rate at whatever clock the power cap leaves), unless `ceilings` are given."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise WorkbenchError(
            "no CUDA GPU is visible (torch.cuda.is_available() is False): a bench times kernels "
            "against this GPU's own copy bandwidth and cuBLAS rates, so it runs on the GPU "
            "machine. Here, `workbench report raw` reads the committed benches, and `workbench "
            "profile` and `workbench ab` run the tiny preset under the Triton interpreter."
        )
    chosen = get_preset(preset)
    state = None
    if not ceilings:
        state = GpuStateLog(dev)
        try:
            ceilings = measure_ceilings(dev, on_rounds=state.start)
        finally:
            state.stop()
    return BenchSetup(
        device=dev,
        preset=chosen,
        shapes=replace(chosen.rank_shapes(), **shape_overrides),
        ceilings=ceilings,
        seed=seed,
        dtype=serving_dtype(dev),
        ceilings_state=state,
    )


def _ceilings_state(log: GpuStateLog) -> dict:
    """For run.json: the GPU's state while the ceilings' rounds ran, and why reading stopped
    (or never began) where it did."""
    record: dict = {"why": log.unavailable} if log.unavailable else {}
    if log.samples:
        record |= summarised(pd.DataFrame(log.samples))
    return record


def save_bench(
    kind: str,
    setup: BenchSetup,
    out: str,
    params: dict,
    table: pd.DataFrame,
    rows: Sequence[dict],
    graph: bool | None = None,
    **meta: object,
) -> pd.DataFrame:
    """Write `table`, the samples of its `rows` (`samples_table`; `table` holds them in the
    same order) and the GPU's state while they were timed (`gpu_state_table`) to
    `out/bench-<kind>-<preset>-<stamp>/` with its parameters, shapes, the ceilings it was
    judged by, how its rows were timed (`graph` as the rows' `Launch`es carried it), a summary
    of the GPU's state and the environment; the table notes its path, and the state's
    description, in attrs."""
    timing = {"decode": method_for(setup.device, 1, graph).record(),
              "prefill": method_for(setup.device, 10**6, graph).record(),
              "contenders": CONTENDER_ORDER}  # fmt: skip
    state = gpu_state_table(rows)
    gpu_state = gpu_state_record(rows, state, setup.device)
    if setup.ceilings_state is not None:
        gpu_state["ceilings"] = _ceilings_state(setup.ceilings_state)
    meta = {"kind": f"bench-{kind}", "params": params, "shapes": asdict(setup.shapes), **meta,
            "ceilings": setup.ceilings, "timing": timing, "gpu_state": gpu_state,
            "environment": describe()}  # fmt: skip
    run_id = f"bench-{kind}-{setup.preset.name}-{run_stamp()}"
    tables = {"bench": table, "samples": samples_table(rows), "gpu_state": state}
    table.attrs["path"] = str(write_run(out, run_id, meta, tables, packed=("samples", "gpu_state")))
    table.attrs["gpu_state"] = gpu_state.get("description") or gpu_state["why"]
    return table
