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

from workbench.artifacts import read_meta
from workbench.capture import workers

HERE = Path(__file__).parent


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
    import pytest

    from workbench.errors import WorkbenchError

    _run(tmp_path, [{"how": "fine"}])
    with pytest.raises(WorkbenchError, match="different experiment"):
        workers.run_configs(
            "test_workers.misbehave", [], tmp_path, {"kind": "ab", "params": {}}, progress=False
        )
