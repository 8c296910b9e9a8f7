"""Nsight Compute reports as tables: `load_ncu(path) -> NcuReport`.

Reads any `.ncu-rep` through NVIDIA's `ncu_report` package (from PyPI; it needs no GPU): one or
many kernels, with or without NVTX ranges, with or without imported source. A packed report
(`.ncu-rep.gz` or `.ncu-rep.xz`, how the committed ones are kept; see ncu_files) is unpacked
to a temporary file first, since `ncu_report` reads only paths. Pure pandas: imports
neither torch nor triton, and plotly only when a figure or page is made.

`ncu_report` loads an empty, foreign or cut-off file without complaint, as zero ranges or as the
launches before the cut, so `load_ncu` checks the file first: it exists and is not empty, it
starts with ncu's header `NVR\\0`, and its blocks (each a length-prefixed header that gives the
size of the payload after it) run exactly to the end of the file; then it must hold a launch.

Metric names change between ncu versions and chips, so every table reads them through the data
below (row -> candidate names, the first one present wins) and a metric missing from a report is
NaN, never an error. `metric_sources()` says which name each summary value came from. Check
the names against a real report before relying on them (tests/test_ncu_analysis.py does).
"""

from __future__ import annotations

import json
import math
import re
import struct
import tempfile
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

import ncu_report
import pandas as pd

from workbench.analysis.ncu_files import packing, report_stem
from workbench.errors import ArtifactError, WorkbenchError

MAGIC = b"NVR\x00"

# Rows of summary(): the seed's "Nsight Compute on the stock kernel" table and a little more.
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

# Stall reasons: cycles per issued instruction (WarpStateStats) and PC samples (SourceCounters).
STALL_RATIO = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
STALL_SAMPLES = "smsp__pcsamp_warps_issue_stalled_"  # + reason; "<reason>_not_issued" skipped
STALL_ALIASES = {"no_instructions": "no_instruction"}  # the sampled name has an extra "s"
NOT_A_STALL = "selected"  # the warp issued: sampled like a stall, never the "top stall"

TIME_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
FIGURE_KINDS = ("kernel_time", "summary", "stalls", "hotspots", "occupancy")
HOTSPOT_COLUMNS = [
    "launch", "level", "file", "line", "address", "text", "samples", "share_pct", "top_stall",
]  # fmt: skip
MAIN_LAUNCHES = 8  # text and HTML detail the longest launches only
LINK = re.compile(r"@(url|sass|source|section):([^@]*)@")  # ncu's rule-message links


# ---- checking the file ---------------------------------------------------------------------
def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _payload_size(header: bytes) -> int:
    """Field 5 of a block header (protobuf): the size of the payload that follows it."""
    i = 0
    while i < len(header):
        key, i = _varint(header, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(header, i)
            if field == 5:
                return value
        elif wire == 2:
            size, i = _varint(header, i)
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    return 0


def framing_problem(data: bytes) -> str | None:
    """Why `data` is not a whole report file (None when every block ends where the next starts)."""
    if len(data) < 8:
        return "it ends inside the file header"
    offset = 8 + struct.unpack_from("<I", data, 4)[0]
    blocks = 0
    while offset < len(data):
        if offset + 4 > len(data):
            return f"it ends inside the length of block {blocks + 1}"
        start = offset + 4
        end = start + struct.unpack_from("<I", data, offset)[0]
        if end > len(data):
            return f"it ends inside the header of block {blocks + 1}"
        try:
            offset = end + _payload_size(data[start:end])
        except (IndexError, ValueError):
            return f"the header of block {blocks + 1} is not readable"
        blocks += 1
    if offset != len(data):
        return f"it ends {offset - len(data)} bytes short of the end of block {blocks}"
    return None


def _read_report_bytes(path: Path) -> bytes:
    if not path.exists():
        raise ArtifactError(
            f"{path} does not exist; give the path of an .ncu-rep file (e.g. under ncu/) or "
            "capture one on the GPU machine with workbench.capture.ncu.capture()."
        )
    if not path.is_file():
        raise ArtifactError(f"{path} is not a file; give the path of an .ncu-rep file.")
    how = packing(path)
    if how is None:
        return path.read_bytes()
    packed, kind = path.read_bytes(), path.suffix.lstrip(".")
    if not packed.startswith(how.magic):
        raise ArtifactError(
            f"{path} is named {path.suffix} but holds no {kind} data (it starts with "
            f"{packed[:8]!r}); if it is a plain report, name it .ncu-rep."
        )
    try:
        return how.unpack(packed)
    except how.errors as err:
        raise ArtifactError(
            f"{path} is not a readable {kind} file ({err}): it is truncated or damaged. Pack "
            f"the report again with {how.command}, or give the .ncu-rep itself."
        ) from None


def _check_report(path: Path, data: bytes) -> None:
    if not data:
        raise ArtifactError(
            f"{path} is empty (0 bytes): ncu was stopped before it wrote the report. "
            "Re-run the capture."
        )
    if not data.startswith(MAGIC):
        raise ArtifactError(
            f"{path} is not an Nsight Compute report: it starts with {data[:8]!r}, not ncu's "
            f"header {MAGIC!r}. Give an .ncu-rep file written by ncu -o."
        )
    problem = framing_problem(data)
    if problem:
        raise ArtifactError(
            f"{path} is truncated or damaged: {problem} ({len(data):,} bytes). ncu_report would "
            "silently read only the launches before the damage; re-run the capture."
        )


def _openable(path: Path, data: bytes) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """(a path ncu_report can open, the folder that holds it if it is a copy): the report
    itself, or an unpacked copy of a packed one. ncu_report reads parts of a report (stall
    samples, source, rules) lazily, so the copy must live as long as the report: the folder is
    kept with it and removed when the report is dropped or the process ends."""
    if packing(path) is None:
        return path, None
    folder = tempfile.TemporaryDirectory(prefix="workbench-ncu-")
    unpacked = Path(folder.name) / f"{report_stem(path)}.ncu-rep"
    unpacked.write_bytes(data)
    return unpacked, folder


def _read_sidecar(path: Path) -> dict:
    """`<name>.json` beside the report (what capture() ran), if there is one."""
    sidecar = path.with_name(f"{report_stem(path)}.json")
    if not sidecar.is_file():
        return {}
    try:
        meta = json.loads(sidecar.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(
            f"{sidecar} (the capture's metadata) is not valid JSON ({err}); re-run the capture "
            "or remove the file."
        ) from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"{sidecar} holds no JSON object; re-run the capture.")
    return meta


def load_ncu(path: str | Path) -> NcuReport:
    """Every profiled launch of an Nsight Compute report, checked, as an NcuReport."""
    path = Path(path)
    data = _read_report_bytes(path)
    _check_report(path, data)
    openable, unpacked = _openable(path, data)
    context = ncu_report.load_report(str(openable))
    actions = [rng[i] for rng in context for i in range(len(rng))]
    if not actions:
        raise ArtifactError(
            f"{path} holds no profiled kernel launch ({len(context)} ranges, 0 launches): ncu "
            "matched no kernel, e.g. its NVTX filter matched no range. Re-run the capture."
        )
    return NcuReport(path, actions, _read_sidecar(path), (context, unpacked))


# ---- small helpers ---------------------------------------------------------------------------
def _number(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return math.nan


def _reason(name: str) -> str:
    return STALL_ALIASES.get(name, name)


def _nvtx_ranges(action) -> list[str]:
    """The NVTX ranges around a launch, outermost first; non-default domains as `domain@name`."""
    state = action.nvtx_state()
    if state is None:
        return []
    ranges = []
    for domain_id in state.domains():
        domain = state.domain_by_id(domain_id)
        prefix = "" if domain.name().startswith("<") else f"{domain.name()}@"
        ranges += [prefix + n for n in (*domain.push_pop_ranges(), *domain.start_end_ranges())]
    return ranges


def _launch_table(actions: Sequence) -> pd.DataFrame:
    """One row per launch, labelled by kernel name and innermost NVTX range (or launch index)."""
    rows = []
    for index, action in enumerate(actions):
        ranges = _nvtx_ranges(action)
        kernel = action.name()
        rows.append(
            {
                "index": index,
                "kernel": kernel,
                "function": action.name(ncu_report.IAction.NameBase_DEMANGLED),
                "nvtx": " > ".join(ranges),
                "label": f"{kernel} @ {ranges[-1]}" if ranges else f"{kernel} #{index}",
            }
        )
    table = pd.DataFrame(rows)
    repeated = table["label"].duplicated(keep=False)
    table.loc[repeated, "label"] += " #" + table.loc[repeated, "index"].astype(str)
    return table.set_index("label")


def _plain(message: str) -> str:
    """A rule message without ncu's link markup: `@url:text:link@` and friends become text."""

    def text(match: re.Match) -> str:
        parts = match.group(2).split(":")
        return parts[0] if match.group(1) == "url" else parts[-1]

    return LINK.sub(text, message)


def _source_text(sources: dict[str, list[str]], file: str, line: int) -> str:
    """A source line's text: from the source ncu imported, else from the file if it is here."""
    if not sources.get(file) and Path(file).is_file():
        sources[file] = Path(file).read_text(errors="replace").splitlines()
    lines = sources.get(file, [])
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _numeric(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(pd.to_numeric, errors="coerce").dropna(how="all")


def _rounded(frame: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """Floats rounded cell by cell: summary columns hold text too, so DataFrame.round skips them."""
    return frame.map(lambda v: round(v, digits) if isinstance(v, float) else v)


def _blank(frame: pd.DataFrame) -> pd.DataFrame:
    """Missing values as empty cells, not "nan", on a page."""
    return frame.astype(object).where(frame.notna(), "")


def _fit(frame: pd.DataFrame, width: int = 4) -> pd.DataFrame:
    """Launches as rows once there are more than `width` of them, for a readable text file or
    page table (a decode step's 134 launches would otherwise be 134 columns)."""
    return frame.T if frame.shape[1] > width else frame


# ---- the report ------------------------------------------------------------------------------
class NcuReport:
    """The launches of one Nsight Compute report and the tables made from them.

    `launches` has one row per profiled launch; its index (kernel @ innermost NVTX range, or
    kernel #index) labels the launch in every table. `meta` is the capture's `<name>.json`.
    """

    def __init__(
        self,
        path: Path,
        actions: Sequence,
        meta: dict | None = None,
        context: object = None,
        launches: pd.DataFrame | None = None,
    ):
        self.path = Path(path)
        self.meta = meta or {}
        # the loaded report (and a .gz report's unpacked file): the actions read from them
        self._context = context
        self._actions = list(actions)
        self.launches = _launch_table(self._actions) if launches is None else launches
        self._names = [frozenset(a.metric_names()) for a in self._actions]
        self._hot: dict[int, pd.DataFrame] = {}  # hot lines per launch, made on first use

    def __len__(self) -> int:
        return len(self._actions)

    def __repr__(self) -> str:
        return f"NcuReport({self.path.name!r}, {len(self)} launches)"

    @property
    def labels(self) -> list[str]:
        return list(self.launches.index)

    @property
    def title(self) -> str:
        m = self.meta
        if "kernel" in m:
            return f"{m['kernel']} / {m['variant']}, T = {', '.join(map(str, m['tokens']))}"
        return self.path.name

    def _position(self, launch: str | int) -> int:
        if isinstance(launch, int) and -len(self) <= launch < len(self):
            return launch % len(self)
        if launch in self.launches.index:
            return self.labels.index(launch)
        raise WorkbenchError(
            f"no launch {launch!r} in {self.path.name}; give an index below {len(self)} or one "
            f"of: {', '.join(self.labels)}"
        )

    # ---- metrics -------------------------------------------------------------------------
    def metrics(self, *names: str) -> pd.DataFrame:
        """Raw values of the named metrics (rows) for every launch (columns); missing is NaN."""
        values = {}
        for label, action in zip(self.labels, self._actions):
            metrics = [action.metric_by_name(n) for n in names]
            values[label] = [math.nan if m is None else m.value() for m in metrics]
        return pd.DataFrame(values, index=list(names))

    def _first(self, i: int, candidates: Sequence[str], to_us: bool = False) -> tuple:
        """(value, metric name) of the first candidate this launch has; (NaN, None) if none."""
        for name in candidates:
            if name in self._names[i]:
                metric = self._actions[i].metric_by_name(name)
                value = _number(metric.value())
                if to_us:
                    value *= TIME_TO_US.get(metric.unit(), math.nan)
                return value, name
        return math.nan, None

    def _rows(self, table: dict[str, tuple[str, ...]]) -> tuple[dict, dict]:
        values, used = {}, {}
        for row, candidates in table.items():
            found = [self._first(i, candidates, row.endswith("(us)")) for i in range(len(self))]
            values[row] = [value for value, _ in found]
            used[row] = [name for _, name in found]
        return values, used

    def summary(self) -> pd.DataFrame:
        """The headline metrics (rows) per launch (columns), like the seed's ncu table.

        Rows come from SUMMARY_METRICS (metric_sources() says which name gave each value), then
        the top stall reason by cycles per issued instruction (the issuing "selected" state
        excluded; by PC samples where the report has no cycles) and its share of the samples.
        """
        values, _ = self._rows(SUMMARY_METRICS)
        top = [self._top_stalls.get(label, (None, math.nan, math.nan)) for label in self.labels]
        for row, column in zip(TOP_STALL_ROWS, zip(*top)):
            values[row] = list(column)
        return pd.DataFrame(values, index=self.labels).T

    def metric_sources(self) -> pd.DataFrame:
        """The metric name behind each SUMMARY_METRICS value (None where the report has none)."""
        return pd.DataFrame(self._rows(SUMMARY_METRICS)[1], index=self.labels).T

    # ---- stalls --------------------------------------------------------------------------
    @cached_property
    def _stall_records(self) -> pd.DataFrame:
        """Long form: launch, reason, cycles_per_issue, samples, share_pct (of all samples)."""
        records = []
        prefix, suffix = STALL_RATIO
        for label, action, names in zip(self.labels, self._actions, self._names):
            ratios, samples = {}, {}
            for name in names:
                if name.startswith(prefix) and name.endswith(suffix):
                    reason = _reason(name[len(prefix) : -len(suffix)])
                    ratios[reason] = _number(action.metric_by_name(name).value())
                elif name.startswith(STALL_SAMPLES) and not name.endswith("_not_issued"):
                    reason = _reason(name[len(STALL_SAMPLES) :])
                    samples[reason] = _number(action.metric_by_name(name).value())
            total = sum(v for v in samples.values() if not math.isnan(v))
            for reason in sorted(ratios.keys() | samples.keys()):
                count = samples.get(reason, math.nan)
                share = 100 * count / total if total else math.nan
                records.append((label, reason, ratios.get(reason, math.nan), count, share))
        columns = ["launch", "reason", "cycles_per_issue", "samples", "share_pct"]
        return pd.DataFrame(records, columns=columns)

    def stalls(self) -> pd.DataFrame:
        """Every stall reason (rows): cycles per issued instruction and % of the PC samples,
        per launch (column groups). Each launch's shares add up to 100."""
        records = self._stall_records
        columns = pd.MultiIndex.from_product([self.labels, ["cycles_per_issue", "share_pct"]])
        if records.empty:
            return pd.DataFrame(columns=columns)
        wide = records.pivot(index="reason", columns="launch")
        wide = wide[["cycles_per_issue", "share_pct"]].swaplevel(axis=1).reindex(columns=columns)
        order = records.groupby("reason")[["share_pct", "cycles_per_issue"]].mean()
        order = order.sort_values(["share_pct", "cycles_per_issue"], ascending=False).index
        wide = wide.loc[order]
        wide.index.name = "reason"
        return wide

    @cached_property
    def _top_stalls(self) -> dict[str, tuple[str | None, float, float]]:
        """Per launch: (reason, cycles per issue, % of samples) of the top stall, by cycles per
        issued instruction where the report has them, else by samples."""
        top: dict[str, tuple[str | None, float, float]] = {}
        for key in ("share_pct", "cycles_per_issue"):  # the later key wins where it is known
            known = self._stall_records.dropna(subset=[key])
            known = known[known["reason"] != NOT_A_STALL].sort_values(key, kind="stable")
            for row in known.drop_duplicates("launch", keep="last").itertuples(index=False):
                top[row.launch] = (row.reason, row.cycles_per_issue, row.share_pct)
        return top

    # ---- source hot spots ----------------------------------------------------------------
    def _pc_samples(self, i: int) -> dict[int, dict[str, float]]:
        """Samples per instruction address and stall reason, from the PC-sampling metrics."""
        action, by_pc = self._actions[i], {}
        for name in self._names[i]:
            if not name.startswith(STALL_SAMPLES) or name.endswith("_not_issued"):
                continue
            metric = action.metric_by_name(name)
            pcs = metric.correlation_ids() if metric.value() else None
            if pcs is None:
                continue
            reason = _reason(name[len(STALL_SAMPLES) :])
            for k in range(metric.num_instances()):
                samples = metric.as_double(k)
                if samples:
                    by_reason = by_pc.setdefault(pcs.as_uint64(k), {})
                    by_reason[reason] = by_reason.get(reason, 0.0) + samples
        return by_pc

    def _hot_lines(self, i: int) -> pd.DataFrame:
        """Every sampled source line (or SASS instruction, where no line is known) of a launch.

        Plain dictionaries rather than pandas: a report holds tens of thousands of (address,
        reason) samples, and a groupby per launch would dominate the time to build the tables.
        """
        if i in self._hot:
            return self._hot[i]
        action = self._actions[i]
        start = self._first(i, ("launch__function_pcs",))[0]
        lines: dict[tuple, dict[str, float]] = {}
        for pc, by_reason in self._pc_samples(i).items():
            info = action.source_info(pc)
            known = info is not None and info.file_name() and info.line() > 0
            key = ("source", info.file_name(), info.line()) if known else ("sass", pc)
            merged = lines.setdefault(key, {})
            for reason, samples in by_reason.items():
                merged[reason] = merged.get(reason, 0.0) + samples
        # Read only where a line is known: ncu_report's source_files() is the slow call (90 ms
        # for one of torch's kernels, which map no line), 20 s of a 134-kernel step report.
        sources = {}
        if any(key[0] == "source" for key in lines):
            sources = {f: text.splitlines() for f, text in action.source_files().items()}
        rows = []
        for key, by_reason in lines.items():
            top = max(by_reason, key=by_reason.get)
            if key[0] == "source":
                text = _source_text(sources, key[1], key[2])
                rows.append(("source", key[1], key[2], "", text, sum(by_reason.values()), top))
            else:
                offset = key[1] if math.isnan(start) else key[1] - int(start)
                address = f"0x{offset:05x}"
                text = action.sass_by_pc(key[1]).strip()
                rows.append(("sass", "", None, address, text, sum(by_reason.values()), top))
        rows.sort(key=lambda row: -row[5])
        level, file, line, address, text, samples, top = list(zip(*rows)) or [()] * 7
        total = sum(samples)
        self._hot[i] = pd.DataFrame(
            {
                "launch": [self.labels[i]] * len(rows),
                "level": level,
                "file": file,
                "line": pd.array(line, dtype="Int64"),
                "address": address,
                "text": text,
                "samples": samples,
                "share_pct": [100 * count / total for count in samples],
                "top_stall": top,
            },
            columns=HOTSPOT_COLUMNS,
        )
        return self._hot[i]

    def hotspots(self, n: int = 10, launch: str | int | None = None) -> pd.DataFrame:
        """The `n` most sampled source lines of each launch (or of one), hottest first.

        Columns: launch, level ("source", or "sass" where the report maps no line), file, line,
        address (SASS offset in the function), text, samples, share_pct of the launch's samples,
        top_stall (the reason holding most of the line's samples). Triton kernels map to their
        Python lines. Empty when the report has no PC sampling (SourceCounters section).
        """
        picks = range(len(self)) if launch is None else [self._position(launch)]
        frames = [self._hot_lines(i).head(n) for i in picks]
        frames = [f for f in frames if not f.empty]
        if not frames:
            return pd.DataFrame(columns=HOTSPOT_COLUMNS)
        return pd.concat(frames, ignore_index=True)

    # ---- occupancy, rules, diff ----------------------------------------------------------
    def occupancy(self) -> pd.DataFrame:
        """Theoretical and achieved occupancy, the block limits and what sets them, per launch.

        "Limiter" names the smallest block limit(s): the resource that caps resident blocks.
        """
        values, _ = self._rows(OCCUPANCY_METRICS)
        limits = {k.removeprefix(LIMIT_PREFIX): v for k, v in values.items() if LIMIT_PREFIX in k}
        limiter = []
        for i in range(len(self)):
            known = {name: v[i] for name, v in limits.items() if not math.isnan(v[i])}
            low = min(known.values(), default=None)
            limiter.append(", ".join(k for k, v in known.items() if v == low) or None)
        values["Limiter"] = limiter
        return pd.DataFrame(values, index=self.labels).T

    def rules(self) -> pd.DataFrame:
        """ncu's own rule results per launch, the largest estimated speedup first.

        `speedup_pct` is ncu's "Est. Speedup" (local: of this launch; global: of the run).
        """
        rows = []
        for label, action in zip(self.labels, self._actions):
            for rule in action.rule_results():
                if not rule.has_rule_message():
                    continue
                message = rule.rule_message()
                speedup = rule.speedup_estimation() if rule.has_speedup_estimation() else {}
                rows.append(
                    {
                        "launch": label,
                        "section": rule.section_identifier(),
                        "rule": rule.name(),
                        "type": ncu_report.MsgType(message["type"]).name.lower(),
                        "title": message["title"],
                        "message": _plain(message["message"]),
                        "speedup_pct": _number(speedup.get("speedup")),
                        "speedup_type": (
                            ncu_report.SpeedupType(speedup["type"]).name.lower()
                            if speedup
                            else None
                        ),
                    }
                )
        columns = ["launch", "section", "rule", "type", "title", "message", "speedup_pct"]
        frame = pd.DataFrame(rows, columns=[*columns, "speedup_type"])
        return frame.sort_values("speedup_pct", ascending=False, na_position="last").reset_index(
            drop=True
        )

    def diff(self, baseline: str | int | NcuReport) -> pd.DataFrame:
        """Change of every numeric summary metric from a baseline, per launch.

        `baseline` is a launch of this report (label or index) or another NcuReport, whose
        launches pair with these by label, else by position, else (if it has one) all with it.
        Columns per launch: `change` (this minus baseline) and `change_pct` (of the baseline).
        """
        mine = _numeric(self.summary())
        if isinstance(baseline, NcuReport):
            base = _numeric(baseline.summary())
            pairs = self._pairs(baseline)
        else:
            base, reference = mine, self.labels[self._position(baseline)]
            pairs = {label: reference for label in self.labels}
        base = base.reindex(mine.index)
        out = {}
        for label, reference in pairs.items():
            change = mine[label] - base[reference]
            pct = 100 * change / base[reference].abs()
            out[(label, "change")] = change
            out[(label, "change_pct")] = pct.where(base[reference] != 0)
        return pd.DataFrame(out, index=mine.index)

    def _pairs(self, other: NcuReport) -> dict[str, str]:
        if set(self.labels) == set(other.labels):
            return {label: label for label in self.labels}
        if len(other) == len(self):
            return dict(zip(self.labels, other.labels))
        if len(other) == 1:
            return {label: other.labels[0] for label in self.labels}
        raise WorkbenchError(
            f"cannot pair the {len(self)} launches of {self.path.name} with the {len(other)} of "
            f"{other.path.name}: labels differ ({', '.join(other.labels)}). Narrow both with "
            "select() first."
        )

    def select(self, pattern: str) -> NcuReport:
        """The launches whose label matches regular expression `pattern` (e.g. "gate_up")."""
        keep = [i for i, label in enumerate(self.labels) if re.search(pattern, label)]
        if not keep:
            raise WorkbenchError(
                f"no launch label matches {pattern!r}; labels: {', '.join(self.labels)}"
            )
        return NcuReport(
            self.path,
            [self._actions[i] for i in keep],
            self.meta,
            self._context,
            self.launches.iloc[keep],
        )

    # ---- figures, text, HTML -------------------------------------------------------------
    def _durations(self) -> pd.Series:
        duration = SUMMARY_METRICS["Duration (us)"]
        return pd.Series([self._first(i, duration, True)[0] for i in range(len(self))])

    def kernel_time(self) -> pd.DataFrame:
        """Where the profiled time goes, kernel by kernel, the longest first: launches, total
        duration (us) and share of the report's. A decode step's 134 launches come to 28 kernels.

        ncu replays each launch alone with its caches flushed, so these rank a step's kernels;
        they do not add up to a served step's time (profile()'s traces do that).
        """
        frame = pd.DataFrame(
            {"kernel": self.launches["kernel"].to_numpy(), "us": self._durations().to_numpy()}
        )
        table = frame.groupby("kernel").agg(
            launches=("us", "size"), total_us=("us", "sum"), mean_us=("us", "mean")
        )
        table["share_pct"] = 100 * table["total_us"] / table["total_us"].sum()
        return table.sort_values("total_us", ascending=False)

    def main_launches(self, n: int = MAIN_LAUNCHES) -> list[str]:
        """The `n` longest launches, in report order: the ones text and HTML detail."""
        keep = set(self._durations().fillna(0).nlargest(n).index)
        return [label for i, label in enumerate(self.labels) if i in keep]

    def _main_hotspots(self) -> pd.DataFrame:
        frames = [self.hotspots(launch=label) for label in self.main_launches()]
        frames = [frame for frame in frames if not frame.empty]
        return pd.concat(frames, ignore_index=True) if frames else self.hotspots(launch=0)

    def figure(self, kind: str = "summary"):
        """A plotly figure: "kernel_time", "summary", "stalls", "hotspots" or "occupancy"."""
        if kind not in FIGURE_KINDS:
            raise WorkbenchError(f"unknown figure kind '{kind}'; known: {', '.join(FIGURE_KINDS)}")
        from workbench.report import ncu_figures

        if kind == "kernel_time":
            title = f"Profiled time by kernel: {self.title}"
            return ncu_figures.kernel_time_bars(self.kernel_time(), title)
        main = self.main_launches()
        some = f" ({len(main)} longest launches)" if len(main) < len(self) else ""
        if kind == "summary":
            summary = self.summary()[main]
            return ncu_figures.summary_bars(summary, f"ncu summary: {self.title}{some}")
        if kind == "stalls":
            stalls = self.stalls()
            stalls = stalls[main] if not stalls.empty else stalls
            return ncu_figures.stall_bars(stalls, f"Warp stalls: {self.title}{some}")
        if kind == "hotspots":
            return ncu_figures.hotspot_bars(self._main_hotspots(), f"Hot spots: {self.title}")
        return ncu_figures.occupancy_bars(self.occupancy(), f"Occupancy: {self.title}")

    def notes(self) -> list[str]:
        """One line on where the report came from, when its capture metadata is there."""
        m = self.meta
        if "ncu_version" not in m:
            return [f"{self.path.name}: {len(self)} profiled launches."]
        gpu = m.get("environment", {}).get("gpu", {}).get("name") or "unknown GPU"
        return [
            f"{self.path.name}: {len(self)} profiled launches on {gpu}, ncu {m['ncu_version']}, "
            f"captured {m.get('environment', {}).get('date', '')}; preset {m.get('preset')}, "
            f"routing {m.get('routing')}, parameters {m.get('params') or 'default'}."
        ]

    def text(self) -> str:
        """The tables as text (what capture() writes to `<name>.summary.txt`)."""
        main = self.main_launches()
        hot = self._main_hotspots()
        hot = hot.assign(file=hot["file"].map(lambda f: Path(f).name if f else f))
        rules = self.rules()
        rules = rules[rules["type"].isin(["optimization", "warning", "error"])]
        stalls = self.stalls()
        stalls = stalls[main].head(10) if not stalls.empty else stalls
        sections = [
            ("Profiled time by kernel", self.kernel_time().head(MAIN_LAUNCHES * 2)),
            ("Summary", _fit(self.summary())),
            ("Warp stalls: cycles per issued instruction, % of PC samples", stalls),
            ("Hot spots (most sampled lines)", hot.drop(columns=["level"])),
            ("Occupancy", _fit(self.occupancy())),
            ("ncu rules, largest estimated speedup first", rules.drop(columns=["message"])),
        ]
        lines = [f"Nsight Compute: {self.title}", *self.notes()]
        if len(main) < len(self):
            lines.append(f"Stalls and hot spots: the {len(main)} longest launches.")
        with pd.option_context("display.width", 250, "display.max_colwidth", 70):
            for title, frame in sections:
                body = _rounded(frame).to_string() if not frame.empty else "(none in this report)"
                lines += ["", title, body]
        return "\n".join(lines) + "\n"

    def to_html(self, path: str | Path) -> Path:
        """A self-contained page: every table with its figure, ncu's rules and the metadata."""
        from workbench.report.html import HtmlPage

        page = HtmlPage(f"Nsight Compute: {self.title}")
        for note in self.notes():
            page.text(note, css="note")
        page.heading("Profiled time by kernel").figure(self.figure("kernel_time"))
        page.table(self.kernel_time(), "each launch replayed alone, caches flushed", 1)
        page.heading("Summary").figure(self.figure("summary"))
        page.table(_blank(_fit(self.summary())))
        page.heading("Warp stalls").figure(self.figure("stalls"))
        page.table(_blank(self.stalls()), "cycles per issued instruction; % of PC samples")
        main, hot = self.main_launches(), self._main_hotspots()
        if not hot.empty:
            caption = "most sampled source lines" + (
                f" of the {len(main)} longest launches" if len(main) < len(self) else ""
            )
            page.heading("Hot spots").figure(self.figure("hotspots"))
            page.table(_blank(hot), caption)
        page.heading("Occupancy").figure(self.figure("occupancy"))
        page.table(_blank(_fit(self.occupancy())))
        rules = self.rules()
        if not rules.empty:
            page.heading("ncu rules").table(_blank(rules), "largest estimated speedup first", 1)
        page.heading("Launches").table(self.launches.reset_index())
        if self.meta:
            page.heading("Capture").metadata(self.meta, "What was captured")
        return page.write(path)
