"""scripts/moe_compile_facts.py compiles the MoE kernels for sm_90 without a GPU (Triton's
bundled ptxas) and reads registers and spills off ptxas's report. It runs in its own process:
the tests import the kernels under the interpreter, which compiles nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "scripts/moe_compile_facts.py", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize("fmt", ["int4", "fp8"])  # both assemble kernels.dequant's PTX
def test_compile_facts_of_one_scheduler_at_one_tile(fmt):
    done = run("--fmt", fmt, "--tiles", "16,64,64,4,3", "--schedulers", "flat")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"sm_90, {fmt} weights" in lines[0]
    facts = {line.split(":")[0].split()[-1]: line.split(":")[1] for line in lines[1:]}
    assert set(facts) == {"_flat_gate_up_kernel", "_flat_down_kernel"}
    for text in facts.values():
        registers, spilled = int(text.split()[0]), int(text.split(",")[1].split()[0])
        assert 16 <= registers <= 255 and spilled >= 0


def test_bad_tiles_and_the_interpreter_are_refused_with_the_fix():
    done = run("--tiles", "16,64,64")
    assert done.returncode == 2 and "BLOCK_M,BLOCK_N,BLOCK_K,NUM_WARPS,NUM_STAGES" in done.stderr
    done = run(interpret=True)
    assert done.returncode == 2 and "unset it" in done.stderr
