"""The parallel compile before a GPU profile's warm-up (`capture.precompile`): a launch's
specialisation, recorded as Triton serialises it, compiles on the CPU for sm_90 (in worker
processes) into the on-disk cache under the very key the launch looks up, so the warm-up only
loads it. The whole path on the GPU: tests/test_cuda_graphs_gpu.py."""

import inspect
import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction, JitFunctionInfo, serialize_specialization_data

from workbench.capture import precompile
from workbench.capture.precompile import Launch, collect_launches, in_disk_cache, source_of
from workbench.errors import WorkbenchError

SM90 = GPUTarget("cuda", 90, 32)
TESTS = Path(__file__).parent


def _scale(x_ptr, n, FACTOR: tl.constexpr):
    offs = tl.arange(0, 128)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)


# Built directly (the tests run under TRITON_INTERPRET, where @triton.jit compiles nothing),
# under the function's own name, so that the launch's module and name find it.
_scale = JITFunction(_scale)


def scale_launch(factor: int, num_warps: int = 4) -> Launch:
    """The launch as Triton's compile hook hands it over: serialised by Triton itself."""
    signature = {"x_ptr": "*fp32", "n": "i32", "FACTOR": "constexpr"}
    options = triton.compiler.make_backend(SM90).parse_options({"num_warps": num_warps})
    fields = ("_scale", signature, {(2,): factor}, {(0,): [["tt.divisibility", 16]]}, options,
              "key")  # fmt: skip
    if "target" in inspect.signature(serialize_specialization_data).parameters:  # Triton 3.7
        fields += (SM90,)
    data = serialize_specialization_data(*fields)
    return Launch(__name__, "_scale", data, _scale.cache_key)


def compile_in_a_worker(launches: list[Launch], monkeypatch) -> precompile.Precompiled:
    """Compile on one worker process: the tests run kernels under the interpreter, which
    patches triton.language for the whole process, so nothing compiles in this one."""
    # the worker imports the launches' module, this one, by name
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), *sys.path]))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    workers = precompile.start_workers(1)
    try:
        return precompile.compile_missing(workers, launches, SM90)
    finally:
        workers.close()


def test_a_launch_compiles_into_the_cache_entry_its_lookup_finds(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    launch = scale_launch(3)
    assert not in_disk_cache(launch, SM90)
    source, options = source_of(launch, SM90)
    assert (source.constants, source.attrs) == ({(2,): 3}, {(0,): [["tt.divisibility", 16]]})
    assert options.num_warps == 4
    assert compile_in_a_worker([launch], monkeypatch).compiled == 1
    assert in_disk_cache(launch, SM90)
    assert not in_disk_cache(scale_launch(3, num_warps=8), SM90)  # options are in the key
    assert not in_disk_cache(scale_launch(4), SM90)  # so are the constexprs


def test_the_launch_carries_the_source_hash_its_process_computed(tmp_path, monkeypatch):
    """Triton's hash of a kernel can depend on the order a process hashed its kernels in; the
    workers use the profile's, so that their cache entries are the ones its launches find."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_scale, "hash", _scale.cache_key)  # restored after the test
    launch = scale_launch(3)
    elsewhere = Launch(launch.module, launch.name, launch.specialization, "0" * 64)
    assert compile_in_a_worker([elsewhere], monkeypatch).compiled == 1
    assert in_disk_cache(elsewhere, SM90)  # the worker compiled it under the launch's hash
    assert _scale.cache_key == "0" * 64  # source_of set the launch's hash on the kernel
    _scale.hash = launch.cache_key
    assert not in_disk_cache(launch, SM90)  # the kernel's own hash: another cache entry


def test_a_launch_that_names_nothing_is_never_taken_as_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    launch = scale_launch(3)
    assert not in_disk_cache(Launch(__name__, "_missing", launch.specialization), SM90)
    broken = json.loads(launch.specialization) | {"signature": None}
    assert not in_disk_cache(Launch(__name__, "_scale", json.dumps(broken)), SM90)


def test_the_dry_run_records_each_specialisation_once_and_vetoes_its_compile(monkeypatch):
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    answers = []

    def asked(key: str, launch: Launch) -> None:
        """What JITFunction._do_compile asks the hook before a compile."""
        answers.append(knobs.runtime.jit_cache_hook(
            key=key, repr="_scale[...]", fn=JitFunctionInfo(__name__, "_scale", _scale),
            compile={"key": key, "specialization_data": launch.specialization},
            is_manual_warmup=False, already_compiled=False,
        ))  # fmt: skip

    def dry_run() -> None:
        for _ in range(3):  # the same launch in every layer, one other in the last
            asked("k3", scale_launch(3))
        asked("k4", scale_launch(4))

    launches = collect_launches(dry_run)
    assert launches == [scale_launch(3), scale_launch(4)]
    assert answers == [True] * 4  # each one vetoed: nothing compiled, nothing launched
    assert knobs.runtime.jit_cache_hook is None  # restored


def test_in_the_dry_run_every_launch_is_a_warm_up_that_launches_nothing(monkeypatch):
    """A kernel compiled earlier in the process is found in memory, never asks the hook, and
    would run on what a skipped kernel left: the dry run makes its launch a warm-up call."""
    asked = []

    def run(self, *args, grid, warmup, **kwargs):
        asked.append(warmup)

    monkeypatch.setattr(JITFunction, "run", run)
    collect_launches(lambda: _scale[(1,)](None, 8, FACTOR=2))
    assert asked == [True]
    _scale[(1,)](None, 8, FACTOR=2)
    assert asked == [True, False]  # after the dry run, launches launch again


def test_first_layers_puts_the_layer_count_back_even_after_an_error():
    from workbench.capture.rank_capture import first_layers
    from workbench.presets import get_preset

    model = SimpleNamespace(layers=40, weights=[0, 1, 2], preset=get_preset("dsv4-flash-tp2"))
    with pytest.raises(RuntimeError), first_layers(model):
        assert model.layers == 3  # one layer a weight set
        raise RuntimeError("the dry run failed")
    assert model.layers == 40


def test_first_layers_meet_every_kind_of_attention_layer():
    from workbench.capture.rank_capture import first_layers
    from workbench.presets import get_preset

    v4 = get_preset("dsv4-flash-v4-tp2")  # W W C H C ...: the first HCA layer is the fourth
    model = SimpleNamespace(layers=43, weights=[0, 1, 2], preset=v4)
    with first_layers(model):
        assert model.layers == 4


def test_workers_compile_what_the_cache_lacks_and_report_what_they_cannot(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    # the workers import the launches' module, this one, by name
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), *sys.path]))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    nowhere = Launch(__name__, "_missing", scale_launch(3).specialization)
    workers = precompile.start_workers(2)
    try:
        done = precompile.compile_missing(workers, [scale_launch(3), scale_launch(4), nowhere],
                                          SM90)  # fmt: skip
        again = precompile.compile_missing(workers, [scale_launch(3)], SM90)
        assert all(process.poll() is None for process in workers.processes)  # still serving
    finally:
        workers.close()
    assert (done.needed, done.compiled, done.kernels) == (3, 2, ("_scale",))
    assert list(done.failed) == ["_missing"] and "_missing" in done.failed["_missing"]  # why
    assert in_disk_cache(scale_launch(3), SM90) and in_disk_cache(scale_launch(4), SM90)
    assert (again.needed, again.compiled) == (1, 0)  # cached now: not sent to a worker
    assert all(process.poll() is not None for process in workers.processes)  # ended
    assert done.summary()["precompile"]["workers"] == 2


def test_a_worker_that_dies_or_hangs_fails_its_launch_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))  # cannot even start
    assert precompile.start_workers(2) is None  # no workers: the warm-up compiles
    monkeypatch.undo()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(precompile, "TASK_TIMEOUT_S", 1)
    workers = precompile.start_workers(1)
    try:
        workers.processes[0].kill()  # gone before its first task
        gone = precompile.compile_missing(workers, [scale_launch(3)], SM90)
    finally:
        workers.close()
    assert gone.compiled == 0 and "the worker exited" in gone.failed["_scale"]
    workers = precompile.start_workers(1)
    try:
        os.kill(workers.processes[0].pid, signal.SIGSTOP)  # hangs: the watchdog kills it
        hung = precompile.compile_missing(workers, [scale_launch(3)], SM90)
    finally:
        workers.close()
    assert "status -9" in hung.failed["_scale"]


def test_a_failed_dry_run_is_recorded_and_out_of_memory_still_raised(monkeypatch):
    def broken() -> None:
        raise RuntimeError("a shape the model did not expect")

    closed = []
    workers = type("Workers", (), {"close": lambda self: closed.append(True)})()
    assert precompile.precompile(broken, workers) == {
        "precompile": {"error": "RuntimeError: a shape the model did not expect"}
    }

    def no_memory() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        precompile.precompile(no_memory, workers)
    assert closed == [True, True]  # the workers end either way


def test_the_worker_count_follows_the_variable(monkeypatch):
    monkeypatch.setenv(precompile.WORKERS_VARIABLE, "0")
    assert precompile.worker_count() == 0 and precompile.start_workers(0) is None
    monkeypatch.setenv(precompile.WORKERS_VARIABLE, "3")
    assert precompile.worker_count() == 3 and precompile.worker_count(ranks=2) == 2
    monkeypatch.delenv(precompile.WORKERS_VARIABLE)
    assert 1 <= precompile.worker_count() <= precompile.MAX_WORKERS
    monkeypatch.setenv(precompile.WORKERS_VARIABLE, "many")
    with pytest.raises(WorkbenchError, match="WORKBENCH_PRECOMPILE_WORKERS='many' is not a"):
        precompile.worker_count()
