"""Helpers shared by the test modules: assertions, stand-ins for ncu_report's objects,
hand-written experiment rows, headless notebook runs and a real headless Chromium.

nbformat and ncu_report are imported where they are used: the GPU machine, which runs the kernel
tests through this module, has neither."""

from __future__ import annotations

import glob
import gzip
import json
import lzma
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from workbench.artifacts import ROWS_FILE, SCHEMA_VERSION, write_json_atomic
from workbench.workloads import checks

if TYPE_CHECKING:
    import nbformat

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "test-artifacts"  # ignored by git; CI keeps it as the test artifacts
ARTIFACT_DIRS = ("raw", "ncu")


def run_compile_script(script: str, *args: str, interpret: bool = False):
    """Run scripts/<script> in its own process, compiling for sm_90 (TRITON_INTERPRET unset)
    unless `interpret`: the tests import the kernels under the interpreter, which compiles
    nothing."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, f"scripts/{script}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def committed_artifacts() -> list[Path]:
    """The artifacts git holds under raw/ and ncu/ (run folders, report files), raw/'s first,
    each folder's sorted as `collect` visits them.

    The README's main job writes its run into raw/ beside the committed ones, so tests about
    what is committed (its size, docs/results.md) must not count a user's own runs. Without
    git (a source archive) every artifact there counts.
    """
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", *ARTIFACT_DIRS], cwd=ROOT, capture_output=True,
            check=True, text=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return [p for d in ARTIFACT_DIRS for p in sorted((ROOT / d).iterdir())]
    tops = {Path(*Path(f).parts[:2]) for f in listed.split("\0") if len(Path(f).parts) >= 2}
    return [ROOT / top for d in ARTIFACT_DIRS for top in sorted(tops) if top.parts[0] == d]


def expert_problem(
    ids: Tensor, experts: int, hidden: int, inter: int, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x, routing weights, gate_up, down) on the CPU for topk_ids `ids`, x and the experts in
    bf16 (E, 2I, H) and (E, H, I), scaled to unit-size outputs: one generator, so a test's
    draws stay the same whichever format it then quantises the experts to."""
    gen = torch.Generator().manual_seed(seed)
    tokens = ids.shape[0]
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    route = torch.softmax(torch.randn(tokens, ids.shape[1], generator=gen), dim=1)
    return x, route, gate_up.to(torch.bfloat16), down.to(torch.bfloat16)


def relative_error(out: Tensor, ref: Tensor) -> float:
    """The workbench's relative error, failing the test on NaN/inf in either, a shape mismatch
    or a zero reference."""
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(out64).all(), "output has NaN or inf"
    assert torch.isfinite(ref64).all(), "reference has NaN or inf"
    assert ref64.norm().item() > 0, "reference is all zeros: the comparison would prove nothing"
    return checks.relative_error(out64, ref64)


def report_as_written(path: str | Path) -> bytes:
    """A committed report's bytes as ncu writes them (committed ones are gzipped or xz-packed),
    for a stand-in ncu to write."""
    data = Path(path).read_bytes()
    unpack = {".gz": gzip.decompress, ".xz": lzma.decompress}.get(Path(path).suffix)
    return unpack(data) if unpack else data


def real_reports() -> list[str]:
    """The Nsight Compute reports from the GPU machine under ncu/ (WORKBENCH_NCU_REPORTS: a glob
    of others)."""
    pattern = os.environ.get("WORKBENCH_NCU_REPORTS", str(ROOT / "ncu" / "*.ncu-rep*"))
    return sorted(glob.glob(pattern))


# ---- stand-ins for ncu_report's objects: what NcuReport reads, with made-up numbers ----------
class Metric:
    def __init__(self, value, unit="", per_pc=None):
        self._value, self._unit, self._per_pc = value, unit, per_pc or {}

    def value(self):
        return self._value

    def unit(self):
        return self._unit

    def num_instances(self):
        return len(self._per_pc)

    def as_double(self, k):
        return float(list(self._per_pc.values())[k])

    def as_uint64(self, k):  # correlation ids are instruction addresses
        return list(self._per_pc)[k]

    def correlation_ids(self):
        return self if self._per_pc else None


class Place:
    def __init__(self, file, line):
        self._file, self._line = file, line

    def file_name(self):
        return self._file

    def line(self):
        return self._line


class Domain:
    def __init__(self, name, push_pop):
        self._name, self._push_pop = name, tuple(push_pop)

    def name(self):
        return self._name

    def push_pop_ranges(self):
        return self._push_pop

    def start_end_ranges(self):
        return ()


class Nvtx:
    def __init__(self, ranges):
        self._domain = Domain("<default domain>", ranges)

    def domains(self):
        return (0,)

    def domain_by_id(self, i):
        return self._domain


class Rule:
    def __init__(self, name, kind, message, speedup=None):
        self._name, self._kind, self._message, self._speedup = name, kind, message, speedup

    def has_rule_message(self):
        return True

    def rule_message(self):
        return {"title": self._name, "message": self._message, "type": self._kind}

    def has_speedup_estimation(self):
        return self._speedup is not None

    def speedup_estimation(self):
        import ncu_report

        return {"type": ncu_report.SpeedupType.LOCAL, "speedup": self._speedup}

    def section_identifier(self):
        return "WarpStateStats"

    def name(self):
        return self._name


STOCK = "/repo/kernels/moe/stock.py"
SOURCE = "\n".join(f"line {i}" for i in range(1, 101))
BASE = 0x7F0000


class Action:
    """What NcuReport reads of an ncu_report IAction, with made-up numbers."""

    def __init__(self, kernel, metrics, ranges=(), rules=()):
        self._kernel, self._metrics, self._ranges, self._rules = kernel, metrics, ranges, rules

    def name(self, base=None):
        return self._kernel if base is None else f"void {self._kernel}(...)"

    def metric_names(self):
        return tuple(self._metrics)

    def metric_by_name(self, name):
        return self._metrics.get(name)

    def nvtx_state(self):
        return Nvtx(self._ranges) if self._ranges else None

    def source_info(self, pc):  # 0x10 and 0x20 are line 40, 0x30 line 41, 0x40 has no line
        lines = {BASE + 0x10: 40, BASE + 0x20: 40, BASE + 0x30: 41}
        return Place(STOCK, lines[pc]) if pc in lines else None

    def source_files(self):
        return {STOCK: SOURCE}

    def sass_by_pc(self, pc):
        sass = {BASE + 0x10: "WARPGROUP.DEPBAR.LE gsb0, 0x0", BASE + 0x20: "@!P0 BRA 0x7f0020",
                BASE + 0x30: "FFMA R1, R2, R3, R1"}  # fmt: skip
        return f"  {sass.get(pc, f'LDG.E R{pc - BASE}, [R2.64]')}  "

    def rule_results(self):
        return self._rules


def moe_action(
    scale=1.0, ranges=("wb:moe:stock:T=6",), rules=(), kernel="_gate_up_kernel"
) -> Action:
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    sampled = "smsp__pcsamp_warps_issue_stalled_{}"
    pcs = {
        "barrier": {BASE + 0x10: 30, BASE + 0x30: 6},
        "wait": {BASE + 0x20: 20, BASE + 0x40: 4},
        "selected": {BASE + 0x30: 40},
        "no_instructions": {},
    }
    metrics = {
        "gpu__time_duration.sum": Metric(41000.0 * scale, "ns"),
        "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": Metric(18.0 * scale, "%"),
        "sm__inst_issued.avg.pct_of_peak_sustained_elapsed": Metric(51.0, "%"),  # 2nd choice
        "launch__registers_per_thread": Metric(128, "register/thread"),
        "launch__occupancy_limit_registers": Metric(3),
        "launch__occupancy_limit_shared_mem": Metric(4),
        "launch__occupancy_limit_warps": Metric(3),
        "launch__occupancy_limit_blocks": Metric(32),
        "launch__function_pcs": Metric(BASE, per_pc={BASE: 1}),
        stall.format("barrier"): Metric(1.61),
        stall.format("wait"): Metric(1.38),
        stall.format("selected"): Metric(1.0),
        stall.format("no_instruction"): Metric(0.25),
        sampled.format("barrier_not_issued"): Metric(99, per_pc={BASE + 0x10: 99}),
    }
    for reason, per_pc in pcs.items():
        metrics[sampled.format(reason)] = Metric(sum(per_pc.values()), per_pc=per_pc)
    return Action(kernel, metrics, ranges, rules)


# ---- experiments -----------------------------------------------------------------------------
SMALL = {"experts": 8, "top_k": 2, "hidden": 64, "expert_intermediate": 32}  # MoE shape overrides
QUICK = {"min_n": 5, "max_n": 8, "budget_s": 2.0}  # adaptive repeats, enough for statistics


def cpu_experiments(out: Path) -> Path:
    """A real sweep and A/B run, made here by the workbench's own machinery (worker processes,
    reference check, adaptive repeats) at a tiny shape: what notebooks and reports read while
    no sweep from the GPU machine is committed. Times are the interpreter's, not a GPU's."""
    from workbench.capture import experiments as ex

    common = {"out": out, "fmt": "bf16", "repeats": QUICK, "workers": 2, "progress": False,
              "timeout_s": 300, **SMALL}  # fmt: skip
    ex.sweep("moe", "num_stages", [1, 2], [3, 17], variant="stock", **common)
    ex.ab({"variant": "stock"}, {"variant": "flat"}, [3], **common)
    return out


def write_sweep(run_dir: Path, rows, param: str = "rows", values=(1, 2, 4, 8)) -> None:
    """A sweep's run.json and rows.jsonl from (value, tokens, status, ms) tuples: the statuses a
    CPU run cannot produce (spills, timeouts) for the tables that read them."""
    params = {"kernel": "moe", "param": param, "values": list(values), "tokens": [1, 512]}
    meta = {"kind": "sweep", "schema_version": SCHEMA_VERSION, "params": params}
    write_json_atomic(run_dir / "run.json", meta)
    with (run_dir / ROWS_FILE).open("w") as f:
        for value, tokens, status, ms in rows:
            row = {"param": param, "value": value, "tokens": tokens, "status": status,
                   "ms": ms, "ci_low": ms, "ci_high": ms, "key": f"{value}-{tokens}"}  # fmt: skip
            f.write(json.dumps(row) + "\n")


# ---- notebooks -------------------------------------------------------------------------------
def run_notebook(path: Path, timeout_s: int = 300) -> nbformat.NotebookNode:
    """Execute a notebook headless (nbclient) in its own folder, as JupyterLab would; the
    kernel inherits this process's environment (WORKBENCH_* variables pick the artifacts)."""
    import nbformat

    from workbench.report.notebook_export import execute

    notebook = nbformat.read(path, as_version=4)
    execute(notebook, path.parent, timeout_s)
    return notebook


def outputs(notebook: nbformat.NotebookNode, kind: str | None = None) -> list:
    """Every output of the code cells (of one output_type)."""
    found = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    return [o for o in found if kind in (None, o.output_type)]


def printed(notebook: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in outputs(notebook, "stream"))


# ---- a real browser --------------------------------------------------------------------------
def open_in_chromium(page_path: Path, screenshot: Path, full_page: bool = True) -> dict:
    """Load a page from disk in headless Chromium; report console errors, requests that leave
    the file, figures (plotly divs), the figures drawn (an SVG with traces), tables and the
    text. Saves a screenshot."""
    from playwright.sync_api import sync_playwright

    errors, remote = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "request", lambda r: remote.append(r.url) if not r.url.startswith("file:") else None
        )
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        page.wait_for_function(
            "Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".every(d => d.querySelector('svg.main-svg'))",
            timeout=30_000,
        )
        found = page.evaluate(
            "() => ({figures: document.querySelectorAll('.plotly-graph-div').length,"
            " drawn: Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".filter(d => d.querySelectorAll('svg.main-svg g.trace').length > 0).length,"
            " tables: document.querySelectorAll('table.data').length,"
            " text: document.body.innerText})"
        )
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=full_page)
        browser.close()
    return {"errors": errors, "remote": remote, **found}


def chromium_missing() -> bool:
    """Browser tests skip without Debian's chromium, except in CI, where they must run."""
    return not Path(CHROMIUM).exists() and not os.environ.get("CI")


def moe_call(variant: str, tokens: int, scale: float = 1.0) -> list[Action]:
    """One MoE call as ncu sees it: the gate-up and down GEMMs (41 and 20.5 us at scale 1) and
    an expert-count kernel of 1 us, all inside the call's NVTX range."""
    nvtx = (f"wb:moe:{variant}:T={tokens}",)
    counts = Action("_counts_kernel", {"gpu__time_duration.sum": Metric(1.0, "us")}, nvtx)
    return [
        moe_action(scale, nvtx, kernel=f"_{variant}_gate_up_kernel"),
        moe_action(scale / 2, nvtx, kernel=f"_{variant}_down_kernel"),
        counts,
    ]


def stand_in_reports(gpu: str = "NVIDIA H200"):
    """A capture set as the GPU machine writes it: stock at 6 and 4096 tokens in one report,
    flat at 6 tokens (20% faster, same counters otherwise) in another, with their metadata."""
    from workbench.analysis.ncu import NcuReport

    env = {"gpu": {"name": gpu}, "date": "2026-11-29", "git": {"commit": "0123456789ab"}}

    def meta(variant, tokens):
        return {"kind": "ncu", "kernel": "moe", "variant": variant, "tokens": tokens,
                "params": {"fmt": "fp8"}, "ncu_version": "2025.3.1",
                "environment": env}  # fmt: skip

    stock_calls = moe_call("stock", 6) + moe_call("stock", 4096, 3.0)
    stock = NcuReport(Path("moe-stock-T6-4096.ncu-rep"), stock_calls, meta("stock", [6, 4096]))
    flat = NcuReport(Path("moe-flat-T6.ncu-rep"), moe_call("flat", 6, 0.8), meta("flat", [6]))
    return [stock, flat]


# ---- profile runs: stored answers against the kernel table ----------------------------------
def profile_answers(run) -> dict:
    """Everything `show` and `report` ask a profile: the tables by category, the caption, the
    text, phases, ranks, the figure panels and (tensor-parallel) the rank skew."""
    answers = {
        "phases": run.phases,
        "ranks": run.ranks,
        "prefill": run.prefill(),
        "by_phase": run.by_phase("prefill"),
        "decode": run.decode(),
        "caption": run.decode_caption(),
        "text": run.text(),
        **{f"panel {k}": v for k, v in run.compare(run).panels().items()},
    }
    if run.ranks:
        answers["rank_skew"] = run.rank_skew()
    return answers


def assert_stored_answers_are_computed(path: Path, lazy_only: bool = True) -> None:
    """A run loaded from `path` answers from its stored tables, without reading its kernels
    (unless not `lazy_only`: some answers are not stored), exactly (to the float, dtypes and
    attrs) what its kernel table computes."""
    import pandas as pd

    import workbench
    from workbench.analysis.profile import SUMMARY, ProfileResult

    lazy = workbench.load(path)
    assert SUMMARY in lazy.meta, f"{path} stores no summary"
    stored = profile_answers(lazy)
    if lazy_only:
        assert lazy._kernels is None, "answering from the stored tables read the kernel table"
    computed = profile_answers(ProfileResult(lazy.meta, lazy.kernels, lazy.path))
    if "graph_wait_us" not in lazy.meta[SUMMARY]["caption"]:
        # Stored before the caption counted the wait before a step's graph: the rest agrees.
        wait = re.compile(r"; of the gaps, a median [\d.]+ (?:ms|us) a step is the wait .*? copies")
        for key in ("caption", "text"):
            computed[key] = wait.sub("", computed[key])
    assert stored.keys() == computed.keys()
    for key, value in stored.items():
        if isinstance(value, pd.DataFrame):
            pd.testing.assert_frame_equal(value, computed[key], check_exact=True,
                                          check_index_type=True, check_column_type=True,
                                          obj=f"{path.name}: {key}")  # fmt: skip
            assert value.attrs == computed[key].attrs, key
        else:
            assert value == computed[key], key


class HummingStandIn:
    """What the humming adapters' tests stand in for `humming.layer.HummingLayer` with: each
    subclass records how it was built (`_built`), what it loaded and that it was transformed,
    and computes humming's numbers in its own `__call__`."""

    made: list  # each subclass keeps its own list of the layers made

    def _built(self, config: tuple) -> None:
        self.config = config
        self.calls: list[tuple] = []
        type(self).made.append(self)

    def to(self, device):
        return self

    def load_from_tensors(self, tensors):
        self.tensors = tensors

    def transform(self):
        self.transformed = True
