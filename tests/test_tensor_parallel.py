"""Tensor parallelism on the CPU through gloo: the all-reduces, the merged ranks, the skew,
TP1 and TP2 agreeing, and the failures (bad tp, a rank that dies)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_stored_answers_are_computed

import workbench
from workbench.capture.tensor_parallel import KILL_RANK_ENV

ARGS = {"prefill_chunk": 256, "progress": False}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    return {tp: workbench.profile(600, 3, tp=tp, out=out, **ARGS) for tp in (1, 2)}


def test_tp2_has_all_reduce_time_on_both_ranks(runs):
    run = runs[2]
    assert run.ranks == [0, 1]
    for rank in (0, 1):
        assert run.prefill(rank=rank).loc["All-reduce", "time_ms"] > 0
        assert run.decode(rank=rank).loc["All-reduce", "mean_ms"] > 0
    # Two all-reduces a layer (after attention, after the MoE) and the LM head's argmax
    # gather; on the CPU each is one row spanning its blocking scope.
    decode = run.kernels[(run.kernels["phase"] == "decode") & (run.kernels["rank"] == 0)]
    collectives = decode[decode["category"] == "All-reduce"]
    assert set(collectives["kind"]) == {"cpu_range"}
    assert collectives.groupby("step").size().tolist() == [2 * 2 + 1] * 3


def test_mean_over_ranks_is_the_mean_of_the_rank_tables(runs):
    run = runs[2]
    mean = run.prefill()
    both = (run.prefill(rank=0)["time_ms"] + run.prefill(rank=1)["time_ms"]) / 2
    assert np.allclose(mean["time_ms"], both)


def test_rank_skew_splits_collective_time_into_wait_and_transfer(runs):
    skew = runs[2].rank_skew()
    assert set(skew.index.get_level_values("rank")) == {0, 1}
    assert set(skew.index.get_level_values("phase")) == {"prefill", "decode"}
    assert np.allclose(skew["wait_ms"] + skew["transfer_ms"], skew["time_ms"], rtol=1e-6)
    prefill = skew.xs("prefill", level="phase")
    assert (prefill["collectives"] == 3 * 2 * 2 + 1).all()  # 3 chunks x 2 layers x 2, + gather
    # For each collective the last rank to arrive waits for nobody.
    assert (skew["wait_ms"] >= 0).all() and skew["wait_ms"].min() < skew["wait_ms"].max()


def test_a_single_process_run_has_no_rank_skew():
    single = workbench.load(Path(__file__).parent / "fixtures" / "h200-model-2layers")
    assert single.ranks == []
    with pytest.raises(workbench.ArtifactError, match="ran on one process: there is no rank skew"):
        single.rank_skew()


def test_tp1_and_tp2_compute_the_same_function(runs):
    one = workbench.load(runs[1].path)
    two = workbench.load(runs[2].path)
    from workbench.artifacts import read_table

    h1 = read_table(one.path, one.meta, "final_hidden").to_numpy()
    h2 = read_table(two.path, two.meta, "final_hidden").to_numpy()
    assert np.linalg.norm(h1 - h2) / np.linalg.norm(h1) < 1e-5
    t1 = read_table(one.path, one.meta, "tokens")
    t2 = read_table(two.path, two.meta, "tokens")
    assert t1.equals(t2)


def test_a_merged_run_round_trips(runs):
    loaded = workbench.load(runs[2].path)
    assert loaded.kernels.equals(runs[2].kernels)
    assert loaded.rank_skew().equals(runs[2].rank_skew())


def test_a_merged_run_stores_the_mean_over_its_ranks(runs):
    """prefill.csv and decode.csv sum the merged ranks; what prefill() and decode() return, the
    mean of the ranks' tables, is stored beside them and read back without the kernels."""
    summary = runs[2].meta["summary"]
    assert summary["ranks"] == [0, 1]
    assert summary["tables"] == {"prefill": "prefill_mean", "decode": "decode_mean",
                                 "rank_skew": "rank_skew"}  # fmt: skip
    assert_stored_answers_are_computed(runs[2].path)
    assert_stored_answers_are_computed(runs[1].path)


def test_tp_that_does_not_divide_is_refused(tmp_path):
    with pytest.raises(workbench.WorkbenchError, match="tp=3 does not divide the query heads"):
        workbench.profile(64, 1, tp=3, out=tmp_path, **ARGS)
    with pytest.raises(workbench.WorkbenchError, match="tp=0 is below 1"):
        workbench.profile(64, 1, tp=0, out=tmp_path, **ARGS)
    assert list(tmp_path.iterdir()) == []


def test_a_rank_that_dies_stops_the_others_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(KILL_RANK_ENV, "1")
    started = time.monotonic()
    with pytest.raises(workbench.WorkbenchError, match=r"rank 1 of tp=2 died \(exit code 17\)"):
        workbench.profile(64, 1, tp=2, out=tmp_path, **ARGS)
    assert time.monotonic() - started < 120
    assert [p for p in tmp_path.iterdir() if not p.name.startswith(".")] == []


def test_torchrun_starts_the_ranks_and_rank_0_reports(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != KILL_RANK_ENV}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            "29561",
            "-m",
            "workbench.cli",
            "profile",
            "--param",
            "tp=2",
            "prefill_chunk=256",
            "--prompt-tokens",
            "300",
            "--decode-tokens",
            "2",
            "--no-progress",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("Rank skew at collectives") == 1  # printed by rank 0 only
    (run_dir,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert workbench.load(run_dir).ranks == [0, 1]
