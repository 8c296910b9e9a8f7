"""Time each dense projection of one `dsv4-flash-tp2` layer under every distinct split of K
the W8A16 kernels can take, then the layer's six GEMMs in one CUDA graph with the default plan
and with each projection's fastest split, alternated, to see whether the split plan leaves
time on the table.

    python scripts/dense_w8a16_split_sweep.py OUT.csv [M ...]     (default M: 1 6 16 64 128 256)

Below `WGMMA_MIN_M` rows the Triton kernel is swept (its decode or middle tiles), from there
the Gluon one. Splits that give the same plan (splits, K steps each) are timed once. Each
setting is checked against the dequantised weights first; times are medians of CUDA-graph
replays by the workbench's timer, with L2 flushed before each. A developer's tool.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import triton

import kernels.dense as dense
from kernels.dense.w8a16 import WGMMA_MIN_M, default_tiles
from kernels.dense.w8a16_wgmma import BLOCK_K as WGMMA_BLOCK_K
from kernels.dense.w8a16_wgmma import linear_w8a16_wgmma, linear_w8a16_wgmma_group
from workbench.capture.timing import time_launch
from workbench.workloads.checks import relative_error
from workbench.workloads.dense import Layer, activations

SPLITS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
ROUNDS = 3  # default and best layers, alternated


def plans(k_steps: int) -> dict[int, tuple[int, int]]:
    """split_k: (splits, K steps a split) for every SPLITS value that gives a plan of its own."""
    out, seen = {}, set()
    for want in SPLITS:
        per = triton.cdiv(k_steps, min(want, k_steps))
        plan = (triton.cdiv(k_steps, per), per)
        if plan not in seen:
            seen.add(plan)
            out[want] = plan
    return out


def linears(m: int, split_k: int | None) -> tuple[Callable, Callable]:
    """(linear, linear_group) of the kernel that takes M rows by default, with `split_k`."""
    if m >= WGMMA_MIN_M:
        return (partial(linear_w8a16_wgmma, split_k=split_k),
                partial(linear_w8a16_wgmma_group, split_k=split_k))  # fmt: skip
    return (partial(dense.linear_w8a16, wgmma=False, split_k=split_k),
            partial(dense.linear_w8a16_group, wgmma=False, split_k=split_k))  # fmt: skip


def projection_calls(layer: Layer, xs: dict, m: int, split_k: int | None) -> list[Callable]:
    """The layer's calls (`Layer.calls`) on its FP8 weights, every projection at `split_k`."""
    return layer.calls(*linears(m, split_k), xs, layer.fp8[0])


def main() -> None:
    from dense_w8a16_gemm_times import (  # scripts/
        gpu_layer,
        references,
        run_all,
        saved_table,
        sizes_parser,
    )

    args = sizes_parser(__doc__, [1, 6, 16, 64, 128, 256]).parse_args()
    device, layer = gpu_layer()
    rows = []
    for m in args.m:
        xs = activations(m, layer.input_widths, 0, device, torch.bfloat16)
        wants = references(layer, xs)
        block_k = WGMMA_BLOCK_K if m >= WGMMA_MIN_M else default_tiles(m).block_k
        calls_at = partial(projection_calls, layer, xs, m)
        defaults, best = calls_at(None), []
        for i, (p, want) in enumerate(zip(layer.projections, wants, strict=True)):
            timed = {}
            settings = [(None, (0, 0)), *plans(triton.cdiv(p.k, block_k)).items()]
            for split_k, (splits, per) in settings:
                call = calls_at(split_k)[i]
                row = {"m": m, "proj": p.name, "n": p.n, "k": p.k * p.count,
                       "split_k": split_k or "default", "splits": splits, "steps": per}  # fmt: skip
                try:
                    row["rel_error"] = relative_error(call(), want)
                    row["ms"] = time_launch(call, device, m, graph=True).median_ms
                    timed[split_k] = row["ms"]
                except Exception as err:  # noqa: BLE001 (a failing setting is a result)
                    row["status"] = f"{type(err).__name__}: {str(err)[:120]}"
                print(row, flush=True)
                rows.append(row)
            best.append(calls_at(min(timed, key=timed.get))[i])
        for round_ in range(ROUNDS):
            for name, calls in (("layer-default", defaults), ("layer-best", best)):
                ms = time_launch(partial(run_all, calls), device, m, graph=True).median_ms
                row = {"m": m, "proj": name, "round": round_, "ms": ms}
                print(row, flush=True)
                rows.append(row)
    table = saved_table(rows, args.out)
    print(table.pivot_table(index=["m", "proj"], columns="split_k", values="ms",
                            aggfunc="first").round(4))  # fmt: skip
    layers = table[table.proj.str.startswith("layer")]
    print(layers.pivot_table(index="m", columns="proj", values="ms", aggfunc="median").round(4))


if __name__ == "__main__":
    main()
