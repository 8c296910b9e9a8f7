"""Nsight Compute reports: broken files rejected clearly, the tables built right (on stand-ins
for ncu_report's objects), and, on every real report under ncu/, the tables against the report.

The real-report tests skip until a report from the GPU machine is committed under ncu/; set
WORKBENCH_NCU_REPORTS to a glob to run them on other reports.
"""

import gzip
import lzma
import math
import os
import re
import struct
from pathlib import Path

import ncu_report
import pandas as pd
import pytest
from helpers import STOCK, Action, Metric, Rule, moe_action, real_reports, stand_in_reports

from workbench.analysis.ncu import SUMMARY_METRICS, NcuReport, load_ncu
from workbench.analysis.ncu_files import MAGIC, PACKINGS, framing_problem, packing, report_stem
from workbench.analysis.ncu_metrics import CLOCK_MIN_US, clock_shown, first_value, row_unit
from workbench.analysis.ncu_rules import plain
from workbench.analysis.ncu_source import instruction_name, readable_path
from workbench.analysis.ncu_text import diff_tables, diff_text, percent, significant
from workbench.errors import ArtifactError, WorkbenchError
from workbench.report.ncu_page import FIGURE_KINDS, ncu_figure, write_ncu_page
from workbench.views.ncu import NcuCatalogResult, NcuResult

REPO = Path(__file__).resolve().parents[1]


# ---- broken files ----------------------------------------------------------------------------
def framed(*blocks: tuple[bytes, bytes]) -> bytes:
    """A file in ncu's framing: magic, file header, then (block header, payload) pairs."""
    data = MAGIC + struct.pack("<I", 2) + b"\x08\x07"
    for header, payload in blocks:
        data += struct.pack("<I", len(header)) + header + payload
    return data


def block(payload: bytes, declared: int | None = None) -> tuple[bytes, bytes]:
    size = len(payload) if declared is None else declared
    varint = bytes([size & 0x7F | 0x80, size >> 7]) if size > 127 else bytes([size])
    return b"\x08\x01\x28" + varint + b"\x32\x02ab", payload  # fields 1, 5 (size), 6


def test_framing_of_whole_and_cut_files():
    whole = framed(block(b"x" * 300), block(b""), block(b"y" * 5))
    assert framing_problem(whole) is None
    assert "short of the end of block 3" in framing_problem(whole[:-2])
    assert "inside the header of block 2" in framing_problem(whole[:330])
    assert "inside the length of block 2" in framing_problem(
        whole[: len(framed(block(b"x" * 300))) + 2]
    )
    assert "file header" in framing_problem(MAGIC + b"\x02")
    assert "not readable" in framing_problem(framed((b"\x0f\x00", b"")))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("dir", "is not a file"),
        (b"", r"is empty \(0 bytes\)"),
        (os.urandom(4096), "is not an Nsight Compute report"),
        (b"==PROF== Connected to process\n", "is not an Nsight Compute report"),
        (framed(block(b"z" * 500, declared=900)), "is truncated or damaged: it ends 400 bytes"),
        (framed(block(b"z" * 50))[:-60], "is truncated or damaged"),
        (framed(), "holds no profiled kernel launch"),
    ],
)
def test_broken_files_are_rejected_clearly(tmp_path, content, message):
    path = tmp_path / "capture.ncu-rep"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ArtifactError, match=message):
        load_ncu(path)


def test_a_report_named_without_its_packing_loads_the_packed_one():
    """The committed reports are `.ncu-rep.xz`; asked for as `.ncu-rep` (the name ncu gave
    it), the report loads from its packed form, and its path says which file was read."""
    pytest.importorskip("ncu_report")
    report = load_ncu(REPO / "ncu/moe-flat-T6-fmtint4.ncu-rep")
    assert report.path.name == "moe-flat-T6-fmtint4.ncu-rep.xz"
    assert len(report.launches) == 5 and report.meta["kernel"] == "moe"


def test_rule_messages_lose_their_link_markup():
    message = (
        "See the @url:Best Practices Guide:https://docs.nvidia.com/x#y@ and "
        "@section:WarpStateStats:Warp State@, line @source:/k/stock.py:88:88@ at @sass:0x1f0:here@."
    )
    assert plain(message) == "See the Best Practices Guide and Warp State, line 88 at here."


# ---- tables, on stand-ins for ncu_report's objects (tests/helpers.py) ----------------------
def stand_in(cls: type[NcuReport] = NcuReport) -> NcuReport:
    """Two MoE launches (one with rules) and a small torch kernel, as a `cls`."""
    rules = (
        Rule("CPIStall", ncu_report.MsgType.OPTIMIZATION, "Barrier @url:docs:https://x@", 36.0),
        Rule("Occupancy", ncu_report.MsgType.WARNING, "Registers limit occupancy.", 12.5),
        Rule("Info", ncu_report.MsgType.OK, "Fine."),
    )
    actions = [
        moe_action(rules=rules),
        moe_action(2.0, ranges=("wb:moe:stock:T=4096",)),
        Action("vectorized_elementwise_kernel", {"gpu__time_duration.sum": Metric(2.0, "us")}),
    ]
    return cls(Path("moe-stock.ncu-rep"), actions)


@pytest.fixture
def report() -> NcuReport:
    return stand_in()


def test_launches_are_labelled_by_kernel_and_range(report):
    assert report.labels == [
        "_gate_up_kernel @ wb:moe:stock:T=6",
        "_gate_up_kernel @ wb:moe:stock:T=4096",
        "vectorized_elementwise_kernel #2",
    ]
    assert report.launches.loc[report.labels[0], "function"] == "void _gate_up_kernel(...)"
    twice = NcuReport(Path("x.ncu-rep"), [moe_action(), moe_action()])
    assert twice.labels == [
        "_gate_up_kernel @ wb:moe:stock:T=6 #0",
        "_gate_up_kernel @ wb:moe:stock:T=6 #1",
    ]


def test_summary_reads_the_first_metric_present_and_tolerates_missing_ones(report):
    summary = report.summary()
    assert list(summary.index[: len(SUMMARY_METRICS)]) == list(SUMMARY_METRICS)
    first, second, small = report.labels
    assert summary.loc["Duration (us)", first] == pytest.approx(41.0)  # ns -> us
    assert summary.loc["Duration (us)", small] == pytest.approx(2.0)
    assert summary.loc["DRAM throughput (%)", second] == pytest.approx(36.0)
    assert summary.loc["Issue slots busy (%)", first] == 51.0
    assert math.isnan(summary.loc["Tensor pipe (%)", first])
    assert math.isnan(summary.loc["DRAM throughput (%)", small])
    sources = report.metric_sources()
    assert sources.loc["Issue slots busy (%)", first] == (
        "sm__inst_issued.avg.pct_of_peak_sustained_elapsed"
    )
    assert pd.isna(sources.loc["Tensor pipe (%)", first])
    raw = report.metrics("launch__registers_per_thread", "no__such_metric")
    assert raw.loc["launch__registers_per_thread", first] == 128
    assert pd.isna(raw.loc["launch__registers_per_thread", small])
    assert raw.loc["no__such_metric"].isna().all()
    # the top stall by cycles per issued instruction, never the issuing "selected" state
    assert summary.loc["Top stall", first] == "barrier"
    assert summary.loc["Top stall, cycles per issued instruction", first] == 1.61
    assert summary.loc["Top stall, % of samples", first] == pytest.approx(100 * 36 / 100)
    assert pd.isna(summary.loc["Top stall", small])


def test_stall_shares_add_up_to_100(report):
    stalls = report.stalls()
    first = report.labels[0]
    shares = stalls[(first, "share_pct")]
    assert shares.sum() == pytest.approx(100.0)
    assert shares["selected"] == pytest.approx(40.0) and shares["no_instruction"] == 0.0
    assert "barrier_not_issued" not in stalls.index  # a subset of "barrier", not a reason
    assert stalls.loc["no_instruction", (first, "cycles_per_issue")] == 0.25  # names merged
    assert stalls[(report.labels[2], "share_pct")].isna().all()


def test_hotspots_group_addresses_by_source_line(report):
    hot = report.hotspots(n=5, launch=0)
    assert list(hot["level"]) == ["source", "source", "sass"]
    top = hot.iloc[0]
    assert (top["file"], top["line"], top["text"]) == ("kernels/moe/stock.py", 40, "line 40")
    assert STOCK == "/repo/kernels/moe/stock.py"  # the capture machine's path, shown relative
    assert top["samples"] == 50 and top["top_stall"] == "barrier"  # 30 barrier + 20 wait
    assert hot.iloc[1]["top_stall"] == "selected" and hot.iloc[1]["line"] == 41
    sass = hot.iloc[2]
    assert (sass["address"], sass["text"]) == ("0x00040", "LDG.E R64, [R2.64]")
    assert hot["share_pct"].sum() == pytest.approx(100.0)
    assert list(report.hotspots(n=1)["launch"]) == report.labels[:2]  # none for the third


@pytest.mark.parametrize(
    ("sass", "name"),
    [
        ("@!P0  BRA 0x7fe59f7f37d0", "BRA"),
        ("QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR24], RZ, !UPT", "QGMMA"),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x0", "WARPGROUP.DEPBAR"),
        ("BAR.SYNC.DEFER_BLOCKING 0x0, 0x80", "BAR.SYNC"),
        ("IMAD.MOV.U32 R2, RZ, RZ, R208", "IMAD.MOV"),
        ("IMAD.U32 R3, RZ, RZ, UR19", "IMAD"),
        ("UTMALDG.2D [UR8], [UR6]", "UTMALDG"),
        ("FENCE.VIEW.ASYNC.S", "FENCE.VIEW"),
        ("NOP", "NOP"),
        ("", "?"),
    ],
)
def test_instruction_name_keeps_the_opcode(sass, name):
    assert instruction_name(sass) == name


def test_instruction_stalls_sum_samples_by_opcode_and_reason(report):
    table = report.instruction_stalls(launch=0)
    rows = list(zip(table["instruction"], table["reason"], table["samples"]))
    assert rows == [
        ("FFMA", "selected", 40),
        ("WARPGROUP.DEPBAR", "barrier", 30),
        ("BRA", "wait", 20),
        ("FFMA", "barrier", 6),
        ("LDG", "wait", 4),
    ]
    assert table["share_pct"].sum() == pytest.approx(100.0)
    assert (
        report.instruction_stalls(n=2)["launch"].tolist()
        == [report.labels[0]] * 2 + [report.labels[1]] * 2
    )  # the third launch has no samples
    assert "Samples by SASS instruction and stall" in report.text()


def test_kernel_time_adds_up_each_kernels_launches(report):
    table = report.kernel_time()
    assert list(table.index) == ["_gate_up_kernel", "vectorized_elementwise_kernel"]
    assert list(table["launches"]) == [2, 1]
    assert list(table["total_us"]) == pytest.approx([41.0 + 82.0, 2.0])
    assert table.loc["_gate_up_kernel", "mean_us"] == pytest.approx(61.5)
    assert list(table["share_pct"]) == pytest.approx([100 * 123 / 125, 100 * 2 / 125])


def test_occupancy_names_the_limiter(report):
    occupancy = report.occupancy()
    assert occupancy.loc["Limiter", report.labels[0]] == "registers, warps"
    assert pd.isna(occupancy.loc["Limiter", report.labels[2]])


def test_rules_come_with_their_speedup(report):
    rules = report.rules()
    assert list(rules["rule"]) == ["CPIStall", "Occupancy", "Info"]
    assert list(rules["type"]) == ["optimization", "warning", "ok"]
    assert rules.loc[0, "message"] == "Barrier docs" and rules.loc[0, "speedup_type"] == "local"


def test_diff_against_a_launch_and_against_a_report(report):
    diff = report.diff(0)
    assert (diff[(report.labels[0], "change")].dropna() == 0).all()
    second = report.labels[1]
    assert diff.loc["Duration (us)", (second, "change")] == pytest.approx(41.0)
    assert diff.loc["Duration (us)", (second, "change_pct")] == pytest.approx(100.0)
    itself = report.diff(report)
    assert (itself.xs("change", axis=1, level=1).fillna(0) == 0).all().all()
    one = report.select("T=6$")
    against_one = report.diff(one)
    assert against_one.loc["Duration (us)", (second, "change")] == pytest.approx(41.0)
    # no range to read tokens from: the two gate-up launches pair with the first two by position
    three = NcuReport(Path("y.ncu-rep"), [moe_action(ranges=())] * 3)
    paired = report.select("gate_up").pairs(three)
    assert list(paired.pairs.values()) == three.labels[:2] and paired.only_baseline == [
        three.labels[2]
    ]
    torch_only = NcuReport(Path("z.ncu-rep"), [report._actions[2]] * 2)
    with pytest.raises(WorkbenchError, match="runs a kernel of.*--select REGEX"):
        report.select("gate_up").diff(torch_only)
    with pytest.raises(WorkbenchError, match="no launch 'nope'"):
        report.diff("nope")


def test_select_keeps_labels(report):
    picked = report.select("T=4096")
    assert picked.labels == [report.labels[1]] and len(picked) == 1
    with pytest.raises(WorkbenchError, match="no launch label matches"):
        report.select("down_kernel")


def test_flat_pairs_with_stock_by_kernel_tokens_and_position():
    stock, flat = stand_in_reports()  # stock: T=6 and T=4096 calls; flat: T=6
    paired = flat.pairs(stock)
    assert paired.pairs == {
        "_flat_gate_up_kernel @ wb:moe:flat:T=6": "_stock_gate_up_kernel @ wb:moe:stock:T=6",
        "_flat_down_kernel @ wb:moe:flat:T=6": "_stock_down_kernel @ wb:moe:stock:T=6",
        "_counts_kernel @ wb:moe:flat:T=6": "_counts_kernel @ wb:moe:stock:T=6",
    }
    assert paired.only_here == [] and all("4096" in label for label in paired.only_baseline)
    assert "Only in moe-stock-T6-4096.ncu-rep" in paired.notes(flat.path.name, stock.path.name)[0]
    diff = flat.diff(stock)
    gate_up = "_flat_gate_up_kernel @ wb:moe:flat:T=6"
    assert diff.loc["Duration (us)", (gate_up, "change_pct")] == pytest.approx(-20.0)
    backwards = stock.pairs(flat)  # stock's 4096-token launches have no partner left
    assert len(backwards.pairs) == 3 and all("4096" in x for x in backwards.only_here)
    assert stock.select("gate_up").pairs(flat.select("gate_up")).pairs == {
        "_stock_gate_up_kernel @ wb:moe:stock:T=6": gate_up,
        "_stock_gate_up_kernel @ wb:moe:stock:T=4096": gate_up,  # one launch: all with it
    }


def test_diff_text_is_rounded_and_names_what_is_left_out():
    stock, flat = stand_in_reports()
    text = diff_text(flat, stock)
    assert "Only in moe-stock-T6-4096.ncu-rep (not compared)" in text
    assert "-20.0" in text and "41" in text and "32.8" in text  # 41 us -> 32.8 us, -20.0%
    assert not re.search(r"\d\.\d{5,}", text), text  # no unrounded floats
    tables = diff_tables(flat, stock)
    assert list(tables.overview.columns) == [
        "baseline launch", "baseline (us)", "this (us)", "change (%)"
    ]  # fmt: skip
    one = tables.launches["_flat_gate_up_kernel @ wb:moe:flat:T=6"]
    assert one.loc["Duration (us)"].tolist() == ["41", "32.8", "-8.2", "-20.0"]
    assert one.loc["Top stall"].tolist() == ["barrier", "barrier", "", ""]


@pytest.mark.parametrize(
    ("value", "text"),
    [(410.75, "411"), (21.634, "21.6"), (0.062345, "0.0623"), (127.0, "127"), (0.0, "0"),
     (12345.6, "12,346"), (-0.5, "-0.5"), (math.nan, ""), ("wait", "wait"), (None, "")],
)  # fmt: skip
def test_significant_digits(value, text):
    assert significant(value) == text


def test_percentages_have_one_decimal():
    assert percent(26.94) == "26.9" and percent(-41.25, sign=True) == "-41.2"
    assert percent(3.0, sign=True) == "+3.0" and percent(math.nan) == ""
    assert significant(8.2, sign=True) == "+8.2"


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/work/main/.snap/kernels/moe/stock.py", "kernels/moe/stock.py"),  # the GPU box's
        ("/root/src/work/kernels/dense/w8a8.py", "kernels/dense/w8a8.py"),
        ("/root/x/kernels/moe/since_removed.py", "kernels/moe/since_removed.py"),
        ("/home/u/workbench/scripts/tune_moe.py", "scripts/tune_moe.py"),
        ("/opt/torch/.venv/lib/python3.12/site-packages/triton/language/standard.py",
         "triton/language/standard.py"),
        ("/usr/lib/python3/dist-packages/torch/include/ATen/core/Tensor.h",
         "torch/include/ATen/core/Tensor.h"),
        ("/root/.triton/cache/Q2XJ6L/_stock_gate_up_kernel.py",
         "triton cache: _stock_gate_up_kernel.py"),
        ("/tmp/torchinductor_root/ab/cabq6x.py", "inductor cache: cabq6x.py"),
        ("/var/lib/jenkins/workspace/aten/src/ATen/native/cuda/Reduce.cuh",
         "torch/…/Reduce.cuh"),
        ("/usr/local/cuda/include/cuda_fp16.hpp", "…/include/cuda_fp16.hpp"),
        ("", ""),
    ],
)  # fmt: skip
def test_source_paths_read_as_a_reader_knows_them(path, shown):
    assert readable_path(path) == shown


def test_text_figures_and_page(report, tmp_path):
    text = report.text()
    for title in ("Profiled time by kernel", "Summary", "Warp stalls", "Hot spots", "Occupancy"):
        assert title in text
    assert "stock.py" in text and "Info" not in text  # rules that passed are left out
    for kind in FIGURE_KINDS:
        assert ncu_figure(report, kind).data
    with pytest.raises(WorkbenchError, match="unknown figure kind"):
        ncu_figure(report, "roofline")
    page = write_ncu_page(report, tmp_path / "ncu.html").read_text()
    assert page.count('class="plotly-graph-div"') == len(FIGURE_KINDS)
    assert "Samples by SASS instruction and stall" in page and "WARPGROUP.DEPBAR" in page


def test_the_facade_draws_with_the_report_functions(tmp_path):
    result = stand_in(NcuResult)
    assert isinstance(result.select("T=6$"), NcuResult)
    assert result.figure("stalls").to_json() == ncu_figure(result, "stalls").to_json()
    with pytest.raises(WorkbenchError, match="unknown figure kind"):
        result.figure("roofline")
    page = result.to_html(tmp_path / "ncu.html").read_text()
    assert page.count('class="plotly-graph-div"') == len(FIGURE_KINDS)


def test_analysis_imports_no_torch_plotly_or_report():
    import subprocess
    import sys

    code = (
        "import sys, workbench.analysis.ncu, workbench.analysis.ncu_catalog; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'plotly') "
        "or m.startswith(('workbench.report', 'workbench.capture'))]; "
        "print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


# ---- real reports (from the GPU machine, committed under ncu/) --------------------------------
REPORTS = real_reports()
needs_reports = pytest.mark.skipif(
    not REPORTS,
    reason="no real Nsight Compute report committed under ncu/ yet: capture one on the GPU "
    "machine (workbench.capture.ncu.capture) and commit it, or set WORKBENCH_NCU_REPORTS",
)
each_report = pytest.mark.parametrize("path", REPORTS or [None])


def unpacked_bytes(path: str) -> bytes:
    """The report as ncu wrote it (a .gz or .xz report unpacked)."""
    how = packing(Path(path))
    data = Path(path).read_bytes()
    return how.unpack(data) if how else data


DIRECT: dict[str, tuple] = {}  # path -> (context, launches): see direct_actions


def direct_actions(path: str, tmp_path: Path) -> list:
    """The report's launches as ncu_report itself reads them (a packed report unpacked first).

    Read once per report for the module: ncu_report never frees a loaded report (~420 MB for
    the decode-step one), and the context and its unpacked copy are kept with the launches,
    which read from them lazily.
    """
    if path not in DIRECT:
        opened = path
        if packing(Path(path)):
            unpacked = tmp_path / f"{report_stem(Path(path))}.ncu-rep"
            unpacked.write_bytes(unpacked_bytes(path))
            opened = str(unpacked)
        context = ncu_report.load_report(opened)
        DIRECT[path] = (context, [rng[i] for rng in context for i in range(len(rng))])
    return DIRECT[path][1]


@needs_reports
@each_report
def test_real_report_builds_every_table(path):
    # How long this takes is a benchmark (scripts/bench_ncu_load.py), not a timed test.
    report = load_ncu(path)
    tables = [report.summary(), report.stalls(), report.hotspots(), report.occupancy()]
    tables += [report.rules(), report.diff(0), report.text()]
    assert all(len(table) for table in tables)
    assert len(report) >= 1 and len(set(report.labels)) == len(report)
    assert list(report.summary().columns) == report.labels


@needs_reports
@each_report
def test_real_kernel_time_adds_up_the_summary(path):
    report = load_ncu(path)
    table = report.kernel_time()
    durations = report.summary().loc["Duration (us)"].astype(float)
    assert table["launches"].sum() == len(report)
    assert table["total_us"].sum() == pytest.approx(durations.sum())
    assert table["share_pct"].sum() == pytest.approx(100.0)
    assert table["total_us"].is_monotonic_decreasing


@needs_reports
@each_report
def test_real_summary_equals_the_metrics_read_directly(path, tmp_path):
    report = load_ncu(path)
    actions = direct_actions(path, tmp_path)
    summary, sources = report.summary(), report.metric_sources()
    for row in SUMMARY_METRICS:
        for label, action in zip(report.labels, actions):
            name = sources.loc[row, label]
            short = summary.loc["Duration (us)", label] < CLOCK_MIN_US
            if row == "SM clock (MHz)" and short:  # not the clock there: shown as none
                assert pd.isna(name) and pd.isna(summary.loc[row, label])
                continue
            if pd.isna(name):
                assert all(action.metric_by_name(n) is None for n in SUMMARY_METRICS[row])
                continue
            metric = action.metric_by_name(name)
            expected = metric.value()
            if row == "Duration (us)":
                assert metric.unit() == "ns"
                expected /= 1000
            if row == "SM clock (MHz)":  # the SOL section's "SM Frequency", in Hz
                assert metric.unit() == "hz"
                expected /= 1e6
                assert 1000 < summary.loc[row, label] < 2000  # a Hopper clock, in MHz (max 1,980)
            assert summary.loc[row, label] == pytest.approx(expected)


@needs_reports
@each_report
def test_real_stall_shares_add_up_to_100(path):
    stalls = load_ncu(path).stalls()
    shares = stalls.xs("share_pct", axis=1, level=1)
    sampled = shares.columns[shares.notna().any()]
    assert len(sampled), "the report has no PC sampling: was it captured with --set full?"
    for label in sampled:
        assert shares[label].sum() == pytest.approx(100.0)


@needs_reports
@each_report
def test_real_hotspots_point_at_real_kernel_lines(path, tmp_path):
    report = load_ncu(path)
    actions = direct_actions(path, tmp_path)
    hot = report.hotspots(n=20)
    source = hot[hot["level"] == "source"]
    if not any(dict(action.source_files().items()) for action in actions):
        # a library kernel shipped without its source (cuBLAS's nvjet): its hot spots are
        # SASS instructions, none of them passed off as a line of code
        assert len(source) == 0 and len(hot) and hot["text"].str.len().gt(0).all()
    else:
        assert len(source), "no sample maps to a source line: was --import-source yes used?"
    for row in source.itertuples():
        assert not row.file.startswith(("/", "…")), f"{row.file}: the capture machine's path"
        if row.file.startswith(("kernels/", "workbench/")):  # this repository's, relative
            assert (REPO / row.file).is_file(), row.file
        imported = dict(actions[report.labels.index(row.launch)].source_files().items())
        sources = {readable_path(path): text for path, text in imported.items()}
        assert sources.get(row.file), f"{row.file} not imported: was --import-source yes used?"
        lines = sources[row.file].splitlines()
        assert 1 <= row.line <= len(lines)
        assert row.text == lines[row.line - 1].strip() and row.text
        if row.file.endswith(".py"):  # a Triton kernel: the line is code, not a comment
            assert not row.text.startswith("#")
    for label in hot["launch"].unique():
        assert report.hotspots(n=10**6, launch=label)["share_pct"].sum() == pytest.approx(100.0)


@needs_reports
@each_report
def test_real_instruction_stalls_hold_every_sample(path):
    report = load_ncu(path)
    for label in report.labels:
        by_op = report.instruction_stalls(n=10**6, launch=label)
        by_line = report.hotspots(n=10**6, launch=label)
        assert by_op["samples"].sum() == pytest.approx(by_line["samples"].sum())
        if len(by_op):
            assert by_op["share_pct"].sum() == pytest.approx(100.0)
            assert "?" not in set(by_op["instruction"])


def test_parked_warps_are_a_quarter_of_the_w8a8_gemms_samples():
    """Triton launches the W8A8 kernel's one-warp load partition as a warpgroup, so 3 of its
    12 warps idle at a barrier (NOP) the whole launch; DeepGEMM's idle producer threads exit.
    Read by opcode, not by source line, where they and the wgmma waits both read `barrier`."""
    pytest.importorskip("ncu_report")
    shares = {}
    for peer, kernel in (("w8a8-T4096-block128", "wgmma_kernel"), ("deepgemm-T4096", "fp8_gemm")):
        report = load_ncu(REPO / f"ncu/dense-{peer}-projectionq_up.ncu-rep.xz").select(kernel)
        assert len(report) == 1  # the GEMM alone, not the activation quantiser
        table = report.instruction_stalls(n=10**6).set_index(["instruction", "reason"])
        shares[peer] = table["share_pct"]
    assert shares["w8a8-T4096-block128"][("NOP", "barrier")] == pytest.approx(25.0, abs=2.0)
    assert shares["deepgemm-T4096"].get(("NOP", "barrier"), 0.0) < 1.0
    for share in shares.values():  # waiting for its own wgmma: the top stall of either
        waits = share.drop(("NOP", "barrier"), errors="ignore")
        assert waits.idxmax() == ("WARPGROUP.DEPBAR", "barrier")


def test_a_peers_gemm_diffs_against_ours_once_the_selection_names_kernels():
    """'gemm' also matches DeepGEMM's activation quantiser, through its NVTX range
    (`@ wb:dense:deepgemm`), so nothing pairs and the error says how to anchor the pattern."""
    pytest.importorskip("ncu_report")
    ours = load_ncu(REPO / "ncu/dense-w8a8-T4096-block128-projectiono_b.ncu-rep.xz")
    theirs = load_ncu(REPO / "ncu/dense-deepgemm-T4096-projectiono_b.ncu-rep.xz")
    with pytest.raises(WorkbenchError, match="anchor the pattern at the kernel's name"):
        ours.select("wgmma|gemm").diff(theirs.select("wgmma|gemm"))
    pattern = "^(_w8a8|sm90_fp8)"
    change = ours.select(pattern).diff(theirs.select(pattern))
    (label,) = change.columns.get_level_values(0).unique()
    assert label.startswith("_w8a8_wgmma_kernel")
    assert change.loc["Duration (us)", (label, "change_pct")] > 0  # ours is the slower


@needs_reports
@each_report
def test_real_diff_with_itself_is_zero(path):
    report = load_ncu(path)
    changes = report.diff(load_ncu(path)).xs("change", axis=1, level=1)
    assert (changes.fillna(0) == 0).all().all()


@needs_reports
@each_report
def test_real_report_cut_short_is_rejected(path, tmp_path):
    cuts = {"cut.ncu-rep": unpacked_bytes(path)}
    if packing(Path(path)):
        cuts["cut" + Path(path).name[len(report_stem(Path(path))) :]] = Path(path).read_bytes()
    for name, whole in cuts.items():
        cut = tmp_path / name
        cut.write_bytes(whole[: len(whole) // 2])
        with pytest.raises(ArtifactError, match="truncated or damaged"):
            load_ncu(cut)


@needs_reports
@pytest.mark.parametrize("suffix", sorted(PACKINGS))
def test_packed_reports_unpack_for_as_long_as_they_are_used(tmp_path, suffix):
    import gc

    from workbench.analysis.ncu_catalog import find_reports

    data = unpacked_bytes(min(REPORTS, key=os.path.getsize))
    packed = tmp_path / f"x.ncu-rep{suffix}"
    packed.write_bytes(gzip.compress(data) if suffix == ".gz" else lzma.compress(data))
    report = load_ncu(packed)
    folder = Path(report._context[1].name)
    assert folder.is_dir()  # ncu_report reads stall samples and source from it lazily
    assert len(report.stalls()) and len(report.hotspots())
    del report
    gc.collect()
    assert not folder.exists()
    misnamed = tmp_path / f"y.ncu-rep{suffix}"
    misnamed.write_bytes(data)
    with pytest.raises(ArtifactError, match=f"named {suffix} but holds no {suffix[1:]} data"):
        load_ncu(misnamed)
    misnamed.unlink()
    (tmp_path / ".y.ncu-rep").write_bytes(b"a capture in progress")
    assert find_reports(tmp_path) == [packed]
    (tmp_path / "x.ncu-rep").write_bytes(data)  # unpacked beside it: the plain one is listed
    assert find_reports(tmp_path) == [tmp_path / "x.ncu-rep"]


@needs_reports
def test_real_reports_load_as_the_facade():
    import workbench

    smallest = min(REPORTS, key=os.path.getsize)
    assert isinstance(workbench.load_ncu(smallest), NcuResult)
    assert type(load_ncu(smallest)) is NcuReport
    catalog = NcuCatalogResult.load([smallest])
    assert all(isinstance(report, NcuResult) for report in catalog.reports)


@needs_reports
@each_report
def test_real_capture_metadata_matches_the_launches(path):
    report = load_ncu(path)
    if not report.meta:
        pytest.skip(f"{Path(path).name} has no capture metadata (<name>.json)")
    assert report.meta["kind"] == "ncu"
    for name in report.meta["nvtx_ranges"]:
        assert f"{name}/" in report.meta["command"]
        assert any(label.endswith(f"@ {name}") or f"@ {name} #" in label for label in report.labels)
    assert isinstance(report.launches, pd.DataFrame)


def test_a_summary_value_is_read_in_its_row_s_unit_or_not_at_all():
    """Durations in us and clocks in MHz whatever unit the metric came in; a unit the row does
    not know gives NaN, never a number in the wrong unit; the clock only from 20 us."""
    action = Action("k", {"t": Metric(1500.0, "ns"), "f1": Metric(1.644e9, "hz"),
                          "f2": Metric(1.9, "GHz"), "f3": Metric(7.0, "furlong")})  # fmt: skip
    names = frozenset(action.metric_names())
    assert first_value(action, names, ["t"], row_unit("Duration (us)")) == (1.5, "t")
    assert first_value(action, names, ["f1"], row_unit("SM clock (MHz)"))[0] == pytest.approx(1644)
    assert first_value(action, names, ["f2"], row_unit("SM clock (MHz)"))[0] == pytest.approx(1900)
    assert math.isnan(first_value(action, names, ["f3"], row_unit("SM clock (MHz)"))[0])
    assert row_unit("L2 throughput (%)") is None
    assert first_value(action, names, ["missing", "f3"]) == (7.0, "f3")  # as read
    assert clock_shown(1644.0, CLOCK_MIN_US) == 1644.0
    assert math.isnan(clock_shown(1644.0, CLOCK_MIN_US - 0.1))
    assert math.isnan(clock_shown(1644.0, math.nan))  # no duration: no clock either


def test_a_short_launchs_clock_is_hidden_and_names_no_metric():
    """Below CLOCK_MIN_US the rate ncu reads is not the clock: the summary shows none, and
    metric_sources names none there either, as for a metric the report lacks."""
    clock = {"sm__cycles_elapsed.avg.per_second": Metric(1.644e9, "hz")}
    long = Action("long", {"gpu__time_duration.sum": Metric(41000.0, "ns")} | clock)
    short = Action("short", {"gpu__time_duration.sum": Metric(2000.0, "ns")} | clock)
    report = NcuReport(Path("clock.ncu-rep"), [long, short])
    summary, sources = report.summary(), report.metric_sources()
    first, second = report.labels
    assert summary.loc["SM clock (MHz)", first] == pytest.approx(1644)
    assert sources.loc["SM clock (MHz)", first] == "sm__cycles_elapsed.avg.per_second"
    assert pd.isna(summary.loc["SM clock (MHz)", second])
    assert pd.isna(sources.loc["SM clock (MHz)", second])
