"""Run each configuration of an experiment in its own worker process, under a watchdog.

A configuration that deadlocks, segfaults or exhausts memory must become a row of the results,
not the end of the experiment, so each one runs in a fresh 'spawn' process (no CUDA context or
Triton state shared with the parent or the previous configuration) and the parent only waits,
kills and records. The parent imports neither torch nor triton: exceptions are classified by
class name. Rows are appended to `<run_dir>/rows.jsonl` as soon as they finish (flushed and
fsynced), so killing the parent loses at most the configurations in flight, and a rerun into
the same run directory resumes where it stopped.

Memory is planned, not discovered: given each configuration's estimated host memory, the
parent starts a worker only when it fits beside the running ones, and records one that cannot
fit at all as `oom` without starting it. A worker the kernel's OOM killer ends is `oom` too,
not a crash (`worker_memory.oom_kill_reason`). No worker outlives the parent: SIGTERM unwinds
it through the code that kills the workers' process groups, and a worker whose parent died
(SIGKILL) ends itself and its process group (`worker_memory.watch`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import importlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import connection, get_context
from pathlib import Path

from tqdm.auto import tqdm

from workbench.artifacts import (
    ROWS_FILE,
    RUN_FILE,
    SCHEMA_VERSION,
    read_meta,
    read_rows,
    write_json_atomic,
)
from workbench.capture import memory
from workbench.capture.worker_memory import oom_kill_reason, oom_row, watch
from workbench.errors import WorkbenchError


def config_key(config: dict) -> str:
    """The identity of a configuration in rows.jsonl: its canonical JSON."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def resolve(dotted: str) -> Callable[[dict], dict]:
    """`package.module.function` -> the function; it must be importable in a fresh process."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


# torch's CUDA OutOfMemoryError, Python's MemoryError, and memory.NotEnoughMemoryError (an
# estimate that refused the work before allocating).
OOM_CLASSES = {"OutOfMemoryError", "MemoryError", "NotEnoughMemoryError"}


def classify(err: BaseException) -> str:
    """Status of a configuration whose worker raised, by class name (no torch import needed);
    torch's CPU allocator raises a plain RuntimeError that says it could not allocate."""
    names = {cls.__name__ for cls in type(err).__mro__}
    if names & OOM_CLASSES or "can't allocate memory" in str(err):
        return "oom"
    if "CompilationError" in names:
        return "compile-error"
    return "error"


def _child(
    fn: str,
    config: dict,
    conn: connection.Connection,
    env: dict[str, str],
    readings: object,
    parent: int,
) -> None:
    """Worker entry point: own process group (so a timeout kills its children too), its
    environment (CUDA_VISIBLE_DEVICES, TRITON_INTERPRET: before anything imports torch or
    triton), the memory and parent watch, then run."""
    os.setpgrp()
    os.environ.update(env)
    watch(readings, parent)
    try:
        row = dict(resolve(fn)(config))
    except BaseException as err:  # noqa: BLE001 (every failure is a result of the experiment)
        row = {"status": classify(err), "error": f"{type(err).__name__}: {str(err)[:300]}"}
    conn.send(row)
    conn.close()


def visible_gpus() -> list[str]:
    """GPU ids to spread workers over, without importing torch: CUDA_VISIBLE_DEVICES if set,
    else the /dev/nvidiaN device files."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    nodes = glob.glob("/dev/nvidia[0-9]*")
    return sorted((n.removeprefix("/dev/nvidia") for n in nodes), key=int)


def _drop_partial_line(path: Path) -> None:
    """Cut a last line without its newline, so new rows do not glue onto a broken one."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def _append(path: Path, row: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


@dataclass
class _Running:
    process: object
    conn: connection.Connection
    config: dict
    slot: str | None
    deadline: float
    need: int  # estimated host bytes at its peak
    readings: object  # shared [peak RSS, least free host memory], written by the worker
    oom_kills: dict[str, int]  # the kernel's OOM-kill counters when it started

    def died(self) -> dict:
        """The row of a worker that ended without a result: `oom` where the OOM killer took
        it, else `crash` with its exit code or signal."""
        code = self.process.exitcode
        peak, least_free = self.readings[0], self.readings[1]
        reason = oom_kill_reason(code, peak, least_free, self.oom_kills, memory.oom_kill_counts())
        if reason is not None:
            return {"status": "oom", "error": reason, "exitcode": code, "peak_rss_bytes": peak}
        return {"status": "crash", "error": _exit_reason(code), "exitcode": code}


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def _room(running: list[_Running]) -> int | None:
    """Host memory a new worker may take: free memory, less what the running workers are yet
    to allocate of their estimates (their peak RSS so far is already taken); None: unknown."""
    free = memory.available_host_bytes()
    if free is None:
        return None
    return free - sum(max(0, job.need - job.readings[0]) for job in running)


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Make SIGTERM raise SystemExit while workers run, so `run_configs` kills their process
    groups on the way out; left alone where a caller has its own handler (the CLI's unwinds
    too) or outside the main thread, where handlers cannot be set."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _start_meta(run_dir: Path, meta: dict) -> dict:
    """Write run.json at the start; a run directory of a different experiment is refused."""
    document = {**meta, "schema_version": SCHEMA_VERSION}
    if (run_dir / RUN_FILE).exists():
        old = read_meta(run_dir)
        if (old.get("kind"), old.get("params")) != (meta.get("kind"), meta.get("params")):
            raise WorkbenchError(
                f"{run_dir} holds a different experiment ({old.get('kind')}, "
                f"{old.get('params')}); resume only the same one, or give a new run_dir."
            )
        document["started"] = old.get("started")
    document["started"] = document.get("started") or dt.datetime.now().isoformat()
    document["state"] = "running"
    write_json_atomic(run_dir / RUN_FILE, document)
    return document


def run_configs(
    fn: str,
    configs: Sequence[dict],
    run_dir: str | Path,
    meta: dict,
    timeout_s: float = 600.0,
    workers: int | None = None,
    progress: bool = True,
    *,
    gpus: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    host_bytes: Callable[[dict], int] | None = None,
) -> list[dict]:
    """Run `fn(config) -> row` (dotted name) for each config in a worker process; return rows.

    A row is the function's own (its `status`), or `oom`, `compile-error`, `error` when it
    raised, `oom` when the OOM killer ended it or its estimate did not fit, `crash` when its
    process died otherwise, `timeout` when the watchdog killed it after `timeout_s`. Every row
    holds its config and `key`. Workers run one per GPU of `gpus` (default: the visible ones;
    CUDA_VISIBLE_DEVICES set per worker), else `workers` at once on the CPU (default 1), with
    `env` set in each. `host_bytes(config)`: its worker's estimated peak host memory, which
    must fit beside the running workers' (module docstring). Configurations whose key is
    already in rows.jsonl are not run again.
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):  # fmt: skip
        raise WorkbenchError(f"workers={workers!r}: give how many run at once, 1 or more.")
    if not timeout_s > 0:
        raise WorkbenchError(f"timeout_s={timeout_s!r}: give the seconds a worker may take.")
    keys = [config_key(c) for c in configs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:  # one row per key: the second run would overwrite the first
        raise WorkbenchError(f"configuration {twice[0]} given twice; give each once.")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    document = _start_meta(run_dir, meta)
    rows_path = run_dir / ROWS_FILE
    _drop_partial_line(rows_path)
    done = {row["key"] for row in read_rows(run_dir)}
    pending = [c for c in configs if config_key(c) not in done]
    gpus = visible_gpus() if gpus is None else list(gpus)
    slots: list[str | None] = list(gpus) if gpus else [None] * (workers or 1)
    ctx = get_context("spawn")
    running: list[_Running] = []
    bar = tqdm(total=len(configs), initial=len(configs) - len(pending), disable=not progress,
               desc=meta.get("kind", "experiment"))  # fmt: skip

    def finish(config: dict, row: dict) -> None:
        _append(rows_path, {**config, **row, "key": config_key(config)})
        bar.update()

    def start(config: dict, slot: str | None, need: int) -> None:
        receive, send = ctx.Pipe(duplex=False)
        readings = ctx.RawArray("q", [0, -1])  # peak RSS, least free host memory (-1: none)
        child_env = {**(env or {}), **({} if slot is None else {"CUDA_VISIBLE_DEVICES": slot})}
        kills = memory.oom_kill_counts()
        process = ctx.Process(
            target=_child, args=(fn, config, send, child_env, readings, os.getpid())
        )
        process.start()
        send.close()  # the child holds the only writer: EOF on receive means it died
        deadline = time.monotonic() + timeout_s
        running.append(_Running(process, receive, config, slot, deadline, need, readings, kills))

    def done_with(job: _Running, row: dict) -> None:
        running.remove(job)
        slots.append(job.slot)
        finish(job.config, row)

    try:
        with _sigterm_unwinds():
            while pending or running:
                while pending and slots:
                    need = host_bytes(pending[0]) if host_bytes else 0
                    room = _room(running) if host_bytes else None
                    if room is not None and need > room:
                        if running:  # it may fit once a running worker has finished
                            break
                        finish(pending.pop(0), oom_row(need, room, "host"))
                        continue
                    start(pending.pop(0), slots.pop(0), need)
                if not running:
                    continue
                wait = max(0.0, min(job.deadline for job in running) - time.monotonic())
                ready = connection.wait([job.conn for job in running], timeout=min(wait, 1.0))
                for job in list(running):
                    if job.conn in ready:
                        try:
                            row = job.conn.recv()
                        except EOFError:
                            job.process.join()
                            row = job.died()
                        job.process.join()
                        job.conn.close()
                        done_with(job, row)
                    elif time.monotonic() >= job.deadline:
                        _kill(job.process)
                        job.conn.close()
                        done_with(job, {"status": "timeout",
                                        "error": f"no result after {timeout_s} s"})  # fmt: skip
    finally:
        for job in running:
            _kill(job.process)
        bar.close()
    rows = {row["key"]: row for row in read_rows(run_dir)}
    statuses = [rows[config_key(c)].get("status") for c in configs if config_key(c) in rows]
    write_json_atomic(
        run_dir / RUN_FILE,
        {**document, "state": "finished", "finished": dt.datetime.now().isoformat(),
         "rows": len(statuses), "statuses": {s: statuses.count(s) for s in set(statuses)}},
    )  # fmt: skip
    return [rows[config_key(c)] for c in configs if config_key(c) in rows]


def _kill(process) -> None:
    """SIGKILL the worker's whole process group (it called setpgrp), then reap it."""
    if process.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.kill()  # also when it was killed before its setpgrp ran
    process.join()
