"""What a new user hits first: bad output paths found before any work, one-line errors instead
of tracebacks, and no debris left by a killed capture."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import workbench
from workbench.capture.debris import TEMP_PREFIX, remove_leftovers
from workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
RUN = next((ROOT / "raw").glob("profile-dsv4-flash-tp2-stock-bf16-33863t-*"))


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("flag", ["--out", "--html"])
def test_a_bad_output_path_is_refused_before_the_profile_runs(tmp_path, capsys, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = str(blocker) if flag == "--out" else str(tmp_path)  # a file / a folder
    started = time.perf_counter()
    code = main(["profile", "--prompt-tokens", "300", "--decode-tokens", "2", flag, target,
                 "--no-progress"])  # fmt: skip
    assert code == 2 and time.perf_counter() - started < 5  # nothing was profiled
    assert f"{flag}={target}" in capsys.readouterr().err
    assert not list(Path.cwd().glob("raw/profile-tiny-*-300t-*"))


def test_the_api_refuses_an_output_file_too(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(workbench.WorkbenchError, match="is a file, not a folder"):
        workbench.profile(300, 2, out=blocker)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"prompt_tokens": "abc"}, "prompt_tokens='abc' is not a whole number"),
        ({"prompt_tokens": 16.7}, "prompt_tokens=16.7 is not a whole number"),
        ({"prompt_tokens": None}, "prompt_tokens=None is not a whole number"),
        ({"decode_tokens": 0}, "decode_tokens=0 is below 1"),
        ({"device": "tpu"}, "device='tpu' is not a device"),
        ({"prompt_tokens": 10**9}, "out of host memory"),
        ({"mode": "fast"}, "unknown profile setting mode"),
    ],
)
def test_impossible_parameters_get_one_clear_error(tmp_path, settings, message):
    with pytest.raises(workbench.WorkbenchError, match=message):
        workbench.profile(out=tmp_path, **settings)


def test_a_closed_pipe_ends_show_quietly():
    shown = subprocess.run(
        f"{sys.executable} -m workbench.cli show {RUN} | head -1",
        shell=True, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr


def test_leftovers_of_dead_captures_are_removed_and_said(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    staged = tmp_path / f".profile-tiny-x.pid{dead}.abcd"
    mine = tmp_path / f".profile-tiny-y.pid{alive}.efgh"  # a capture still writing
    trace = Path(tempfile.gettempdir()) / f"{TEMP_PREFIX}profile.pid{dead}.ijkl"
    for folder in (staged, mine, trace):
        folder.mkdir()
        (folder / "trace.json").write_bytes(b"x" * 2048)
    said = remove_leftovers(tmp_path)
    assert not staged.exists() and not trace.exists() and mine.exists()
    assert len(said) == 2 and all("left by a killed capture" in line for line in said)


def test_sigterm_during_a_profile_leaves_no_debris(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "profile", "--prompt-tokens", "20000",
         "--decode-tokens", "50", "--out", str(tmp_path), "--no-progress"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    pattern = f"{TEMP_PREFIX}profile.pid{proc.pid}.*"
    deadline = time.monotonic() + 60
    while not list(Path(tempfile.gettempdir()).glob(pattern)) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    assert list(Path(tempfile.gettempdir()).glob(pattern)), "the profile never started"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert not list(Path(tempfile.gettempdir()).glob(pattern))
    assert not list(tmp_path.iterdir())
