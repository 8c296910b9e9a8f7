"""run.json's `compiles` comes from Triton's compilation listener: each compile and each load
from the on-disk cache, with its time. Compiled here for sm_90 on the CPU (Triton's bundled
ptxas), as a GPU profile's warm-up compiles."""

import triton
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from workbench.analysis.profile import phases_line
from workbench.capture.compile_log import compile_log


def _scale(x_ptr, n, FACTOR: tl.constexpr):
    offs = tl.arange(0, 128)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)


# A JITFunction built directly: the tests run under TRITON_INTERPRET, which makes
# @triton.jit return an interpreted function that compiles nothing.
SCALE = JITFunction(_scale)


def compile_scale(factor: int):
    signature = {"x_ptr": "*fp32", "n": "i32", "FACTOR": "constexpr"}
    source = ASTSource(SCALE, signature, constexprs={(2,): factor})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32))


def test_each_compile_and_each_cache_load_is_logged_by_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    with compile_log() as log:
        compile_scale(2)
        compile_scale(3)  # another specialisation: compiled again
        compile_scale(2)  # the same one: loaded from the disk cache
    summary = log.summary()
    assert (summary["compiled"], summary["loaded"]) == (2, 1)
    assert [(k["kernel"], k["compiles"]) for k in summary["by_kernel"]] == [("_scale", 2)]
    assert summary["compile_s"] == summary["by_kernel"][0]["s"] > 0
    assert summary["load_s"] < summary["compile_s"]  # what a warm cache saves


def test_a_listener_installed_before_keeps_hearing_and_is_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    heard = []

    def earlier(**event) -> None:
        heard.append(event["cache_hit"])

    monkeypatch.setattr(knobs.compilation, "listener", earlier)
    with compile_log() as log:
        compile_scale(5)
    assert heard == [False] and len(log.entries) == 1
    assert knobs.compilation.listener is earlier


def test_the_phases_line_says_how_much_was_compiling():
    meta = {
        "phases": {"warm-up": 30.0, "profiled": 7.9},
        "wall_s": 40.0,
        "compiles": {"compiled": 87, "compile_s": 24.13, "loaded": 3, "load_s": 0.08,
                     "by_kernel": []},
    }  # fmt: skip
    assert phases_line(meta) == (
        "phases: warm-up 30.0 s, profiled 7.9 s (wall 40.0 s); compiled 87 Triton kernels in "
        "24.1 s, loaded 3 from the cache in 0.1 s"
    )
    meta["compiles"] = {"compiled": 0, "compile_s": 0.0, "loaded": 0, "load_s": 0.0,
                        "by_kernel": []}  # fmt: skip
    assert phases_line(meta).endswith("(wall 40.0 s)")  # a CPU run compiles nothing
