"""How the one timer picks its method: CUDA graph replays at decode sizes by default, at every
size for callers that vouch their call is capture-safe, never for host-side control flow."""

import time

import pytest
import torch

from workbench.analysis.stats import Repeats
from workbench.capture.timing import GRAPH_TOKENS, WARMUP_S, method_for

CUDA = torch.device("cuda")


@pytest.mark.parametrize(
    ("graph", "tokens", "replayed"),
    [
        (None, GRAPH_TOKENS, True),
        (None, GRAPH_TOKENS + 1, False),
        (True, 16384, True),
        (False, 1, False),
    ],
)
def test_a_cuda_graph_is_replayed_where_the_caller_allows_it(graph, tokens, replayed):
    method = method_for(CUDA, tokens, graph)
    assert method.cuda_graph is replayed
    assert method.clock == "cuda-events" and method.record()["cuda_graph"] is replayed
    # the flush reads its buffer: a written one leaves dirty lines the timed kernel writes back
    assert method.record()["l2_flush"] == "read" and method.l2_flush_bytes >= 2**28
    # samples start from the warm state a serving loop keeps, not from an idle GPU's
    assert method.record()["warmup_s"] == WARMUP_S > 0


def test_the_cpu_is_timed_by_the_wall_clock_without_graphs():
    method = method_for(torch.device("cpu"), 1, graph=True)
    assert method.clock == "wall-clock" and not method.cuda_graph and method.l2_flush_bytes == 0
    assert method.warmup_s == 0  # the interpreter's tests stay fast


def test_the_ceilings_are_taken_by_the_one_timer_in_turns(monkeypatch):
    """A floor's ceiling must be sampled the way the rows it judges are, so the ceilings go
    through time_launches, in turns with each other (their warm periods included), not a
    timer of their own."""
    from workbench.capture import ceilings

    batches = []
    real = ceilings.time_launches

    def spy(launches, device, *args):
        batches.append([launch.graph for launch in launches])
        return real(launches, device, *args)

    monkeypatch.setattr(ceilings, "time_launches", spy)
    result = ceilings.measure_ceilings("cpu", copy_gib=0.001, n=64)
    assert batches == [[False, False, False]]  # copy, bf16 GEMM, FP8 GEMM: eager, in turns
    assert result["copy_bytes_per_s"] > 0 and result["bf16_flops"] > 0
    assert result["fp8_flops"] > 0


def test_contenders_are_timed_in_turns_each_per_unit_and_a_failure_is_its_own():
    """time_launches warms each launch up, then samples them in turns; a launch that fails
    gets its exception in its place and the others are timed; a time is per unit."""
    from workbench.capture.timing import Launch, time_launches

    calls: list[str] = []

    def slow() -> None:
        calls.append("slow")
        time.sleep(0.02)

    def broken() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    repeats = Repeats(min_n=4, max_n=4, rel_width=1.0, budget_s=5.0)
    launches = [Launch(slow, 1, units=4), Launch(broken, 1), Launch(lambda: calls.append("x"), 1)]
    timed, failed, quick = time_launches(launches, torch.device("cpu"), repeats)
    assert isinstance(failed, torch.OutOfMemoryError)
    assert len(timed.samples_ms) == len(quick.samples_ms) == 4
    assert 5.0 <= timed.median_ms < 20.0  # 20 ms a call over its 4 units, plus the wall clock
    # one warm-up call each, then four rounds, the second and fourth in the other order
    assert calls == ["slow", "x", "slow", "x", "x", "slow", "slow", "x", "x", "slow"]


def test_each_ceiling_names_the_work_one_call_does():
    """A ceiling's rate is its work over its time: the copy reads and writes its buffer, a
    GEMM does 2 n^3 FLOPs; the script comparing alone with in turns reuses these launches."""
    from workbench.capture.ceilings import ceiling_work

    work = ceiling_work(torch.device("cpu"), copy_gib=0.001, n=64)
    elements = int(0.001 * 2**30) // 2
    assert work["copy"][1] == 2 * elements * 2
    assert work["bf16"][1] == work["fp8"][1] == 2 * 64**3
    assert tuple(work["bf16"][0]().shape) == tuple(work["fp8"][0]().shape) == (64, 64)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a CPU machine gets")
def test_the_ceilings_script_says_it_needs_a_gpu(tmp_path):
    from helpers import run_compile_script

    result = run_compile_script("ceilings_alone_vs_turns.py", str(tmp_path))
    assert result.returncode != 0
    assert "needs a GPU" in result.stderr
