"""What launching a decode step's CUDA graph costs the host, with and without the profiler.

    python scripts/graph_launch_cost.py OUT_DIR [--moe stock multirow flat] [--steps 15]

For each MoE variant of `dsv4-flash-tp2` (the served configuration: W8A16 dense, the FP8
sparse attention, FP8 experts), after a 4,096-token prefill: the median host time of
`graph.replay()` and the median GPU span of the step (CUDA events around it), over `--steps`
synchronous steps, then over as many under torch.profiler with CUDA activities. Writes
OUT_DIR/graph-launch-cost.csv. It is the measurement behind the graphed decode loop's
launching ahead (`SyntheticModel.run`, docs/design.md): under the profiler a synchronous loop
leaves the GPU waiting for each launch. A developer's tool, like tune_dense.py.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from workbench.capture.cuda_graphs import capture_decode_graph
from workbench.presets import get_preset
from workbench.workloads.model import Plan, SyntheticModel

PROMPT = 4096


def step_costs(model: SyntheticModel, steps: int) -> list[dict]:
    """Median replay() call and step span (ms), bare and under the profiler."""
    plan = Plan(PROMPT, 3 * steps)
    inputs, state = model.inputs(plan), model.new_state(plan)
    model.prefill(state, plan, inputs, lambda n: None)
    graph = capture_decode_graph(model, state)

    def timed(first: int) -> tuple[float, float]:
        calls, spans = [], []
        for step in range(first, first + steps):
            state.load(inputs, step)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            started = time.perf_counter()
            graph.replay()
            calls.append((time.perf_counter() - started) * 1e3)
            end.record()
            torch.cuda.synchronize()
            spans.append(begin.elapsed_time(end))
        return statistics.median(calls), statistics.median(spans)

    timed(0)  # the first replays upload the graph
    bare = timed(steps)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        profiled = timed(2 * steps)
    return [
        {"profiler": False, "replay_call_ms": bare[0], "step_span_ms": bare[1]},
        {"profiler": True, "replay_call_ms": profiled[0], "step_span_ms": profiled[1]},
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--moe", nargs="+", default=["stock", "multirow", "flat"])
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: it times CUDA graph launches.")
    rows = []
    for moe in args.moe:
        model = SyntheticModel(get_preset("dsv4-flash-tp2"), moe=moe, dense="w8a16",
                               attention="fp8", moe_format="fp8", device="cuda")  # fmt: skip
        for row in step_costs(model, args.steps):
            rows.append({"moe": moe, "steps": args.steps, **row})
            print(", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in rows[-1].items()), flush=True)  # fmt: skip
        del model
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out / "graph-launch-cost.csv", index=False)


if __name__ == "__main__":
    main()
