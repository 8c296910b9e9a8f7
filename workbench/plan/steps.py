"""Running one step: its own process group, its time limit, and every byte of its output.

A GPU capture can hang (a deadlocked kernel, ncu waiting on a lock) or leave children behind
(profilers, torch workers), and its time on a lent box is short. So each step starts in a new
session, its output goes to the log as it comes, and when it reaches its limit, or finishes
and leaves processes running, the whole group gets SIGTERM and then, after a grace period,
SIGKILL: nothing a step started outlives it or holds the next step's GPU.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from string import Template
from typing import BinaryIO, TextIO

from workbench.plan.plan_file import OUT_TOKEN, Step
from workbench.plan.records import FAILED, OK, TIMEOUT, RunContext, StepResult, now

GRACE_S = 10.0  # between SIGTERM and SIGKILL: time for ncu and torch to clean up


def command(step: Step, out_dir: Path) -> tuple[list[str], str]:
    """The argv to start and the command as logged, with {out} filled in."""
    if isinstance(step.run, str):
        text = step.run.replace(OUT_TOKEN, shlex.quote(str(out_dir)))
        return ["/bin/sh", "-c", text], text
    argv = [arg.replace(OUT_TOKEN, str(out_dir)) for arg in step.run]
    return argv, shlex.join(argv)


# Search paths whose relative entries a step's variables give from the repository root
SEARCH_PATHS = ("PYTHONPATH", "PATH")


def _environment(step: Step, root: Path, out_dir: Path) -> dict[str, str]:
    """The caller's environment, with the repository importable, Python unbuffered (so output
    lands in the log in order), `python3` meaning this interpreter inside a virtual
    environment, and the step's own variables ($VAR in them expanded). A relative entry a step
    puts in PYTHONPATH or PATH (`build/ncu`) is made absolute from the root, and an empty one
    dropped: a command that runs workers from another folder keeps finding what it names."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if sys.prefix != sys.base_prefix:
        env["PATH"] = os.pathsep.join(
            filter(None, [str(Path(sys.executable).parent), env.get("PATH")])
        )
    for key, value in step.env.items():
        value = Template(value.replace(OUT_TOKEN, str(out_dir))).safe_substitute(env)
        if key in SEARCH_PATHS:
            # (an empty entry, left by an unset ${PYTHONPATH}, would mean the current folder)
            value = os.pathsep.join(str(root / entry) for entry in value.split(os.pathsep)
                                    if entry)  # fmt: skip
        env[key] = value
    return env


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _copy_output(pipe: BinaryIO, log: BinaryIO, echo: TextIO | None) -> None:
    """Everything the step writes, to the log as it comes (and to the console)."""
    while chunk := pipe.read1(1 << 16):
        log.write(chunk)
        log.flush()
        if echo is not None:
            echo.write(chunk.decode("utf-8", errors="replace"))
            echo.flush()


def _stop(proc: subprocess.Popen[bytes], reader: threading.Thread, grace_s: float) -> None:
    """End whatever is left of the step's process group: SIGTERM, then SIGKILL after
    `grace_s` if the leader or anything holding its output is still there."""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    reader.join(max(0.0, deadline - time.monotonic()))
    if proc.poll() is None or reader.is_alive():
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(grace_s)


def run_step(
    step: Step, result: StepResult, limit_s: float, budget_cut: bool, ctx: RunContext
) -> None:
    """Run `step` for at most `limit_s` seconds and fill in `result`; `budget_cut` says the
    limit is what is left of the plan's budget rather than the step's own timeout."""
    argv, _ = command(step, ctx.out_dir)
    result.started, result.limit_s = now(), round(limit_s, 3)
    ctx.write(f"== start {result.started}, limit {limit_s:.1f} s\n")
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            cwd=ctx.root,
            env=_environment(step, ctx.root, ctx.out_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, stopped as one
        )
    except OSError as err:
        result.status, result.note = FAILED, f"could not start: {err}"
        ctx.write(f"{result.note}\n")
        return
    reader = threading.Thread(
        target=_copy_output, args=(proc.stdout, ctx.log, ctx.echo), daemon=True
    )
    reader.start()
    try:
        proc.wait(timeout=limit_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:  # the runner itself is stopped: the step must not outlive it
        _stop(proc, reader, ctx.grace_s)
        result.duration_s, result.exit_code = time.monotonic() - start, proc.returncode
        result.status, result.note = FAILED, "stopped: the plan runner was interrupted"
        raise
    _stop(proc, reader, ctx.grace_s)  # also ends what a finished step left running
    result.duration_s = time.monotonic() - start
    result.exit_code = proc.returncode
    if timed_out:
        result.status = TIMEOUT
        result.note = (
            "stopped: the plan's budget ran out"
            if budget_cut
            else f"stopped at its timeout ({step.timeout_s:g} s)"
        )
    else:
        result.status = OK if proc.returncode == 0 else FAILED
    if reader.is_alive():
        result.note = (result.note + "; " if result.note else "") + "output still open"
