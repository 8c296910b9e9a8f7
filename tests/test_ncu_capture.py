"""ncu captures without a GPU or ncu: the command line, the target entry point, and every
failure of capture() with ncu's subprocess faked."""

import json
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from helpers import real_reports, report_as_written

import kernels.moe
from workbench.capture import ncu as ncu_capture
from workbench.capture import ncu_target
from workbench.capture.ncu import (
    capture,
    capture_decode_step,
    collection_options,
    default_name,
    ncu_command,
)
from workbench.capture.ncu_args import DONE, TargetArgs, nvtx_filter, parse_args, range_name
from workbench.capture.ncu_builders import BUILDERS
from workbench.capture.ncu_target import main, run_target
from workbench.capture.ncu_workload_parts import release_cached_memory
from workbench.errors import WorkbenchError

NCU = "/usr/local/cuda/bin/ncu"


# ---- the command line and the target's arguments ---------------------------------------------
def test_command_line_is_exact():
    target = TargetArgs("moe", "stock", (6, 4096), {"block_m": 32})
    command = ncu_command(NCU, Path("ncu/moe-stock"), target, python="python")
    assert command == [
        NCU,
        "--set",
        "full",
        "--import-source",
        "yes",
        "--clock-control",
        "none",
        "--nvtx",
        "--nvtx-include",
        "wb:moe:stock:T=6/",
        "--nvtx-include",
        "wb:moe:stock:T=4096/",
        "--kernel-name",
        "regex:^(_|silu_reduce)",
        "--target-processes",
        "all",
        "-f",
        "-o",
        "ncu/moe-stock",
        "python",
        "-m",
        "workbench.capture.ncu_target",
        "--kernel",
        "moe",
        "--variant",
        "stock",
        "--tokens",
        "6",
        "4096",
        "--routing",
        "uniform",
        "--seed",
        "0",
        "--param",
        "block_m=32",
    ]


def test_range_names_are_plain_push_pop_filters():
    assert range_name("moe", "stock", 6) == "wb:moe:stock:T=6"
    assert nvtx_filter("wb:moe:stock:T=6") == "wb:moe:stock:T=6/"  # trailing '/': push/pop
    with pytest.raises(WorkbenchError, match="NVTX filter"):
        range_name("moe", "stock/v2", 6)  # '/' would split the name in ncu's filter


def test_default_names():
    assert default_name(TargetArgs("moe", "stock", (6, 4096))) == "moe-stock-T6-4096"
    target = TargetArgs("moe", "stock", (6,), {"block_m": 32}, routing="skewed", seed=3)
    assert default_name(target) == "moe-stock-T6-block_m32-skewed-seed3"


def test_target_arguments_round_trip_and_value_types():
    argv = ["--kernel", "moe", "--variant", "stock", "--tokens", "6", "4096"]
    argv += ["--param", "block_m=32", "--param", "groups=none", "--param", "scale=1.5"]
    argv += ["--param", "fast=true", "--param", "name=flat", "--routing", "skewed"]
    args = parse_args(argv)
    assert args.tokens == (6, 4096) and args.routing == "skewed" and args.seed == 0
    assert args.params == {
        "block_m": 32,
        "groups": None,
        "scale": 1.5,
        "fast": True,
        "name": "flat",
    }
    assert parse_args(args.to_argv()) == args
    tiny = TargetArgs("moe", "stock", (3,), preset="tiny", device="cpu")
    assert parse_args(tiny.to_argv()) == tiny


@pytest.mark.parametrize(
    "argv",
    [
        ["--kernel", "moe", "--variant", "stock", "--tokens", "6", "--param", "block_m"],
        ["--kernel", "nope", "--variant", "stock", "--tokens", "6"],
        ["--kernel", "moe", "--variant", "stock"],
    ],
)
def test_bad_target_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as err:
        parse_args(argv)
    assert err.value.code == 2 and "usage:" in capsys.readouterr().err


def test_builder_registry():
    assert set(BUILDERS) == {"moe", "dense", "attention", "model-decode-step"}
    with pytest.raises(WorkbenchError, match="known kernels: moe, dense, attention, model-dec"):
        TargetArgs("mla", "triton", (6,)).validate()
    with pytest.raises(WorkbenchError, match="counts >= 1"):
        TargetArgs("moe", "stock", (0,)).validate()
    with pytest.raises(WorkbenchError, match="unknown routing"):
        TargetArgs("moe", "stock", (6,), routing="zipf").validate()


# ---- the target on the CPU (tiny shapes, Triton interpreter) ----------------------------------
class Marks:
    """Stands in for torch.cuda.nvtx.range: records every range and which are open."""

    def __init__(self):
        self.names, self.open = [], []

    @contextmanager
    def __call__(self, name: str):
        self.names.append(name)
        self.open.append(name)
        try:
            yield
        finally:
            self.open.pop()


def cpu_args(kernel="moe", variant="stock", tokens=(3, 5), **params) -> TargetArgs:
    return TargetArgs(kernel, variant, tokens, params, preset="tiny", device="cpu")


def test_target_marks_exactly_one_launch_per_token_count(monkeypatch):
    marks, calls = Marks(), []
    stock = kernels.moe.VARIANTS["stock"]

    def spy(x, *args, **kwargs):
        calls.append((x.shape[0], tuple(marks.open), kwargs))
        return stock(x, *args, **kwargs)

    monkeypatch.setitem(kernels.moe.VARIANTS, "spy", spy)
    # the checks' cached memory goes back before anything ncu replays runs
    monkeypatch.setattr(ncu_target, "release_cached_memory", lambda device: calls.append("release"))
    names = run_target(cpu_args(variant="spy", block_n=32), marks, log=lambda line: None)
    assert names == marks.names == ["wb:moe:spy:T=3", "wb:moe:spy:T=5"]
    # every check, then every warm-up, outside any range; then one call inside each range
    tiles = {"block_n": 32}
    assert calls == [
        (3, (), tiles),
        (5, (), tiles),
        "release",
        (3, (), tiles),
        (5, (), tiles),
        (3, ("wb:moe:spy:T=3",), tiles),
        (5, ("wb:moe:spy:T=5",), tiles),
    ]


def test_cached_memory_is_released_on_cuda_devices_only(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    release_cached_memory(torch.device("cpu"))
    assert emptied == []
    release_cached_memory(torch.device("cuda", 0))
    assert emptied == [True]


def test_target_refuses_a_wrong_kernel(monkeypatch, capsys):
    monkeypatch.setitem(kernels.moe.VARIANTS, "broken", lambda x, *args: torch.zeros_like(x))
    marks = Marks()
    with pytest.raises(WorkbenchError, match="differs from its reference"):
        run_target(cpu_args(variant="broken"), marks)
    assert marks.names == []
    assert main(cpu_args(variant="broken").to_argv()) == 2
    err = capsys.readouterr().err
    assert err.startswith("wb-ncu-target: error: wb:moe:broken:T=3: output differs")


def test_target_rejects_unknown_parameters():
    with pytest.raises(WorkbenchError, match="no parameter bogus; its parameters: groups, "):
        run_target(cpu_args(bogus=1))
    with pytest.raises(WorkbenchError, match="unknown moe variant 'nope'"):
        run_target(cpu_args(variant="nope"))
    with pytest.raises(WorkbenchError, match="no parameter width; its parameters: layers"):
        run_target(cpu_args("model-decode-step", width=3))


def test_dense_target_checks_then_marks_one_gemm_per_m():
    marks = Marks()
    args = cpu_args("dense", "w8a16", (1, 20), projection="qkv_a", block_n=32)
    assert run_target(args, marks, log=lambda line: None) == ["wb:dense:w8a16:T=1",
                                                              "wb:dense:w8a16:T=20"]  # fmt: skip
    assert marks.names == ["wb:dense:w8a16:T=1", "wb:dense:w8a16:T=20"]
    with pytest.raises(WorkbenchError, match="unknown projection=qkv; the layer's are qkv_a"):
        run_target(cpu_args("dense", "w8a8", projection="qkv"))
    with pytest.raises(WorkbenchError, match="'bf16' has no parameter block_n"):
        run_target(cpu_args("dense", "bf16", block_n=32))
    with pytest.raises(WorkbenchError, match="'hybrid' has no parameter block_m; its parameters: "
                       "projection, block, hybrid_m"):  # fmt: skip
        run_target(cpu_args("dense", "hybrid", block_m=32))
    with pytest.raises(WorkbenchError, match="'w8a8' has no parameter swap_ab; .*ring_scales, .*"
                       "wide_tiles"):  # fmt: skip
        run_target(cpu_args("dense", "w8a8", swap_ab=True))
    # ring_scales, wide_tiles and staged_weight_scales are the wgmma kernel's: accepted and
    # handed on, each is refused where that kernel does not run (on the CPU, at 20 rows), with
    # the kernel's own message
    for option in ("ring_scales", "wide_tiles", "staged_weight_scales"):
        with pytest.raises(ValueError, match=f"{option}=True is an option of the wgmma kernel"):
            run_target(cpu_args("dense", "w8a8", (20,), **{option: True}), log=lambda line: None)
    with pytest.raises(WorkbenchError, match="'w8a16': block_k=16 must be at least 32"):
        run_target(cpu_args("dense", "w8a16", block_k=16))
    with pytest.raises(WorkbenchError, match="block=48 must be a power of two"):
        run_target(cpu_args("dense", "w8a8", block=48))


def test_target_needs_a_gpu_unless_told_otherwise(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(WorkbenchError, match="no CUDA GPU is visible"):
        run_target(TargetArgs("moe", "stock", (6,)))


def test_decode_step_target_marks_only_decode_step_1(monkeypatch):
    marks, calls = Marks(), []
    reference = kernels.moe.VARIANTS["reference"]  # the model's MoE on the CPU

    def spy(x, *args):
        calls.append(tuple(marks.open))
        return reference(x, *args)

    monkeypatch.setitem(kernels.moe.VARIANTS, "reference", spy)
    args = cpu_args("model-decode-step", "stock", (1, 2), layers=2, prompt_tokens=24)
    names = run_target(args, marks, log=lambda line: None)
    assert (
        names == marks.names == ["wb:model-decode-step:stock:T=1", "wb:model-decode-step:stock:T=2"]
    )
    # Outside the ranges: both checks, then per count the prefill and decode step 0 (2 layers
    # each). Inside each range: decode step 1 alone, one MoE call per layer.
    assert calls.count(()) == 2 + 2 * (2 + 2)
    assert calls.count(("wb:model-decode-step:stock:T=1",)) == 2
    assert calls.count(("wb:model-decode-step:stock:T=2",)) == 2


# ---- capture() with ncu faked --------------------------------------------------------------
class FakeNcu:
    """Stands in for subprocess.Popen: prints `output`, exits with `returncode`, writes
    `report` (bytes) to the -o path, or hangs past the timeout once when `hang`."""

    pid = 4242

    def __init__(self, output="", returncode=0, report=None, hang=False):
        self.output, self.returncode, self.report, self.hang = output, returncode, report, hang
        self.command = None

    def __call__(self, command, **kwargs):
        self.command, self.kwargs = command, kwargs
        return self

    def communicate(self, timeout=None):
        if self.hang:
            self.hang = False
            raise subprocess.TimeoutExpired(self.command, timeout)
        if self.report is not None:
            out = Path(self.command[self.command.index("-o") + 1] + ".ncu-rep")
            out.write_bytes(self.report)
        return self.output, None


@pytest.fixture
def fake_machine(monkeypatch):
    """ncu on PATH, a GPU, and `ncu --version` answering; returns a function installing ncu."""
    monkeypatch.setattr(shutil, "which", lambda name: NCU if name == "ncu" else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def run(command, **kwargs):
        version = "NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (build 1)\n"
        ok = command[-1] == "--version"
        return subprocess.CompletedProcess(command, 0 if ok else 1, version if ok else "", "")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(ncu_capture, "describe", lambda: {"gpu": {"name": "fake H200"}})
    killed = []
    monkeypatch.setattr(ncu_capture.os, "killpg", lambda pid, sig: killed.append(pid))

    def install(fake: FakeNcu) -> FakeNcu:
        monkeypatch.setattr(subprocess, "Popen", fake)
        fake.killed = killed
        return fake

    return install


def assert_nothing_left(out: Path) -> None:
    assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())


def test_capture_checks_arguments_before_looking_for_ncu(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: pytest.fail("looked for ncu"))
    with pytest.raises(WorkbenchError, match="unknown kernel"):
        capture("mla", "triton", 6, out=tmp_path)
    with pytest.raises(WorkbenchError, match="plain file name"):
        capture("moe", "stock", 6, out=tmp_path, name="../elsewhere")


def test_what_ncu_collects():
    assert collection_options() == ["--set", "full"]
    assert collection_options("detailed") == ["--set", "detailed"]
    assert collection_options(sections=["Occupancy", "regex:^(?!PmSampling)"]) == [
        "--section", "Occupancy", "--section", "regex:^(?!PmSampling)",
    ]  # fmt: skip


def test_bad_collection_options_are_refused_before_looking_for_ncu(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: pytest.fail("looked for ncu"))
    with pytest.raises(WorkbenchError, match="ncu_set 'fulll' is not one of ncu's sets basic"):
        capture("moe", "stock", 6, out=tmp_path, ncu_set="fulll")
    with pytest.raises(WorkbenchError, match="ncu_set or sections, not both"):
        capture("moe", "stock", 6, out=tmp_path, ncu_set="full", sections=["Occupancy"])


def test_ncu_not_on_path(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(WorkbenchError) as err:
        capture("moe", "stock", [6], out=tmp_path / "ncu")
    assert "/usr/local/cuda/bin/ncu" in str(err.value)
    assert "/opt/nvidia/nsight-compute/<version>/ncu" in str(err.value)
    assert_nothing_left(tmp_path / "ncu")


def test_no_gpu(fake_machine, monkeypatch, tmp_path):
    fake_machine(FakeNcu())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(WorkbenchError, match="no CUDA GPU is visible"):
        capture("moe", "stock", 6, out=tmp_path / "ncu")
    assert_nothing_left(tmp_path / "ncu")


def test_counters_not_permitted(fake_machine, tmp_path):
    fake_machine(
        FakeNcu(
            "==PROF== Connected to process 17\n==ERROR== ERR_NVGPUCTRPERM - The user does not "
            f"have permission to access NVIDIA GPU Performance Counters\n{DONE}: ran x\n"
        )
    )
    with pytest.raises(WorkbenchError) as err:
        capture("moe", "stock", 6, out=tmp_path / "ncu")
    assert "as root" in str(err.value)
    assert "NVreg_RestrictProfilingToAdminUsers=0" in str(err.value)
    assert_nothing_left(tmp_path / "ncu")


def test_target_failure_shows_its_message_and_output_tail(fake_machine, tmp_path):
    lines = [f"line {i}" for i in range(100)]
    message = "wb-ncu-target: error: wb:moe:stock:T=6: output differs from moe_reference"
    fake = fake_machine(FakeNcu("\n".join([*lines, message, "==PROF== Disconnected"]), 2))
    with pytest.raises(WorkbenchError) as err:
        capture("moe", "stock", 6, out=tmp_path / "ncu")
    text = str(err.value)
    assert text.startswith("the target failed under ncu: wb:moe:stock:T=6: output differs")
    assert "line 99" in text and "line 10\n" not in text  # the tail, not the whole output
    assert fake.kwargs["start_new_session"] and fake.kwargs["cwd"] == ncu_capture.REPO
    assert_nothing_left(tmp_path / "ncu")


def test_target_crash_without_its_message(fake_machine, tmp_path):
    output = "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error: out of memory"
    fake_machine(FakeNcu(output, 1))
    with pytest.raises(WorkbenchError, match=r"(?s)exit status 1\).*out of memory") as err:
        capture("moe", "stock", 6, out=tmp_path / "ncu")
    assert "Traceback" in str(err.value)
    assert_nothing_left(tmp_path / "ncu")


def test_timeout_kills_ncu_and_its_target(fake_machine, tmp_path):
    fake = fake_machine(FakeNcu('==PROF== Profiling "_gate_up_kernel": 0%....', hang=True))
    with pytest.raises(WorkbenchError, match="timeout_s=5 s") as err:
        capture("moe", "stock", 6, out=tmp_path / "ncu", timeout_s=5)
    assert fake.killed == [FakeNcu.pid]
    assert "_gate_up_kernel" in str(err.value)
    assert_nothing_left(tmp_path / "ncu")


def test_no_kernel_matched_the_filter(fake_machine, tmp_path):
    fake_machine(FakeNcu(f"{DONE}: ran wb:moe:stock:T=6\n==WARNING== No kernels were profiled.\n"))
    with pytest.raises(WorkbenchError, match="ncu profiled no kernel") as err:
        capture("moe", "stock", [6, 4096], out=tmp_path / "ncu")
    assert "--nvtx-include wb:moe:stock:T=6/ --nvtx-include wb:moe:stock:T=4096/" in str(err.value)
    assert_nothing_left(tmp_path / "ncu")


def test_ncu_writes_no_report(fake_machine, tmp_path):
    fake_machine(FakeNcu(f"{DONE}: ran wb:moe:stock:T=6\n"))
    with pytest.raises(WorkbenchError, match="ncu wrote no report"):
        capture("moe", "stock", 6, out=tmp_path / "ncu")
    assert_nothing_left(tmp_path / "ncu")


@pytest.mark.parametrize("report", [b"", b"garbage" * 100, b"NVR\x00\x02\x00\x00\x00\x08\x07"])
def test_ncu_writes_an_unusable_report(fake_machine, tmp_path, report):
    fake_machine(FakeNcu(f"{DONE}: ran wb:moe:stock:T=6\n", report=report))
    with pytest.raises(WorkbenchError, match="report is not usable"):
        capture("moe", "stock", 6, out=tmp_path / "ncu")
    assert_nothing_left(tmp_path / "ncu")


def test_an_earlier_report_survives_a_failed_capture(fake_machine, tmp_path):
    out = tmp_path / "ncu"
    out.mkdir()
    (out / "moe-stock-T6.ncu-rep").write_bytes(b"earlier")
    fake_machine(FakeNcu("boom", 1, report=b"half a report"))
    with pytest.raises(WorkbenchError):
        capture("moe", "stock", 6, out=out)
    assert [p.name for p in out.iterdir()] == ["moe-stock-T6.ncu-rep"]
    assert (out / "moe-stock-T6.ncu-rep").read_bytes() == b"earlier"


@pytest.mark.parametrize("report", real_reports()[:1] or [None])
def test_capture_writes_report_metadata_and_summary(fake_machine, tmp_path, report):
    if report is None:
        pytest.skip("needs a real .ncu-rep (none committed under ncu/ yet) to stand for ncu's")
    fake = fake_machine(FakeNcu(f"{DONE}: ran\n", report=report_as_written(report)))
    path = capture("moe", "stock", [6, 4096], out=tmp_path / "ncu", num_warps=8)
    assert path == tmp_path / "ncu" / "moe-stock-T6-4096-num_warps8.ncu-rep"
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "moe-stock-T6-4096-num_warps8.json",
        "moe-stock-T6-4096-num_warps8.ncu-rep",
        "moe-stock-T6-4096-num_warps8.summary.txt",
    ]
    meta = json.loads(path.with_suffix(".json").read_text())
    # recorded without the machine's folders: programs by name, the report where it is kept
    assert meta["command"][0] == Path(NCU).name and len(meta["command"]) == len(fake.command)
    assert not any(Path(arg).is_absolute() for arg in meta["command"])
    kept = meta["command"][meta["command"].index("-o") + 1]
    assert Path(kept).name == "moe-stock-T6-4096-num_warps8"
    assert meta["tokens"] == [6, 4096] and meta["params"] == {"num_warps": 8}
    assert meta["ncu_version"] == "Version 2025.3.1.0 (build 1)"
    assert meta["nvtx_ranges"] == ["wb:moe:stock:T=6", "wb:moe:stock:T=4096"]
    assert meta["collect"] == ["--set", "full"] == meta["command"][1:3]
    assert meta["environment"] == {"gpu": {"name": "fake H200"}}
    summary = path.with_name("moe-stock-T6-4096-num_warps8.summary.txt").read_text()
    assert "Summary" in summary and "fake H200" in summary


def test_decode_step_capture_names_its_target(fake_machine, tmp_path):
    fake = fake_machine(FakeNcu("crash", 1))
    with pytest.raises(WorkbenchError):
        capture_decode_step("stock", [1, 4], out=tmp_path / "ncu", layers=2, ncu_set="detailed")
    command = fake.command
    assert command[1:3] == ["--set", "detailed"]  # ncu's option, not the target's parameter
    assert command[command.index("--kernel") + 1] == "model-decode-step"
    assert "--nvtx-include" in command and "wb:model-decode-step:stock:T=4/" in command
    assert command[-4:] == ["--param", "layers=2", "--param", "prompt_tokens=2048"]
    assert Path(command[command.index("-o") + 1]).name == (
        "model-decode-step-stock-T1-4-layers2-prompt_tokens2048"
    )


def test_target_module_imports_no_plotly_or_nvtx():
    code = (
        "import sys, workbench.capture.ncu_target, workbench.capture.ncu; "
        "bad = [m for m in ('plotly', 'nvtx') if m in sys.modules]; print(bad); sys.exit(bool(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ncu_capture.REPO
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has stopped; whoever adopted it reaps it later


def test_a_terminated_capture_takes_ncu_down_with_it(tmp_path):
    # `timeout` sends the workbench SIGTERM; ncu runs in its own session, so without the
    # handler it would go on profiling on the GPU after the workbench is gone.
    pidfile = tmp_path / "ncu.pid"
    stand_in = f"echo $$ > {pidfile}; exec sleep 120"
    code = f"from workbench.capture.ncu import _run; _run(['sh', '-c', {stand_in!r}], 300)"
    workbench = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and workbench.poll() is None
        time.sleep(0.1)
    stand_in_pid = int(pidfile.read_text())
    workbench.terminate()
    assert workbench.wait(timeout=30) != 0
    deadline = time.monotonic() + 10
    while _running(stand_in_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(stand_in_pid)


@pytest.mark.parametrize("part", ["indexer", "select", "attend"])
def test_attention_target_marks_one_checked_launch_of_its_part(part):
    marks = Marks()
    args = cpu_args("attention", "fp8", (1, 6), part=part, context=300)
    names = run_target(args, marks, log=lambda line: None)
    assert names == marks.names == ["wb:attention:fp8:T=1", "wb:attention:fp8:T=6"]
    assert args.range_names() == names  # what ncu's NVTX filter asks for


def test_attention_target_refuses_unknown_parts_and_oversized_queries():
    with pytest.raises(WorkbenchError, match="part=mqa"):
        BUILDERS["attention"](cpu_args("attention", "fp8", (1,), part="mqa"))
    with pytest.raises(WorkbenchError, match="do not fit a context of 100"):
        BUILDERS["attention"](cpu_args("attention", "fp8", (200,), context=100))
