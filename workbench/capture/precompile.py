"""Compile a GPU profile's Triton kernels in parallel, before its warm-up launches them.

A launch whose kernel is not in memory compiles it then and there, and waits: a warm-up on an
empty Triton cache compiles some forty kernels one after the other (a 30 s warm-up in the
default profile's 49 s on the H200, with their C launchers; docs/design.md). Triton's compiler
holds the GIL, so threads do not overlap it; processes do. Three steps:

1. `collect_launches`: run the warm-up's Python once with every Triton launch turned into a
   warm-up call (which compiles but never launches) and Triton's `jit_cache_hook`, asked before
   each compile, vetoing the compile after recording the launch's specialisation (Triton's own
   serialised form, as `JITFunction.preload` reads it). So no Triton kernel runs, not even one
   already compiled in this process, which would read what a skipped kernel left. torch ops
   still run, on whatever the skipped kernels left in their outputs: the pass only carries
   shapes forward, which suits a model whose shapes and routing never depend on a kernel's
   output (`SyntheticModel` draws its routing up front).
2. `missing`: keep the launches whose binaries are not in the on-disk cache yet.
3. `compile_missing`: compile those in worker processes (`Workers`; started fresh, since the
   parent holds a CUDA context a fork must not inherit), each writing binary and launcher into
   the shared cache. The warm-up then only loads them.

Nothing here can change a result: a launch that is missed, or fails to compile in a worker, is
compiled by the warm-up as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, BinaryIO

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

WORKERS_VARIABLE = "WORKBENCH_PRECOMPILE_WORKERS"  # 0 turns the parallel compile off
MAX_WORKERS = 8  # a machine's: more only crowd the CPUs the profile itself is building on
TASK_TIMEOUT_S = 300  # a compile that takes longer is abandoned (the warm-up compiles it)


@dataclass(frozen=True)
class Launch:
    """One kernel specialisation a run needs: the kernel by module and name, and Triton's
    serialised specialisation data (signature, constexprs, attributes, options)."""

    module: str
    name: str
    specialization: str
    cache_key: str = ""  # the kernel's source hash as this process computed it (see source_of)


def worker_count(ranks: int = 1) -> int:
    """$WORKBENCH_PRECOMPILE_WORKERS, else one fewer than the CPUs, at most MAX_WORKERS; each of
    `ranks` processes on the machine (tensor parallelism) starts its share."""
    given = os.environ.get(WORKERS_VARIABLE)
    if given is None:
        total = max(1, min(MAX_WORKERS, (os.cpu_count() or 2) - 1))
    elif given.isdigit():
        total = int(given)
    else:
        raise WorkbenchError(
            f"{WORKERS_VARIABLE}={given!r} is not a worker count; give a whole number (0 "
            "compiles in the warm-up instead)."
        )
    return -(-total // ranks) if total else 0


class Workers:
    """`count` worker processes (`python -m workbench.capture.precompile`), started at once so
    that they import Triton and torch while the caller builds its model, each compiling one
    launch at a time from its stdin. Plain subprocesses rather than multiprocessing's spawn,
    which re-runs the caller's main script in every child: a notebook is safe either way, a
    script without an `if __name__ == "__main__"` guard is not."""

    def __init__(self, count: int) -> None:
        self.count = count
        # stderr to files, not pipes: a pipe nobody reads fills up and stalls its writer
        self.logs = {}
        self.processes = []
        for _ in range(count):
            log = tempfile.TemporaryFile()  # noqa: SIM115  (open as long as its worker)
            process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip
            self.processes.append(process)
            self.logs[process.pid] = log

    def compile(self, launches: list[Launch], target: GPUTarget) -> dict[Launch, str | None]:
        """Each launch's error (None when it compiled), the launches shared out as workers
        finish. A worker that exits, or takes over TASK_TIMEOUT_S on one launch (it is
        killed), fails that launch with what it wrote to stderr and takes no more."""
        queue, errors, lock = list(reversed(launches)), {}, threading.Lock()
        where = [target.backend, target.arch, target.warp_size]

        def serve(process: subprocess.Popen) -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    launch = queue.pop()
                watchdog = threading.Timer(TASK_TIMEOUT_S, process.kill)
                watchdog.start()
                try:
                    process.stdin.write(json.dumps({"launch": asdict(launch), "target": where}))
                    process.stdin.write("\n")
                    process.stdin.flush()
                    answer = process.stdout.readline()
                except OSError:
                    answer = ""
                finally:
                    watchdog.cancel()
                errors[launch] = _error_of(answer, process, self.logs[process.pid])
                if not answer:
                    return

        threads = [threading.Thread(target=serve, args=(p,)) for p in self.processes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return errors

    def close(self) -> None:
        """End the workers at once: every task given has been answered, and a worker still
        importing (a warm cache gave it none) need not finish."""
        for process in self.processes:
            process.kill()
            with contextlib.suppress(OSError):
                process.stdin.close()
            process.wait()
            self.logs[process.pid].close()


def _error_of(answer: str, process: subprocess.Popen, log: BinaryIO) -> str | None:
    """A worker's answer line as its error (None: compiled); no line: it exited or was killed,
    and the end of its stderr (`log`) says why."""
    if answer:
        try:
            return json.loads(answer)["error"]
        except (ValueError, KeyError, TypeError):
            return f"the worker answered {answer.strip()[:200]!r}"
    process.kill()
    process.wait()
    log.seek(0)
    said = log.read().decode(errors="replace").strip().splitlines()
    why = f": {said[-1][:300]}" if said else ""
    return (
        f"the worker exited (status {process.returncode}; killed after {TASK_TIMEOUT_S} s "
        f"if negative){why}"
    )


def start_workers(count: int) -> Workers | None:
    """`count` workers, importing while the caller builds; None for 0 or where no process can
    be started (the warm-up then compiles, as without them)."""
    if count < 1:
        return None
    try:
        return Workers(count)
    except OSError:
        return None


def serve() -> None:
    """A worker's loop: one JSON task a line in, one JSON answer a line out."""
    # Answers go to a copy of stdout; stdout itself (Python's and the C libraries') to stderr,
    # before the imports, so that nothing they print is read as an answer.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    import torch  # noqa: F401  (the kernel modules import it: once, before the first task)
    from triton.backends.compiler import GPUTarget as Target

    for line in sys.stdin:
        task = json.loads(line)
        try:
            compile_launch(Launch(**task["launch"]), Target(*task["target"]))
            error = None
        except Exception as err:  # noqa: BLE001  (reported; the warm-up compiles it)
            error = f"{type(err).__name__}: {err}"
        answers.write(json.dumps({"error": error}) + "\n")
        answers.flush()


def collect_launches(run: Callable[[], object]) -> list[Launch]:
    """Every distinct specialisation `run()` would compile, with no Triton kernel launched."""
    from triton import knobs
    from triton.runtime.jit import JITFunction, JitFunctionInfo

    seen: dict[tuple[str, str, str], Launch] = {}

    def veto(*, key: object, fn: JitFunctionInfo, compile: dict, **_: object) -> bool:
        seen.setdefault(
            (fn.module, fn.name, str(key)),
            Launch(fn.module, fn.name, compile["specialization_data"], fn.jit_function.cache_key),
        )
        return True  # no compile: the launch returns without running

    launch = JITFunction.run

    def warm_up_only(self: JITFunction, *args: object, grid: object, warmup: bool, **kw: object):
        return launch(self, *args, grid=grid, warmup=True, **kw)

    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = veto
    JITFunction.run = warm_up_only  # a kernel compiled before: found, not launched
    try:
        run()
    finally:
        JITFunction.run = launch
        knobs.runtime.jit_cache_hook = previous
    return list(seen.values())


def kernel_of(launch: Launch) -> JITFunction:
    """The JITFunction a launch names (module attribute by qualified name)."""
    found = importlib.import_module(launch.module)
    for part in launch.name.split("."):
        found = getattr(found, part)
    return found


def source_of(launch: Launch, target: GPUTarget) -> tuple[ASTSource, object]:
    """(Triton's source object, parsed options) for the launch, read as `JITFunction.preload`
    reads the serialised specialisation, so the cache key is the launch's own.

    The kernel's source hash is taken from the launch, not recomputed: Triton folds the global
    values a kernel's callees use into a caller's hash only once those callees have been
    hashed, so the hash of a kernel that shares helpers with others depends on the order a
    process first hashed them, and a worker's order is not the profile's."""
    import triton.language as tl
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import convert_to_tuple_if_list

    kernel, data = kernel_of(launch), json.loads(launch.specialization)
    if launch.cache_key:
        kernel.hash = launch.cache_key

    def constant(value):
        if tl.dtype.is_dtype(value):
            return tl.dtype(value)
        if isinstance(value, dict) and "constexpr" in value:
            return tl.constexpr(value["constexpr"])
        if isinstance(value, dict) and "jit_function" in value:  # Triton 3.7's form
            module, name = value["jit_function"].split(":")
            return kernel_of(Launch(module, name, ""))
        return value

    constexprs = {
        tuple(k): constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"])
    }
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"])}
    signature = {k: convert_to_tuple_if_list(v) for k, v in data["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()}
    if kernel.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as source_type
    else:
        source_type = ASTSource
    source = source_type(kernel, signature, constexprs, attrs)
    return source, make_backend(target).parse_options(options)


def in_disk_cache(launch: Launch, target: GPUTarget) -> bool:
    """Whether `triton.compile` would load this launch's binary from the on-disk cache: its
    own lookup (cache key, then the metadata file in its group). False when in doubt."""
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import make_backend
    from triton.runtime.cache import get_cache_key, get_cache_manager

    if knobs.compilation.always_compile:
        return False
    try:
        source, options = source_of(launch, target)
        backend = make_backend(target)
        options = backend.parse_options(dict(options.__dict__, **source.parse_options()))
        key = get_cache_key(source, backend, options, env_vars=get_cache_invalidating_env_vars())
        manager = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
        name = f"{source.name[:150]}.json"
        return name in (manager.get_group(name) or {})
    except Exception:  # noqa: BLE001  (any doubt: compile it)
        return False


def compile_launch(launch: Launch, target: GPUTarget) -> None:
    """Compile one launch into the on-disk cache, with its C launcher (a worker's task)."""
    import triton

    source, options = source_of(launch, target)
    compiled = triton.compile(source, target=target, options=options.__dict__)
    if target.backend == "cuda":
        from triton.backends.nvidia.driver import CudaLauncher

        # Built into the cache too; where it cannot be (no CUDA driver here), the first launch
        # builds it, as it would have anyway.
        with contextlib.suppress(Exception):
            CudaLauncher(compiled.src, compiled.metadata)


@dataclass(frozen=True)
class Precompiled:
    """What the parallel compile did, for run.json's `compiles`."""

    needed: int  # distinct specialisations the warm-up launches
    compiled: int  # of those, compiled by the workers
    kernels: tuple[str, ...]  # the kernels compiled, by name
    failed: dict[str, str]  # kernel -> why a worker could not compile it (the warm-up will)
    workers: int
    seconds: float

    def summary(self) -> dict:
        return {"precompile": {"needed": self.needed, "compiled": self.compiled,
                               "kernels": list(self.kernels), "failed": self.failed,
                               "workers": self.workers, "s": round(self.seconds, 3)}}  # fmt: skip


def compile_missing(workers: Workers, launches: list[Launch], target: GPUTarget) -> Precompiled:
    """Compile the launches not yet in the disk cache on `workers`, and wait for them."""
    started = time.perf_counter()
    todo = [launch for launch in launches if not in_disk_cache(launch, target)]
    errors = workers.compile(todo, target)
    done = [launch.name for launch in todo if errors.get(launch, "not run") is None]
    failed: dict[str, str] = {}
    for launch in todo:  # the first reason given for each kernel
        error = errors.get(launch, "not run: its worker had exited")
        if error is not None:
            failed.setdefault(launch.name, error)
    return Precompiled(len(launches), len(done), tuple(sorted(set(done))), failed,
                       workers.count, time.perf_counter() - started)  # fmt: skip


def precompile(dry_run: Callable[[], object], workers: Workers) -> dict:
    """Collect `dry_run()`'s launches, compile the missing ones on `workers`, then end them:
    run.json's `compiles` entry. A failure is recorded, not raised (the warm-up compiles),
    except running out of memory, which the profile reports as such."""
    import torch
    from triton.runtime.driver import driver

    try:
        launches = collect_launches(dry_run)
        target = driver.active.get_current_target()
        return compile_missing(workers, launches, target).summary()
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # noqa: BLE001  (only time is at stake)
        return {"precompile": {"error": f"{type(err).__name__}: {err}"}}
    finally:
        workers.close()


if __name__ == "__main__":
    serve()
