"""What the MoE calls' range check costs a served prefill: back-to-back calls, with and without it.

    python scripts/moe_served_loop.py [--tokens 33863 4096] [--calls 8] [--loops 5]

For moe_w8a8 on FP8 experts and flat on bf16 experts at the `dsv4-flash-tp2` rank's shape
(uniform routing): `--calls` calls launched back to back with no sync between, as a served
prefill launches its layers, then one sync; the wall time a call, median of `--loops` such
loops, "checked" (each call reads topk_ids back to check its range, a host sync) and
"trusted" (`kernels.moe.trusted_routing`) alternated. It is the measurement behind
`trusted_routing` (raw/logs/h200-moe-served-loop-range-check-*.txt). A developer's tool, like
tune_dense.py; needs a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from kernels.moe import VARIANTS, MoeWeights, trusted_routing
from workbench.presets import get_preset
from workbench.workloads.moe import expert_masters, moe_problem

CALLS = (("fp8", "w8a8"), ("bf16", "flat"))


def ms_a_call(call: Callable[[], object], calls: int) -> float:
    """Wall ms a call over `calls` back-to-back calls and one sync at the end."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[33863, 4096])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--loops", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("moe_served_loop.py times GPU calls: run it on a machine with a GPU.")
    dev = torch.device("cuda")
    shapes = get_preset("dsv4-flash-tp2").rank_shapes()
    masters = expert_masters(shapes, 0, dev, torch.bfloat16)
    for fmt, variant in CALLS:
        weights = MoeWeights.quantize(*masters, fmt)
        for tokens in args.tokens:
            problem = moe_problem(shapes, tokens, "uniform", 0, dev, torch.bfloat16)
            checked = partial(VARIANTS[variant], *problem.args(), weights)
            ways = {"checked": checked, "trusted": trusted_routing()(checked)}
            checked()  # compiles
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.loops):
                for name, call in ways.items():
                    times[name].append(ms_a_call(call, args.calls))
            for name, values in times.items():
                print(
                    f"{variant} T={tokens:6d} {name}: {statistics.median(values):.3f} ms a call "
                    f"(median of {args.loops} loops of {args.calls}; "
                    f"{min(values):.3f}-{max(values):.3f})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
