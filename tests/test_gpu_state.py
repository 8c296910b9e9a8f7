"""The GPU's state while a bench's rows are timed (`capture.gpu_state`, `analysis.gpu_state`):
read in a thread from the first round to the last (not during the warm-ups), kept per group of
rows timed in turns, summarised into one line for the report, and, where NVML cannot be read,
a reason instead."""

from __future__ import annotations

import time

import pandas as pd
import pytest
import torch

from workbench.analysis.gpu_state import describe_state, state_summary
from workbench.capture import gpu_state
from workbench.capture.bench_rows import (
    RowPlan,
    check_then_time,
    gpu_state_record,
    gpu_state_table,
    samples_table,
)
from workbench.capture.timing import Launch


@pytest.fixture(autouse=True)
def no_cached_reader():
    """Each test opens its own NVML reader: one cached by an earlier GPU test would hide a
    missing pynvml."""
    gpu_state.open_reader.cache_clear()


class FakeReader:
    """Stands in for NVML: a clock that drops by 15 MHz a read, under a power cap after the
    second read; `fail_after` reads, it raises as a lost driver would."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.reads, self.fail_after = 0, fail_after

    def read(self) -> dict:
        if self.fail_after is not None and self.reads >= self.fail_after:
            raise RuntimeError("GPU is lost")
        self.reads += 1
        slowdown = gpu_state.slowdown_names(0x4 if self.reads > 2 else 0)
        return {"sm_mhz": 1980 - 15 * self.reads, "mem_mhz": 3201, "power_w": 650.0,
                "temp_c": 60 + self.reads, "slowdown": slowdown}  # fmt: skip

    def max_sm_mhz(self) -> int:
        return 1980


def test_slowdown_names_keep_only_reasons_that_hold_the_clocks_down():
    assert gpu_state.slowdown_names(0x4 | 0x20) == "power-cap+thermal"
    assert gpu_state.slowdown_names(0x1 | 0x2 | 0x10) == ""  # idle, app clocks, sync boost


def test_a_log_samples_from_enter_to_exit(monkeypatch):
    reader = FakeReader()
    monkeypatch.setattr(gpu_state, "open_reader", lambda device: reader)
    with gpu_state.GpuStateLog(torch.device("cuda"), interval_s=0.01) as log:
        time.sleep(0.1)
    reads = len(log.samples)
    assert reads >= 3 and log.unavailable is None
    assert list(log.samples[0]) == list(gpu_state.COLUMNS)
    times = [s["t_s"] for s in log.samples]
    assert times == sorted(times) and times[0] < 0.01
    time.sleep(0.03)
    assert len(log.samples) == reads == reader.reads  # the thread stopped at exit


def test_a_log_says_why_it_has_no_samples(monkeypatch):
    with gpu_state.GpuStateLog(torch.device("cpu")) as cpu:
        pass
    assert cpu.samples == [] and "cpu is not a CUDA device" in cpu.unavailable
    assert gpu_state.max_sm_mhz(torch.device("cpu")) is None
    monkeypatch.setattr(gpu_state, "open_reader", lambda device: FakeReader(fail_after=2))
    with gpu_state.GpuStateLog(torch.device("cuda"), interval_s=0.005) as lost:
        time.sleep(0.05)
    assert len(lost.samples) == 2
    assert lost.unavailable == "NVML stopped answering: RuntimeError: GPU is lost"


def test_nvml_unreadable_is_a_reason_not_a_crash(monkeypatch):
    """A CUDA device with no nvidia-ml-py to read it: the log names the package to install."""
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(gpu_state.Unavailable, match="pip install nvidia-ml-py"):
        gpu_state.open_reader(torch.device("cuda"))


def state_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {"group": [0, 0, 0, 1], "t_s": [0.0, 0.1, 0.2, 0.0], "sm_mhz": [1980, 1900, 1755, 1980],
         "mem_mhz": [3201] * 4, "power_w": [500.0, 690.0, 700.0, 400.0],
         "temp_c": [55, 66, 71, 50], "slowdown": ["", "power-cap", "power-cap+thermal", ""]}
    )  # fmt: skip


def test_a_summary_gives_clocks_power_heat_and_slowdown_shares():
    whole = state_summary(state_frame())
    assert whole["samples"] == 4 and whole["sm_mhz_median"] == 1940.0
    assert (whole["sm_mhz_min"], whole["sm_mhz_max"], whole["temp_c_max"]) == (1755, 1980, 71)
    assert whole["slowdown_share"] == {"power-cap": 0.5, "thermal": 0.25}
    assert describe_state(whole, 1980) == (
        "SM clock 1,940 MHz median (1,755-1,980; max 1,980), 595 W, up to 71 C, "
        "power-cap in 50% of samples, thermal in 25% of samples"
    )
    calm = state_summary(state_frame(), group=1)
    assert calm["samples"] == 1 and describe_state(calm).endswith("no slowdown reported")
    assert state_summary(state_frame(), group=7) is None and state_summary(None) is None
    assert describe_state(None) == ""


def test_a_bench_keeps_the_state_of_each_group_it_timed_in_turns(monkeypatch):
    """Two sizes, two check_then_time calls: the state table numbers its groups as the samples
    table does, and the run's record summarises them; on the CPU it says why there is none."""
    monkeypatch.setattr(gpu_state, "open_reader", lambda device: FakeReader())

    def plan(name: str) -> RowPlan:
        return RowPlan({"variant": name}, lambda: {"rel_error": 0.0}, 1e-2,
                       Launch(lambda: time.sleep(0.002), 1), lambda row: {})  # fmt: skip

    cpu = torch.device("cpu")  # timed on the CPU, its state read from the stand-in
    rows = check_then_time([plan("a"), plan("b")], cpu)
    rows += check_then_time([plan("c")], cpu)
    state, samples = gpu_state_table(rows), samples_table(rows)
    assert set(state["group"]) == set(samples["group"]) == {0, 1}
    assert list(state.columns) == ["group", *gpu_state.COLUMNS]
    record = gpu_state_record(rows, state, cpu)
    assert record["sampled"] and record["max_sm_mhz"] == 1980 and record["gaps"] == {}
    assert record["window"] == "rounds"
    assert record["description"].startswith("SM clock ") and "; max 1,980)" in record["description"]
    monkeypatch.undo()
    cpu_rows = check_then_time([plan("a")], cpu)
    cpu_state = gpu_state_table(cpu_rows)
    assert cpu_state.empty and list(cpu_state.columns) == ["group", *gpu_state.COLUMNS]
    cpu_record = gpu_state_record(cpu_rows, cpu_state, cpu)
    assert cpu_record == {"sampled": False, "why": "not sampled: cpu is not a CUDA device"}


def test_a_bench_reads_the_gpu_while_it_measures_its_ceilings(monkeypatch, tmp_path):
    """The ceilings a run's floors come from are rates at the clock of their moment, so the
    setup reads NVML while it measures them and the run's record keeps that beside the rows'."""
    from workbench.artifacts import read_meta
    from workbench.capture import bench_rows

    def fake_ceilings(device: torch.device, on_rounds) -> dict:
        time.sleep(0.01)  # warm-ups: not read
        on_rounds()
        time.sleep(0.01)
        return {"copy_bytes_per_s": 1e12, "bf16_flops": 1e15, "fp8_flops": 2e15}

    monkeypatch.setattr(gpu_state, "open_reader", lambda device: FakeReader())
    monkeypatch.setattr(bench_rows, "measure_ceilings", fake_ceilings)
    setup = bench_rows.bench_setup("dsv4-flash-tp2", "cpu", 0, None, {})
    assert setup.ceilings["bf16_flops"] == 1e15 and setup.ceilings_state.samples
    given = bench_rows.bench_setup("dsv4-flash-tp2", "cpu", 0, setup.ceilings, {})
    assert given.ceilings_state is None  # given ceilings were not measured here
    plan = RowPlan({"variant": "a"}, lambda: {"rel_error": 0.0}, 1e-2,
                   Launch(lambda: time.sleep(0.002), 1), lambda row: {})  # fmt: skip
    rows = check_then_time([plan], torch.device("cpu"))
    table = bench_rows.save_bench("dense", setup, str(tmp_path), {}, pd.DataFrame(rows), rows)
    record = read_meta(table.attrs["path"])["gpu_state"]
    assert record["sampled"] and record["ceilings"]["description"].startswith("SM clock ")
    assert record["ceilings"]["summary"]["samples"] == len(setup.ceilings_state.samples)


def test_a_record_says_where_reading_stopped_early(monkeypatch):
    """NVML lost after the first read: the samples taken stay, and the record names the gap."""
    monkeypatch.setattr(gpu_state, "open_reader", lambda device: FakeReader(fail_after=1))
    plan = RowPlan({"variant": "a"}, lambda: {"rel_error": 0.0}, 1e-2,
                   Launch(lambda: time.sleep(0.002), 1), lambda row: {})  # fmt: skip
    rows = check_then_time([plan], torch.device("cpu"))
    state = gpu_state_table(rows)
    record = gpu_state_record(rows, state, torch.device("cpu"))
    assert len(state) == 1 and record["sampled"]
    assert record["gaps"] == {"0": "NVML stopped answering: RuntimeError: GPU is lost"}


def test_reading_begins_with_the_rounds_not_the_warm_ups(monkeypatch):
    """Through the real timer: every contender has been warmed up before the first read, and
    rounds follow it, so the readings are of the rounds."""
    events: list[str] = []

    def opened(device: torch.device) -> FakeReader:  # start() opens the reader synchronously
        events.append("open")
        return FakeReader()

    monkeypatch.setattr(gpu_state, "open_reader", opened)

    def plan(name: str) -> RowPlan:
        return RowPlan({"variant": name}, lambda: {"rel_error": 0.0}, 1e-2,
                       Launch(lambda: events.append(name) or time.sleep(0.001), 1),
                       lambda row: {})  # fmt: skip

    check_then_time([plan("a"), plan("b")], torch.device("cpu"))
    opening = events.index("open")
    assert {"a", "b"} <= set(events[:opening])  # both warmed up before reading began
    assert {"a", "b"} <= set(events[opening:])  # and sampled in rounds after
    assert events.count("open") == 1


class FakePynvml:
    """Stands in for the pynvml module: records the bus id asked for; `newer` says whether the
    driver has the clocks-event reasons query (drivers before 535 have only the throttle one)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    class NVMLError_FunctionNotFound(Exception):  # noqa: N801 (pynvml's name)
        pass

    def __init__(self, newer: bool = True, init_error: bool = False) -> None:
        self.newer, self.init_error, self.bus = newer, init_error, None

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names, here and below)
        if self.init_error:
            raise RuntimeError("Driver Not Loaded")

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> str:  # noqa: N802
        self.bus = bus
        return "handle"

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:  # noqa: N802
        if not self.newer:
            raise self.NVMLError_FunctionNotFound()
        return 0x4

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: str) -> int:  # noqa: N802
        return 0x20

    def nvmlDeviceGetClockInfo(self, handle: str, clock: int) -> int:  # noqa: N802
        return 1755 if clock == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:  # noqa: N802
        return 699_500

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:  # noqa: N802
        return 64

    def nvmlDeviceGetMaxClockInfo(self, handle: str, clock: int) -> int:  # noqa: N802
        return 1980


def test_the_reader_finds_the_gpu_by_its_bus_id_and_reads_its_state(monkeypatch):
    import sys
    from types import SimpleNamespace

    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x19, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    nvml = FakePynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    reader = gpu_state.NvmlReader(torch.device("cuda"))
    assert nvml.bus == "00000000:19:00.0"  # NVML's own bus id format
    assert reader.read() == {"sm_mhz": 1755, "mem_mhz": 3201, "power_w": 699.5, "temp_c": 64,
                             "slowdown": "power-cap"}  # fmt: skip
    assert reader.max_sm_mhz() == 1980
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(newer=False))  # an older driver
    assert gpu_state.NvmlReader(torch.device("cuda")).read()["slowdown"] == "thermal"
    monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(init_error=True))
    with pytest.raises(gpu_state.Unavailable, match="NVML: RuntimeError: Driver Not Loaded"):
        gpu_state.NvmlReader(torch.device("cuda"))


def test_a_source_line_names_the_gpu_state_of_the_ceilings_and_of_the_rows():
    from pathlib import Path

    from workbench.analysis.collection import Artifact
    from workbench.report.sections_benchmarks import run_conditions

    ceilings = {"copy_bytes_per_s": 4.26e12, "bf16_flops": 7.73e14, "fp8_flops": 1.39e15}
    state = {"description": "SM clock 1,980 MHz median", "ceilings": {"description": "SM "
             "clock 1,650 MHz median"}}  # fmt: skip
    item = Artifact(Path("raw/x"), "bench-dense", {"ceilings": ceilings, "gpu_state": state}, {})
    assert run_conditions(item) == (
        "copy 4.26 TB/s, cuBLAS bf16 773 TFLOP/s, FP8 1390 TFLOP/s measured in the same run; "
        "the GPU while the ceilings were timed: SM clock 1,650 MHz median; "
        "the GPU while the rows were timed: SM clock 1,980 MHz median"
    )
    older = Artifact(Path("raw/y"), "bench-dense", {"ceilings": ceilings}, {})
    assert run_conditions(older).endswith("measured in the same run")


def test_groups_are_named_by_their_sizes_in_order_or_by_number():
    from workbench.analysis.gpu_state import state_by_size

    bench = pd.DataFrame({"m": [128, 16, 1024, 4096], "routing": ["u", "u", None, None]})
    samples = pd.DataFrame({"row": [0, 1, 2, 3], "group": [0, 0, 0, 1], "round": 0, "ms": 1.0})
    state = state_frame()
    table = state_by_size(state, samples, bench, ["routing", "m"])
    assert list(table["m"]) == ["16, 128, 1,024", "4,096"]  # numbers in order, not as text
    assert list(table["routing"]) == ["u", ""]  # no routing recorded: blank, not 'nan'
    numbered = state_by_size(state, samples, bench, ["tokens"])
    assert list(numbered["group"]) == [0, 1]
    assert state_by_size(None, samples, bench, ["m"]).empty
