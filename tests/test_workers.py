"""Worker processes under the watchdog: every way a configuration can fail becomes a status,
the experiment goes on, rows survive a killed parent and a rerun resumes.

The worker functions below are imported by dotted name (`test_workers.<name>`) in spawned
processes: tests/ is on sys.path (pytest's rootdir conftest), and spawn passes sys.path on.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.artifacts import read_meta
from workbench.capture import memory, workers
from workbench.errors import WorkbenchError

HERE = Path(__file__).parent
GIB, MIB = 2**30, 2**20


def echo(config: dict) -> dict:
    time.sleep(config.get("sleep", 0.0))
    return {"status": "ok", "value": config["x"] * 2, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES")}


def misbehave(config: dict) -> dict:
    how = config["how"]
    if how == "hang":
        time.sleep(600)
    if how == "exit":
        os._exit(3)
    if how == "segfault":
        import ctypes

        ctypes.string_at(0)
    if how == "oom":
        import torch

        raise torch.OutOfMemoryError("CUDA out of memory (test)")
    if how == "compile":
        from triton.compiler.errors import CompilationError

        raise CompilationError("kernel.py", None, "test")
    if how == "raise":
        raise ValueError("bad config")
    return {"status": "spills" if how == "spills" else "ok"}


def sleeper(config: dict) -> dict:
    """A long measurement: says its pid, then sleeps."""
    Path(config["pidfile"]).write_text(str(os.getpid()))
    time.sleep(600)
    return {"status": "ok"}


def killed(config: dict) -> dict:
    """Stands in for a worker the kernel's OOM killer ends: it reports its memory use (peak
    RSS, the host's free memory) as the worker's memory watch does, then dies of SIGKILL."""
    from workbench.capture import worker_memory

    worker_memory.record(config["peak_rss"], config["free"])
    os.kill(os.getpid(), signal.SIGKILL)
    return {"status": "ok"}


def timed(config: dict) -> dict:
    start = time.time()
    time.sleep(config["sleep"])
    return {"status": "ok", "start": start, "end": time.time()}


def _run(tmp_path, configs, **kwargs):
    meta = {"kind": "sweep", "params": {"test": True}}
    args = {"timeout_s": 30, "progress": False, **kwargs}
    return workers.run_configs("test_workers.misbehave", configs, tmp_path, meta, **args)


def test_a_hanging_worker_is_killed_at_its_timeout_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    start = time.monotonic()
    rows = _run(tmp_path, [{"how": "hang"}, {"how": "fine"}], timeout_s=3)
    assert time.monotonic() - start < 15
    assert [r["status"] for r in rows] == ["timeout", "ok"]
    meta = read_meta(tmp_path)
    assert meta["state"] == "finished" and meta["kind"] == "sweep" and meta["rows"] == 2
    assert meta["statuses"] == {"timeout": 1, "ok": 1}


def test_every_failure_is_a_status(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    hows = ["exit", "segfault", "oom", "compile", "raise", "spills", "fine"]
    rows = _run(tmp_path, [{"how": h} for h in hows], timeout_s=120, workers=2)
    status = {r["how"]: r["status"] for r in rows}
    assert status == {"exit": "crash", "segfault": "crash", "oom": "oom",
                      "compile": "compile-error", "raise": "error", "spills": "spills",
                      "fine": "ok"}  # fmt: skip
    by_how = {r["how"]: r for r in rows}
    assert by_how["exit"]["exitcode"] == 3
    assert by_how["segfault"]["error"] == "killed by signal SIGSEGV"
    assert by_how["raise"]["error"] == "ValueError: bad config"


def test_out_of_memory_is_told_by_class_name_or_the_cpu_allocators_message():
    from workbench.capture.memory import NotEnoughMemoryError

    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
                       "memory: you tried to allocate 27179089920 bytes.")  # fmt: skip
    for err in (cpu, MemoryError(), NotEnoughMemoryError("out of host memory: ...")):
        assert workers.classify(err) == "oom", err
    assert workers.classify(RuntimeError("0 active drivers ([]).")) == "error"


def test_one_worker_per_visible_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    meta = {"kind": "sweep", "params": {}}
    configs = [{"x": i, "sleep": 0.2} for i in range(4)]
    rows = workers.run_configs("test_workers.echo", configs, tmp_path, meta, progress=False)
    assert [r["value"] for r in rows] == [0, 2, 4, 6]
    assert {r["gpu"] for r in rows} == {"3", "5"}


PARENT = """
import sys
sys.path.insert(0, {here!r})
from workbench.capture import workers
configs = [{{"x": i, "sleep": 0.1}} for i in range(8)]
workers.run_configs("test_workers.echo", configs, {run_dir!r}, {{"kind": "sweep", "params": {{}}}},
                    progress=False)
"""


def test_rows_survive_a_killed_parent_and_a_rerun_resumes(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    rows_file = tmp_path / workers.ROWS_FILE
    code = PARENT.format(here=str(HERE), run_dir=str(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=HERE.parent)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if rows_file.exists() and len(rows_file.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    kept = workers.read_rows(tmp_path)
    assert 2 <= len(kept) < 8
    assert read_meta(tmp_path)["state"] == "running"
    with rows_file.open("a") as f:  # a write cut short by the kill
        f.write('{"key": "{\\"sleep\\":0.1,\\"x\\":7}", "sta')
    configs = [{"x": i, "sleep": 0.1} for i in range(8)]
    rows = workers.run_configs(
        "test_workers.echo", configs, tmp_path, {"kind": "sweep", "params": {}}, progress=False
    )
    assert [r["value"] for r in rows] == [2 * i for i in range(8)]
    lines = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(lines) == 8  # nothing redone, the broken line gone
    assert [r for r in lines if r["x"] in {k["x"] for k in kept}] == kept
    assert read_meta(tmp_path)["state"] == "finished"


def test_a_different_experiment_in_the_same_run_dir_is_refused(tmp_path):
    _run(tmp_path, [{"how": "fine"}])
    with pytest.raises(WorkbenchError, match="different experiment"):
        workers.run_configs(
            "test_workers.misbehave", [], tmp_path, {"kind": "ab", "params": {}}, progress=False
        )


def test_a_worker_killed_near_the_memory_limit_is_oom_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    configs = [{"peak_rss": 20 * GIB, "free": 100 * MIB}, {"peak_rss": 50 * MIB, "free": 20 * GIB}]
    meta = {"kind": "sweep", "params": {}}
    rows = workers.run_configs("test_workers.killed", configs, tmp_path, meta, progress=False)
    assert [r["status"] for r in rows] == ["oom", "crash"]
    assert "SIGKILL" in rows[0]["error"] and "peak RSS 20.0 GiB" in rows[0]["error"]
    assert rows[0]["peak_rss_bytes"] == 20 * GIB
    assert rows[1]["error"] == "killed by signal SIGKILL"  # a kill -9 with memory to spare


def test_oom_kill_reason_reads_the_kernels_counters_and_the_workers_last_reading():
    from workbench.capture.worker_memory import oom_kill_reason

    kill = -signal.SIGKILL
    counted = oom_kill_reason(kill, GIB, 20 * GIB, {"vmstat": 3}, {"vmstat": 4})
    assert counted is not None and "OOM killer" in counted
    assert oom_kill_reason(kill, GIB, 20 * GIB, {"vmstat": 3}, {"vmstat": 3}) is None
    assert oom_kill_reason(kill, 20 * GIB, 100 * MIB, {}, {}) is not None  # nearly out
    assert oom_kill_reason(kill, 0, -1, {}, {}) is None  # no reading: no evidence
    assert oom_kill_reason(-signal.SIGSEGV, 20 * GIB, 0, {"vmstat": 1}, {"vmstat": 2}) is None
    assert oom_kill_reason(3, 20 * GIB, 0, {}, {}) is None


def test_workers_that_would_not_fit_together_run_one_at_a_time(tmp_path, monkeypatch):
    # The parent reads the host's free memory; here it says 10 GiB whatever the machine has.
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 10 * GIB)
    configs = [{"need": 6 * GIB, "sleep": 1.0, "i": 0}, {"need": 6 * GIB, "sleep": 1.0, "i": 1},
               {"need": 20 * GIB, "sleep": 0.0, "i": 2}, {"need": GIB, "sleep": 2.0, "i": 3},
               {"need": GIB, "sleep": 2.0, "i": 4}]  # fmt: skip
    rows = workers.run_configs("test_workers.timed", configs, tmp_path,
                               {"kind": "sweep", "params": {}}, workers=2, progress=False,
                               gpus=[], host_bytes=lambda c: c["need"])  # fmt: skip
    a, b, big, c, d = rows
    assert a["status"] == b["status"] == c["status"] == d["status"] == "ok"
    assert b["start"] >= a["end"] or a["start"] >= b["end"]  # 12 GiB would not fit in 10
    assert c["start"] < d["end"] and d["start"] < c["end"]  # 2 GiB do: two at once
    assert big["status"] == "oom" and big["need_bytes"] == 20 * GIB and "start" not in big
    assert "20.0 GiB" in big["error"] and "10.0 GiB" in big["error"]


def test_a_bad_worker_count_or_a_repeated_configuration_is_refused(tmp_path):
    for bad in (0, -1):
        with pytest.raises(WorkbenchError, match=f"workers={bad}"):
            _run(tmp_path / str(bad), [{"how": "fine"}], workers=bad)
    with pytest.raises(WorkbenchError, match="given twice"):
        _run(tmp_path / "twice", [{"how": "fine"}, {"how": "fine"}])
    assert not any(tmp_path.iterdir())  # refused before anything was written


ORPHAN = """
import sys
sys.path.insert(0, {here!r})
from workbench.capture import workers
workers.run_configs("test_workers.sleeper", [{{"pidfile": {pidfile!r}}}], {run_dir!r},
                    {{"kind": "sweep", "params": {{}}}}, progress=False)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie has finished; only its exit status waits to be read)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_parent_leaves_no_worker_running(tmp_path, sig):
    pidfile = tmp_path / "worker.pid"
    code = ORPHAN.format(here=str(HERE), pidfile=str(pidfile), run_dir=str(tmp_path / "run"))
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=HERE.parent)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (pidfile.exists() and pidfile.read_text()):
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        parent.send_signal(sig)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), f"worker {worker} outlived its parent ({sig.name})"
        if sig == signal.SIGTERM:  # the parent unwound and killed its workers itself
            assert parent.returncode == 128 + signal.SIGTERM
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)
