"""scripts/moe_compile_facts.py compiles the MoE kernels for sm_90 without a GPU (Triton's
bundled ptxas) and reads registers and spills off ptxas's report. It runs in its own process:
the tests import the kernels under the interpreter, which compiles nothing."""

import re

import pytest
from helpers import run_compile_script


def run(*args: str, interpret: bool = False):
    return run_compile_script("moe_compile_facts.py", *args, interpret=interpret)


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


def test_int4_decode_tiles_copy_16_bytes_at_a_time_and_stage_nothing_twice():
    # Two defects the H200 paid for (kernels/moe/tiles.py): a K mask along INT4's runs of 8
    # held the packed bytes to 8-byte copies, and a nonzero masked fill staged every packed
    # tile through shared memory twice. No scheduler's decode tiles at the preset's shape have
    # either.
    done = run("--fmt", "int4", "--tiles", "16,128,128,4,3", "--split")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()[1:]
    assert len(lines) == 6  # gate/up and down of flat, padded and stock
    for line in lines:
        copies = line.split("cp.async copies ")[1].split(",")[0]
        assert copies.endswith("of 16 B") and " B " not in copies, line
        assert line.endswith(", 0 register tiles staged in shared memory"), line


def test_bad_tiles_and_the_interpreter_are_refused_with_the_fix():
    done = run("--tiles", "16,64,64")
    assert done.returncode == 2 and "BLOCK_M,BLOCK_N,BLOCK_K,NUM_WARPS,NUM_STAGES" in done.stderr
    done = run(interpret=True)
    assert done.returncode == 2 and "unset it" in done.stderr


def test_padded_int4_prefill_tiles_spill_nothing():
    """Padded's INT4 prefill tiles (launch.INT4_PREFILL_TILES: 128 x 128 x 128, 8 warps, the
    weights as the MMA's first operand) take ptxas to its 255 registers; with the row tile's
    slot ids held 64-bit through the K loop gate/up spilled 8 bytes (Triton 3.6 and 3.7),
    32-bit it spills none."""
    done = run("--fmt", "int4", "--tiles", "128,128,128,8,3,swap", "--schedulers", "padded")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()[1:]
    assert len(lines) == 2  # padded's gate/up and down
    for line in lines:
        assert ", 0 bytes spilled," in line, line


def test_the_decode_layout_waits_on_memory_twice_and_never_reads_back_what_it_stored():
    """`routing_kernels.small_layout` takes its experts' offsets from its own scans: compiled
    for sm_90 its instructions wait for a global load twice in program order; reading back
    the offsets it stores made it six (scripts/glue_sass_facts.py --code on the package
    before, under Triton 3.6 and 3.7.1 alike)."""
    done = run_compile_script("glue_sass_facts.py")
    assert done.returncode == 0, done.stderr
    facts = dict(re.findall(r"^(\w+): .*waits for a global load in program order (\d+)$",
                            done.stdout, re.MULTILINE))  # fmt: skip
    assert facts["small_layout"] == "2", done.stdout
    assert "combine" in facts
