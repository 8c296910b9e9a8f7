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

    def spy(launches, device, *args, **kwargs):
        batches.append([launch.graph for launch in launches])
        return real(launches, device, *args, **kwargs)

    rounds_began = []
    monkeypatch.setattr(ceilings, "time_launches", spy)
    result = ceilings.measure_ceilings(
        "cpu", copy_gib=0.001, n=64, on_rounds=lambda: rounds_began.append(len(batches))
    )
    assert batches == [[False, False, False]]  # copy, bf16 GEMM, FP8 GEMM: eager, in turns
    assert rounds_began == [1]  # once, after the warm-ups, inside that one call
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
    # 20 ms a call over its 4 units, plus the wall clock: every sample (so its IQR) per unit
    assert all(5.0 <= sample < 20.0 for sample in timed.samples_ms)
    # one warm-up call each, then four rounds of one call each
    assert calls[:2] == ["slow", "x"]
    assert all(sorted(calls[i : i + 2]) == ["slow", "x"] for i in range(2, 10, 2))
    assert len(calls) == 10


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


def test_a_bench_checks_its_rows_then_times_the_right_ones_in_turns_and_judges_them():
    """check_then_time through the real timer: a wrong row and one whose check raises are not
    timed, one that runs out of memory while timed says so, and the timed rows get their
    per-unit ms, the judge's columns and a status, in the plans' order."""
    from workbench.capture.bench_rows import RowPlan, check_then_time, samples_table
    from workbench.capture.timing import Launch

    timed: list[str] = []

    def launch(name: str, units: int = 1) -> Launch:
        return Launch(lambda: timed.append(name) or time.sleep(0.004 * units), 1, units=units)

    def out_of_memory() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    def no_kernel() -> dict:
        raise RuntimeError("no kernel for this shape")

    def judge(row: dict) -> dict:
        return {"floor_ms": 2.0, "ratio_to_floor": row["ms"] / 2.0}

    good = {"rel_error": 1e-3}
    plans = [
        RowPlan({"variant": "fast"}, lambda: good, 1e-2, launch("fast", units=3), judge),
        RowPlan({"variant": "wrong"}, lambda: {"rel_error": 0.5}, 1e-2, launch("wrong"), judge),
        RowPlan(
            {"variant": "nan"}, lambda: {"rel_error": float("nan")}, 1e-2, launch("nan"), judge
        ),
        RowPlan({"variant": "raises"}, no_kernel, 1e-2, launch("raises"), judge),
        RowPlan({"variant": "oom"}, lambda: good, 1e-2, Launch(out_of_memory, 1), judge),
        RowPlan({"variant": "spills"}, lambda: good | {"spills": 8}, 1e-2, launch("spills"), judge),
    ]
    rows = check_then_time(plans, torch.device("cpu"))
    assert [row["variant"] for row in rows] == ["fast", "wrong", "nan", "raises", "oom", "spills"]
    status = {row["variant"]: row["status"] for row in rows}
    assert status["wrong"] == status["nan"] == "wrong"
    assert status["raises"].startswith("error: RuntimeError: no kernel")
    assert status["oom"] == "oom" and status["fast"] == "ok" and status["spills"] == "spills"
    assert set(timed) == {"fast", "spills"}  # only the rows that passed their check
    fast = rows[0]
    assert 3.0 < fast["ms"] < 12.0  # 12 ms a call over its 3 units
    assert fast["ratio_to_floor"] == fast["ms"] / 2.0 and "ms" not in rows[1]
    # the two timed rows' samples, in the same rounds, under their positions
    samples = samples_table(rows)
    assert sorted(set(samples["row"])) == [0, 5] and set(samples["group"]) == {0}
    medians = samples.groupby("row")["ms"].median()
    assert (medians[0], medians[5]) == (rows[0]["ms"], rows[5]["ms"])
    assert (samples["row"] == 0).sum() == (samples["row"] == 5).sum()
