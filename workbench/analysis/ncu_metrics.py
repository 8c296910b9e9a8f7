"""Which Nsight Compute metrics the report tables read, and how a value is read from a launch.

Metric names change between ncu versions and chips, so every table reads them through the data
below (row -> candidate names, the first one present wins) and a metric missing from a report is
NaN, never an error. `NcuReport.metric_sources()` says which name each summary value came from.
Check the names against a real report before relying on them (tests/test_ncu_analysis.py does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

CLOCK_ROW = "SM clock (MHz)"
# Over a launch of a few microseconds ncu's elapsed-cycles rate is not the clock: it read 2,235
# MHz for a 2.2 us combine and 2,075 for a 12.8 us selection kernel on H200s whose clock stops
# at 1,980 (ncu/moe-flat-T6-fmtfp8, ncu/attention-fp8-T1-partindexer_select); of the committed
# launches of 20 us or more, the highest read 1,986 (a 44 us permutation).
CLOCK_MIN_US = 20.0

# Rows of NcuReport.summary(): the seed's "Nsight Compute on the stock kernel" table and a little
# more.
SUMMARY_METRICS: dict[str, tuple[str, ...]] = {
    "Duration (us)": ("gpu__time_duration.sum",),
    "DRAM throughput (%)": (
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "Issue slots busy (%)": (
        "sm__inst_issued.avg.pct_of_peak_sustained_active",  # ncu's "Issue Slots Busy"
        "sm__inst_issued.avg.pct_of_peak_sustained_elapsed",
        "sm__issue_active.avg.pct_of_peak_sustained_elapsed",
    ),
    "Registers per thread": ("launch__registers_per_thread",),
    "Achieved occupancy (%)": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "Theoretical occupancy (%)": ("sm__maximum_warps_per_active_cycle_pct",),
    "Integer ALU pipe (%)": (
        "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
        "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_elapsed",
    ),
    "Tensor pipe (%)": (
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    ),
    "Warp cycles per issued instruction": ("smsp__average_warp_latency_per_inst_issued.ratio",),
    # The clock the launch ran at: on a power-capped card (the H200 at 700 W) a long GEMM runs
    # well below the boost clock, and two kernels can differ in it as much as in their work.
    # Shown from CLOCK_MIN_US of launch time (`clock_shown`).
    CLOCK_ROW: ("sm__cycles_elapsed.avg.per_second",),
    "L2 throughput (%)": ("lts__t_sectors.avg.pct_of_peak_sustained_elapsed",),
    "Local-memory spill requests": (
        "derived__local_spilling_requests",
        "sass__inst_executed_register_spilling",
    ),
}
TOP_STALL_ROWS = (
    "Top stall",
    "Top stall, cycles per issued instruction",
    "Top stall, % of samples",
)

# Rows of occupancy(); the "Block limit" rows also decide the "Limiter" row.
OCCUPANCY_METRICS: dict[str, tuple[str, ...]] = {
    "Theoretical occupancy (%)": ("sm__maximum_warps_per_active_cycle_pct",),
    "Achieved occupancy (%)": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "Block limit: registers": ("launch__occupancy_limit_registers",),
    "Block limit: shared memory": ("launch__occupancy_limit_shared_mem",),
    "Block limit: warps": ("launch__occupancy_limit_warps",),
    "Block limit: blocks per SM": ("launch__occupancy_limit_blocks",),
    "Registers per thread": ("launch__registers_per_thread",),
    "Threads per block": ("launch__block_size",),
    "Blocks": ("launch__grid_size",),
    "Shared memory per block (bytes)": (
        "launch__shared_mem_per_block_allocated",
        "launch__shared_mem_per_block",
    ),
    "Waves per SM": ("launch__waves_per_multiprocessor",),
}
LIMIT_PREFIX = "Block limit: "
FUNCTION_START = ("launch__function_pcs",)  # the kernel's first address: SASS offsets from it

# Stall reasons: cycles per issued instruction (WarpStateStats) and PC samples (SourceCounters).
STALL_RATIO = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
STALL_SAMPLES = "smsp__pcsamp_warps_issue_stalled_"  # + reason; "<reason>_not_issued" skipped
STALL_ALIASES = {"no_instructions": "no_instruction"}  # the sampled name has an extra "s"
NOT_A_STALL = "selected"  # the warp issued: sampled like a stall, never the "top stall"
STALL_COLUMNS = ["launch", "reason", "cycles_per_issue", "samples", "share_pct"]

TIME_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
FREQUENCY_TO_MHZ = {"hz": 1e-6, "khz": 1e-3, "mhz": 1.0, "ghz": 1e3}
# A summary row whose name ends so is converted from the metric's own unit into the row's.
ROW_UNITS = {"(us)": TIME_TO_US, "(MHz)": FREQUENCY_TO_MHZ}


def clock_shown(clock_mhz: float, duration_us: float) -> float:
    """A launch's SM clock as the summary shows it: NaN below CLOCK_MIN_US of launch time,
    where the rate ncu reads is not the clock."""
    return clock_mhz if duration_us >= CLOCK_MIN_US else math.nan


def row_unit(row: str) -> dict[str, float] | None:
    """The conversion (metric unit -> factor) a summary row's name asks for; None: as read."""
    return next((units for end, units in ROW_UNITS.items() if row.endswith(end)), None)


def number(value: object) -> float:
    """A metric value as a float; NaN for what is not a number (text, None, a bool)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return math.nan


def stall_reason(name: str) -> str:
    """The one name of a stall reason, whichever of ncu's two spellings a metric uses."""
    return STALL_ALIASES.get(name, name)


def is_stall_sample(name: str) -> bool:
    """A PC-sampling stall metric; its `_not_issued` twin is a subset of it, not a reason."""
    return name.startswith(STALL_SAMPLES) and not name.endswith("_not_issued")


def first_value(
    action, names: frozenset[str], candidates: Sequence[str], units: dict | None = None
) -> tuple[float, str | None]:
    """(value, metric name) of the first candidate the launch has (`names`: its metric names);
    (NaN, None) if none. `units` (e.g. TIME_TO_US) converts from the metric's unit; a unit it
    does not know gives NaN, never a number in the wrong unit."""
    for name in candidates:
        if name in names:
            metric = action.metric_by_name(name)
            value = number(metric.value())
            if units is not None:
                value *= units.get(str(metric.unit()).lower(), math.nan)
            return value, name
    return math.nan, None


def stall_records(
    labels: Sequence[str], actions: Sequence, names: Sequence[frozenset[str]]
) -> pd.DataFrame:
    """Long form, one row per launch and stall reason: launch, reason, cycles_per_issue,
    samples, share_pct (of the launch's samples). A reason either measure lacks is NaN there."""
    records = []
    prefix, suffix = STALL_RATIO
    for label, action, known in zip(labels, actions, names):
        ratios, samples = {}, {}
        for name in known:
            if name.startswith(prefix) and name.endswith(suffix):
                reason = stall_reason(name[len(prefix) : -len(suffix)])
                ratios[reason] = number(action.metric_by_name(name).value())
            elif is_stall_sample(name):
                reason = stall_reason(name[len(STALL_SAMPLES) :])
                samples[reason] = number(action.metric_by_name(name).value())
        total = sum(v for v in samples.values() if not math.isnan(v))
        for reason in sorted(ratios.keys() | samples.keys()):
            count = samples.get(reason, math.nan)
            share = 100 * count / total if total else math.nan
            records.append((label, reason, ratios.get(reason, math.nan), count, share))
    return pd.DataFrame(records, columns=STALL_COLUMNS)
