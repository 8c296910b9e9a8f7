"""Programmatic dependent launch for the W8A16 GEMMs (kernels/pdl.py), in turns: the six dense
GEMMs of one `dsv4-flash-tp2` layer on the bench's path (`linear_w8a16`: the Triton kernel up
to 47 rows, the Gluon one from 48) without PDL, with it, and with the Gluon kernel copying
every ring slot's weights before its wait, beside cuBLAS bf16.

    python scripts/dense_w8a16_pdl_ab.py OUT.csv [M ...]        (default M: 16 48 64 128 256)

Each GEMM is checked against the dequantised weights and timed alone (one GEMM a CUDA graph),
then the layer's six calls run in one graph in three rounds, the variants' order rotated each
round; times are medians of graph replays with L2 flushed (the workbench's timer). PDL pays
only between GEMMs that follow each other, so the layer's rows are the ones it is for; the
served step's answer is a profile A/B (`workbench ab profile --a dense_pdl=off --b
dense_pdl=on`). It is the measurement behind raw/logs/h200-dense-w8a16-gluon-pdl-early-ab-*
(taken by a session copy of it, whose pdl1 and pdlall are pdl and pdl-every-slot-first here)
and docs/design.md's account of PDL. A developer's tool, like dense_w8a16_rounds.py.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from dense_w8a16_gemm_times import gpu_layer, references, run_all, saved_table, sizes_parser

import kernels.dense as dense
from kernels.dense import w8a16_wgmma
from workbench.capture.timing import time_launch
from workbench.workloads.checks import relative_error
from workbench.workloads.dense import activations

ROUNDS = 3


def with_early_slots(slots: int, linear: Callable, *args: object) -> object:
    """`linear(*args, pdl=True)` with the Gluon kernel copying `slots` ring slots' weights
    before its wait for the grid before (`w8a16_wgmma.EARLY_SLOTS`) for this call."""
    kept = w8a16_wgmma.EARLY_SLOTS
    w8a16_wgmma.EARLY_SLOTS = slots
    try:
        return linear(*args, pdl=True)
    finally:
        w8a16_wgmma.EARLY_SLOTS = kept


def variants() -> dict[str, tuple[Callable, Callable]]:
    """name: (linear(x, w), linear_group(x (M, G, K), members))."""
    every_slot = w8a16_wgmma.MAX_STAGES
    return {
        "bf16": (dense.linear, dense.group_linear("bf16", dense.linear)),
        "off": (dense.linear_w8a16, dense.linear_w8a16_group),
        "pdl": (partial(dense.linear_w8a16, pdl=True), partial(dense.linear_w8a16_group, pdl=True)),
        "pdl-every-slot-first": (
            partial(with_early_slots, every_slot, dense.linear_w8a16),
            partial(with_early_slots, every_slot, dense.linear_w8a16_group),
        ),
    }


def main() -> None:
    args = sizes_parser(__doc__, [16, 48, 64, 128, 256]).parse_args()
    device, layer = gpu_layer()
    rows = []
    for m in args.m:
        xs = activations(m, layer.input_widths, 0, device, torch.bfloat16)
        wants = references(layer, xs)
        calls = {}
        for name, (linear, linear_group) in variants().items():
            weights = layer.weights("bf16" if name == "bf16" else "w8a16")[0]
            calls[name] = layer.calls(linear, linear_group, xs, weights)
            for p, call, want in zip(layer.projections, calls[name], wants, strict=True):
                rows.append({"m": m, "proj": p.name, "variant": name, "round": 0,
                             "rel_error": relative_error(call(), want),
                             "ms": time_launch(call, device, m, graph=True).median_ms})  # fmt: skip
        names = list(calls)
        for r in range(ROUNDS):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                ms = time_launch(partial(run_all, calls[name]), device, m, graph=True).median_ms
                rows.append({"m": m, "proj": "layer", "variant": name, "round": r + 1, "ms": ms})
        print(f"{m} rows done", flush=True)
    table = saved_table(rows, args.out)
    alone = table[table.proj != "layer"].pivot_table(index="m", columns="variant", values="ms",
                                                     aggfunc="sum")  # fmt: skip
    print("The six GEMMs alone, summed (us):")
    print((alone * 1e3).round(1).to_string())
    layer_ms = table[table.proj == "layer"].pivot_table(index="m", columns="variant",
                                                        values="ms", aggfunc="median")  # fmt: skip
    layer_ms["pdl / off"] = layer_ms["pdl"] / layer_ms["off"]
    layer_ms["bf16 / pdl"] = layer_ms["bf16"] / layer_ms["pdl"]
    print(f"The layer in one graph, median of {ROUNDS} rounds (ms):")
    print(layer_ms.round(4).to_string())


if __name__ == "__main__":
    main()
