"""Time a short, hand-picked grid of settings of the sparse-attention kernels on the GPU (the
FP8 indexer, the radix select, the sparse attention) at the bench's decode and prefill
scenarios for `dsv4-flash-tp2`, each setting checked against its reference first, to choose
their defaults.

    python scripts/tune_attention.py OUT_DIR [--budget-s 240] [--kernels select ...]

Writes OUT_DIR/tune-attention.csv and prints one line per setting as it finishes. A
developer's tool, like tune_dense.py; `workbench bench attention` is the product's benchmark.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch

import kernels.attention as attention
from kernels.attention.select_sampled import select_positions_sampled
from workbench.capture.bench_attention import selection_ok
from workbench.capture.bench_rows import call_with_facts, compile_facts
from workbench.capture.timing import time_launch
from workbench.presets import get_preset
from workbench.workloads.attention import Problem, Scenario
from workbench.workloads.checks import relative_error

SCENARIOS = (Scenario("decode-46K", 1, 46_000), Scenario("prefill-46K", 4096, 46_000))
INDEXER = [{}, {"tma": False}, {"num_stages": 4}, {"head_sum": "cores"}, {"block_q": 1}]
SELECT = [{}, {"num_warps": 8, "block": 2048}, {"num_warps": 2, "block": 1024},
          {"num_warps": 1, "block": 256}, {"rounds": 4}, {"digit_bits": 4},
          {"digit_bits": 6}]  # fmt: skip
SELECT_SAMPLED = [{}, {"num_warps": 1, "block": 256}, {"num_warps": 2, "block": 1024},
                  {"num_warps": 4, "block": 1024}, {"stride": 8}]  # fmt: skip
INDEXER_SELECT = [{}, {"chunk": 256}, {"chunk": 1024}, {"chunk": 256, "num_warps": 8},
                  {"num_warps": 8}]  # fmt: skip
ATTEND = [{}, {"block_n": 64}, {"num_warps": 8}, {"block_n": 64, "num_warps": 8},
          {"splits": 5}, {"block_n": 16}, {"num_stages": 3}]  # fmt: skip


def cases(p: Problem, window: int, topk: int) -> list[tuple[str, list[dict], object]]:
    """(kernel, grid, check(options) -> (call, error)) per kernel."""

    def indexer(options: dict):
        call = partial(attention.indexer_scores_fp8, p.index_q, p.index_w, p.cached_keys, p.pos,
                       **options)  # fmt: skip
        return call, lambda out: relative_error(out[p.scores_ref.isfinite()],
                                                p.scores_ref[p.scores_ref.isfinite()])  # fmt: skip

    def select(options: dict):
        call = partial(attention.select_positions_triton, p.scores_ref, p.pos, topk, window,
                       **options)  # fmt: skip
        return call, lambda out: 0.0 if selection_ok(out, p, window) else float("inf")

    def select_sampled(options: dict):
        call = partial(select_positions_sampled, p.scores_ref, p.pos, topk, window, **options)
        return call, lambda out: 0.0 if selection_ok(out, p, window) else float("inf")

    def attend(options: dict):
        call = partial(attention.sparse_attention_triton, p.q, p.kv, p.index, **options)
        return call, lambda out: relative_error(out, p.out_ref)

    def indexer_select(options: dict):
        call = partial(attention.indexer_select_fp8, p.index_q, p.index_w, p.cached_keys, p.pos,
                       None, topk, window, **options)  # fmt: skip
        return call, lambda out: 0.0 if selection_ok(out, p, window) else float("inf")

    return [("indexer_fp8", INDEXER, indexer), ("select", SELECT, select),
            ("select_sampled", SELECT_SAMPLED, select_sampled),
            ("indexer_select", INDEXER_SELECT, indexer_select),
            ("sparse_attention", ATTEND, attend)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=240)
    parser.add_argument("--kernels", nargs="*", help="only these kernels, e.g. select")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device, s = torch.device("cuda"), get_preset("dsv4-flash-tp2").rank_shapes()
    start, rows = time.monotonic(), []
    fp8 = attention.VARIANTS["fp8"]
    for sc in SCENARIOS:
        p = Problem.draw(sc, s, torch.bfloat16, device, 0).with_keys(fp8, s.index_topk, s.window)
        for kernel, grid, build in cases(p, s.window, s.index_topk):
            if args.kernels and kernel not in args.kernels:
                continue
            for options in grid:
                if time.monotonic() - start > args.budget_s:
                    break
                row = {"kernel": kernel, "scenario": sc.name, "options": repr(options)}
                try:
                    call, error = build(options)
                    facts: list[dict] = []
                    row |= {"rel_error": error(call_with_facts(call, facts))}
                    row |= compile_facts(facts)
                    timing = time_launch(call, device, sc.queries)
                    row["ms"], row["iqr_ms"] = timing.median_ms, timing.iqr_ms
                    row["status"] = "ok"
                except Exception as err:  # noqa: BLE001 (a failing setting is a result)
                    row["status"] = f"{type(err).__name__}: {str(err)[:100]}"
                rows.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row.items()), flush=True)  # fmt: skip
    pd.DataFrame(rows).to_csv(args.out / "tune-attention.csv", index=False)


if __name__ == "__main__":
    main()
