"""Time each dense projection of one `dsv4-flash-tp2` layer on its own, under tile settings of
one FP8 variant, beside cuBLAS bf16 on the same projection, to see which projection a setting
loses on (a layer total hides it).

    python scripts/dense_projection_times.py OUT.csv [--variant w8a16|w8a8] [M ...]
                                             (default M: 64 128 256)

Each projection cycles through three layer copies (weights from HBM, as in a 40-layer model),
timed as CUDA graph replays, each setting checked first against the fp32 product on the FP8
weights. For W8A8, DeepGEMM's GEMM (with the same activation quantiser) is timed beside it
where it is installed. A developer's tool, like tune_dense.py; the H200 runs behind the W8A16
docstring's middle-size finding are raw/logs/h200-w8a16-*-tiles-*.csv.
"""

from __future__ import annotations

import argparse
from functools import partial

import pandas as pd
import torch

import kernels.dense as dense
from kernels.dense.grouped import linear_bf16_group
from workbench.capture.bench_rows import call_with_facts, compile_facts
from workbench.capture.timing import time_launch
from workbench.presets import get_preset
from workbench.workloads.checks import relative_error
from workbench.workloads.dense import Layer, activations

COPIES = 3


def tiles(m: int, n: int, k: int, warps: int, stages: int, **more: object) -> dict:
    return dict(block_m=m, block_n=n, block_k=k, num_warps=warps, num_stages=stages, **more)


# name: W8A16 options; "s" swapped (tokens on the MMA's N side), "d" direct; tokens x weights.
W8A16_SETTINGS = {
    "default": {},
    "d32x64": tiles(32, 64, 128, 4, 3, swap_ab=False),
    "d64x64": tiles(64, 64, 128, 4, 4, swap_ab=False),
    "s64x64k128": tiles(64, 64, 128, 4, 4, swap_ab=True),
    "s64x128k64w8": tiles(64, 128, 64, 8, 4, swap_ab=True),
    "s128x64k64s4": tiles(128, 64, 64, 4, 4, swap_ab=True),
    "s128x64k128w8": tiles(128, 64, 128, 8, 3, swap_ab=True),
    "s128x128k64s4": tiles(128, 128, 64, 8, 4, swap_ab=True),
    "s256x64k64": tiles(256, 64, 64, 8, 3, swap_ab=True),
}
# name: W8A8 options at prefill sizes: the Gluon kernel's one-wave and two-wave tiles.
W8A8_SETTINGS = {
    "default": {},
    "wave1": {"wgmma": True, "block_m": 128, "num_stages": 5},
    "waves2s4": {"wgmma": True, "block_m": 256, "num_stages": 4},
    "waves2s3": {"wgmma": True, "block_m": 256, "num_stages": 3},
}
SETTINGS = {"w8a16": W8A16_SETTINGS, "w8a8": W8A8_SETTINGS}
LINEARS = {"w8a16": dense.linear_w8a16, "w8a8": dense.linear_w8a8}


def replay_ms(calls: list, device: torch.device, m: int) -> float:
    """Median ms of one call, over the copies' calls replayed back to back in a CUDA graph."""

    def run() -> None:
        for call in calls:
            call()

    return time_launch(run, device, m, graph=True, units=len(calls)).median_ms


def deepgemm_calls(layer: Layer, xs: dict) -> list[list] | None:
    """DeepGEMM's GEMM on each copy's projections (a group member by member, as W8A8 runs
    one), or None where it is not installed."""
    from workbench.peers import deepgemm

    if not deepgemm.available()[0]:
        return None
    linears = {id(w): deepgemm.prepare(w) for ws in layer.fp8 for w in ws}
    return [layer.calls(lambda x, w: linears[id(w)](x), partial(dense.one_by_one,
                        lambda x, w: linears[id(w)](x)), xs, ws) for ws in layer.fp8]  # fmt: skip


def setting_rows(name: str, copies: list[list], layer: Layer, want: list, bf16: list, m: int,
                 device: torch.device) -> list[dict]:  # fmt: skip
    """One row per projection: the setting checked, then timed (cuBLAS too for the default)."""
    rows = []
    for i, p in enumerate(layer.projections):
        row = {"m": m, "setting": name, "proj": p.name, "n": p.n, "k": p.k}
        try:
            facts: list[dict] = []
            row["rel_error"] = relative_error(call_with_facts(copies[0][i], facts), want[i]())
            row |= compile_facts(facts)
            row["ms"] = replay_ms([c[i] for c in copies], device, m)
            if name == "default":
                row["bf16_ms"] = replay_ms([c[i] for c in bf16], device, m)
        except Exception as err:  # noqa: BLE001 (a failing setting is a result)
            row["status"] = f"{type(err).__name__}: {str(err)[:100]}"
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--variant", choices=sorted(SETTINGS), default="w8a16")
    parser.add_argument("m", type=int, nargs="*", default=[64, 128, 256])
    args = parser.parse_intermixed_args()
    out, ms, variant = args.out, args.m, args.variant
    device = torch.device("cuda")
    shapes = get_preset("dsv4-flash-tp2").rank_shapes()
    layer = Layer(shapes, COPIES, 128, torch.bfloat16, device, seed=0)
    reference = partial(dense.one_by_one, dense.linear_reference)
    rows = []
    for m in ms:
        xs = activations(m, layer.input_widths, 0, device, torch.bfloat16)
        want = layer.calls(dense.linear_reference, reference, xs, layer.fp8[0])
        bf16 = [layer.calls(lambda x, w: x @ w.T, linear_bf16_group, xs, w) for w in layer.masters]
        for name, options in SETTINGS[variant].items():
            if options.get("block_m", 0) <= 2 * m:
                linear = partial(LINEARS[variant], **options)
                group = dense.group_linear(variant, linear, **options)
                copies = [layer.calls(linear, group, xs, w) for w in layer.fp8]
                rows += setting_rows(name, copies, layer, want, bf16, m, device)
        peer = deepgemm_calls(layer, xs) if variant == "w8a8" else None
        if peer is not None:
            rows += setting_rows("deepgemm", peer, layer, want, bf16, m, device)
    table = pd.DataFrame(rows)
    table.to_csv(out, index=False)
    pd.set_option("display.width", 200)
    print(table.pivot_table(index=["m", "proj"], columns="setting", values="ms").round(4))


if __name__ == "__main__":
    main()
