"""run.json's `compiles` comes from Triton's compilation listener: each compile and each load
from the on-disk cache, with its time. Compiled here for sm_90 on the CPU (Triton's bundled
ptxas), as a GPU profile's warm-up compiles, in a process of its own: the tests run kernels
under the interpreter, which patches triton.language for the whole process."""

import json
import os
import subprocess
import sys

from workbench.analysis.phases import bytecode_hint, phases_line

COMPILES = """
import json, sys
import triton, triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from workbench.capture.compile_log import compile_log

@triton.jit
def _scale(x_ptr, n, FACTOR: tl.constexpr):
    offs = tl.arange(0, 128)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)

def compile_scale(factor):
    signature = {"x_ptr": "*fp32", "n": "i32", "FACTOR": "constexpr"}
    source = ASTSource(_scale, signature, constexprs={(2,): factor})
    triton.compile(source, target=GPUTarget("cuda", 90, 32))

heard = []
knobs.compilation.listener = lambda **event: heard.append(event["cache_hit"])
earlier = knobs.compilation.listener
with compile_log() as log:
    compile_scale(2)
    compile_scale(3)  # another specialisation: compiled again
    compile_scale(2)  # the same one: loaded from the disk cache
print(json.dumps({"summary": log.summary(), "heard": heard,
                  "restored": knobs.compilation.listener is earlier}))
"""


def test_each_compile_and_each_cache_load_is_logged_by_kernel(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = tmp_path / "compiles.py"  # @triton.jit reads its source from a file
    script.write_text(COMPILES)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    summary = out["summary"]
    assert (summary["compiled"], summary["loaded"]) == (2, 1)
    assert [(k["kernel"], k["compiles"]) for k in summary["by_kernel"]] == [("_scale", 2)]
    assert summary["compile_s"] == summary["by_kernel"][0]["s"] > 0
    assert summary["load_s"] < summary["compile_s"]  # what a warm cache saves
    # a listener installed before keeps hearing every event, and is put back after
    assert out["heard"] == [False, False, True] and out["restored"]


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
    meta["compiles"]["precompile"] = {"compiled": 37, "workers": 8, "s": 7.81}
    assert phases_line(meta).endswith(
        "(wall 40.0 s); compiled 37 Triton kernels in 8 processes in 7.8 s; compiled 87 "
        "Triton kernels in 24.1 s, loaded 3 from the cache in 0.1 s"
    )
    failed = {"_w8a16_kernel": "RuntimeError: ptxas"}
    meta["compiles"]["precompile"] = {"compiled": 36, "workers": 8, "s": 7.81, "failed": failed}
    line = phases_line(meta)
    assert "in 8 processes in 7.8 s (_w8a16_kernel failed there); compiled 87" in line
    meta["compiles"]["precompile"] = {"error": "RuntimeError: no"}
    assert "; the parallel compile failed (RuntimeError: no); compiled 87" in phases_line(meta)
    meta["compiles"] = {"compiled": 0, "compile_s": 0.0, "loaded": 0, "load_s": 0.0,
                        "by_kernel": []}  # fmt: skip
    assert phases_line(meta).endswith("(wall 40.0 s)")  # a CPU run compiles nothing


def test_a_run_that_compiled_torch_from_source_says_how_to_cache_it():
    meta = {"environment": {"bytecode": {"written": False, "torch_cached": False}}}
    hint = bytecode_hint(meta)
    assert "PYTHONDONTWRITEBYTECODE" in hint and "`python -m compileall -q -j 0` with" in hint
    command = "/opt/py/bin/python -m compileall -q -j 0 /opt/site"
    assert f"run `{command}` once" in bytecode_hint(meta, command)
    # cached, or writable (the first import writes the cache), or a run that did not record it
    meta["environment"]["bytecode"] = {"written": False, "torch_cached": True}
    assert bytecode_hint(meta) is None
    meta["environment"]["bytecode"] = {"written": True, "torch_cached": False}
    assert bytecode_hint(meta) is None
    assert bytecode_hint({"environment": {}}) is None


def test_the_environment_records_whether_torch_loads_from_bytecode():
    import importlib.util
    from pathlib import Path

    import torch

    from workbench.capture.environment import describe

    bytecode = describe()["bytecode"]
    assert bytecode["written"] is not sys.dont_write_bytecode
    cached = Path(importlib.util.cache_from_source(torch.__file__))
    assert bytecode["torch_cached"] is cached.exists()


def test_the_command_line_names_this_python_and_the_folder_that_holds_torch():
    import shlex
    from pathlib import Path

    import torch

    from workbench.cli.capture_commands import compile_torch_command

    python, *flags, folder = shlex.split(compile_torch_command())
    assert python == sys.executable and flags == ["-m", "compileall", "-q", "-j", "0"]
    assert (Path(folder) / "torch" / "__init__.py").exists()
    assert Path(folder) == Path(torch.__file__).resolve().parents[1]
