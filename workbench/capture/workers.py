"""Run each configuration of an experiment in its own worker process, under a watchdog.

A configuration that deadlocks, segfaults or exhausts memory must become a row of the results,
not the end of the experiment, so each one runs in a fresh 'spawn' process (no CUDA context or
Triton state shared with the parent or the previous configuration) and the parent only waits,
kills and records. The parent imports neither torch nor triton: exceptions are classified by
class name. Rows are appended to `<run_dir>/rows.jsonl` as soon as they finish (flushed and
fsynced), so killing the parent loses at most the configurations in flight, and a rerun into
the same run directory resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import glob
import importlib
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import connection, get_context
from pathlib import Path

from tqdm.auto import tqdm

from workbench.artifacts import RUN_FILE, SCHEMA_VERSION, read_meta, write_json_atomic
from workbench.errors import WorkbenchError

ROWS_FILE = "rows.jsonl"


def config_key(config: dict) -> str:
    """The identity of a configuration in rows.jsonl: its canonical JSON."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def resolve(dotted: str) -> Callable[[dict], dict]:
    """`package.module.function` -> the function; it must be importable in a fresh process."""
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def classify(err: BaseException) -> str:
    """Status of a configuration whose worker raised, by class name (no torch import needed)."""
    names = {cls.__name__ for cls in type(err).__mro__}
    if "OutOfMemoryError" in names:
        return "oom"
    if "CompilationError" in names:
        return "compile-error"
    return "error"


def _child(fn: str, config: dict, conn: connection.Connection, device: str | None) -> None:
    """Worker entry point: own process group (so a timeout kills its children too), then run."""
    os.setpgrp()
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device  # before anything imports torch
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


def read_rows(run_dir: Path) -> list[dict]:
    """Rows of rows.jsonl; lines that do not parse (a write cut short by a kill) are skipped,
    so their configurations run again on resume."""
    path = Path(run_dir) / ROWS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "key" in row:
            rows.append(row)
    return rows


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


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


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
) -> list[dict]:
    """Run `fn(config) -> row` (dotted name) for each config in a worker process; return rows.

    A row is the function's own (its `status`), or `oom`, `compile-error`, `error` when it
    raised, `crash` when its process died without a result, `timeout` when the watchdog killed
    it after `timeout_s`. Every row holds its config and `key`. With GPUs visible one worker
    runs per GPU (CUDA_VISIBLE_DEVICES set per worker); otherwise `workers` (default 1).
    Configurations whose key is already in rows.jsonl are not run again.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    document = _start_meta(run_dir, meta)
    rows_path = run_dir / ROWS_FILE
    _drop_partial_line(rows_path)
    done = {row["key"] for row in read_rows(run_dir)}
    pending = [c for c in configs if config_key(c) not in done]
    gpus = visible_gpus()
    slots: list[str | None] = gpus if gpus else [None] * (workers or 1)
    ctx = get_context("spawn")
    running: list[_Running] = []
    bar = tqdm(total=len(configs), initial=len(configs) - len(pending), disable=not progress,
               desc=meta.get("kind", "experiment"))  # fmt: skip

    def finish(job: _Running, row: dict) -> None:
        _append(rows_path, {**job.config, **row, "key": config_key(job.config)})
        running.remove(job)
        slots.append(job.slot)
        bar.update()

    try:
        while pending or running:
            while pending and slots:
                config, slot = pending.pop(0), slots.pop(0)
                receive, send = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_child, args=(fn, config, send, slot))
                process.start()
                send.close()  # the child holds the only writer: EOF on receive means it died
                running.append(
                    _Running(process, receive, config, slot, time.monotonic() + timeout_s)
                )
            now = time.monotonic()
            wait = max(0.0, min(job.deadline for job in running) - now)
            ready = connection.wait([job.conn for job in running], timeout=min(wait, 1.0))
            for job in list(running):
                if job.conn in ready:
                    try:
                        row = job.conn.recv()
                    except EOFError:
                        job.process.join()
                        reason = _exit_reason(job.process.exitcode)
                        row = {"status": "crash", "error": reason,
                               "exitcode": job.process.exitcode}  # fmt: skip
                    job.process.join()
                    job.conn.close()
                    finish(job, row)
                elif time.monotonic() >= job.deadline:
                    _kill(job.process)
                    job.conn.close()
                    finish(job, {"status": "timeout", "error": f"no result after {timeout_s} s"})
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
