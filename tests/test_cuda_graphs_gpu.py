"""CUDA-graph decode on the GPU: a replay computes what the eager step computes, and a graphed
profile attributes every replayed kernel by position. Run with WORKBENCH_GPU_TESTS=1."""

import json
import os
import subprocess
import sys

import pytest
import torch

import workbench
from workbench.presets import get_preset
from workbench.workloads.model import Plan, SyntheticModel

pytestmark = pytest.mark.gpu


def eager_and_replayed(model: SyntheticModel, plan: Plan):
    """The tokens `plan` decodes by eager steps, and by replays of a captured decode graph."""
    from workbench.capture.cuda_graphs import capture_decode_graph

    inputs = model.inputs(plan)
    eager = model.run(plan, inputs, state=model.new_state(plan))
    state = model.new_state(plan)
    graph = capture_decode_graph(model, state)
    replayed = model.run(plan, inputs, state=state, replay=graph.replay)
    torch.cuda.synchronize()
    return eager, replayed


def test_graph_replay_decodes_the_same_tokens_as_eager_steps():
    model = SyntheticModel(get_preset("dsv4-flash-tp2"), layers=2, device="cuda")
    eager, replayed = eager_and_replayed(model, Plan(1024, 4, streams=2, prefill_chunk=512))
    assert (eager == replayed).all()


def test_graph_replay_of_compressed_layers_decodes_the_same_tokens_as_eager_steps():
    # V4's window, CSA and HCA layers (dsv4-flash-v4-tp2's first four): 1,023 = 4 x 255 + 3,
    # so the first step completes the group the prompt left open; 6 steps, 2 streams
    model = SyntheticModel(get_preset("dsv4-flash-v4-tp2"), layers=4, device="cuda")
    eager, replayed = eager_and_replayed(model, Plan(1023, 6, streams=2, prefill_chunk=512))
    assert (eager == replayed).all()


def test_graphed_profile_matches_every_replayed_kernel_by_position(tmp_path):
    run = workbench.profile(1024, 3, layers=2, out=tmp_path, progress=False, cuda_graphs=True)
    matching = run.meta["graph_matching"]
    assert matching["replays"] == 3 and matching["replays_fully_matched"] == 3
    assert matching["matched_by_position"] == matching["graph_kernels"] > 0
    decode = run.decode()
    for category in ("MoE", "Dense GEMM", "Sparse attention"):
        assert decode.loc[category, "mean_ms"] > 0


def test_an_empty_triton_cache_is_filled_in_parallel_before_the_warm_up(tmp_path):
    from workbench.capture.precompile import WORKERS_VARIABLE

    code = (
        "import json, workbench\n"
        f"r = workbench.profile(1024, 3, layers=2, out={str(tmp_path / 'raw')!r}, "
        "progress=False, cuda_graphs=True)\n"
        "print(json.dumps(r.meta['compiles']))\n"
    )  # a fresh process: no kernel in memory yet, an empty cache on disk
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"), WORKERS_VARIABLE: "4"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True)  # fmt: skip
    compiles = json.loads(done.stdout.strip().splitlines()[-1])
    ahead = compiles["precompile"]
    assert ahead["workers"] == 4 and ahead["failed"] == {}
    assert ahead["compiled"] == ahead["needed"] > 0  # the cache was empty: every one compiled
    # the warm-up, the graph capture and the profile loaded them; the main process compiled
    # only what ran before the dry run (the weights' quantisers)
    assert not {k["kernel"] for k in compiles["by_kernel"]} & set(ahead["kernels"])
    assert compiles["loaded"] >= ahead["compiled"]
