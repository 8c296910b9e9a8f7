"""Time each dense projection of one `dsv4-flash-tp2` layer on its own, under W8A16 tile
settings, beside cuBLAS bf16 on the same projection, to see which projection a setting loses
on (a layer total hides it).

    python scripts/dense_projection_times.py OUT.csv [M ...]        (default M: 64 128 256)

Each projection cycles through three layer copies (weights from HBM, as in a 40-layer model),
timed as CUDA graph replays, each setting checked first against the fp32 product on the FP8
weights. A developer's tool, like tune_dense.py; the H200 runs behind the W8A16 docstring's
middle-size finding are raw/logs/h200-w8a16-*-tiles-*.csv.
"""

from __future__ import annotations

import sys
from functools import partial

import pandas as pd
import torch

import kernels.dense as dense
from kernels.dense.grouped import linear_bf16_group
from workbench.capture.bench_rows import call_with_facts, compile_facts, time_call
from workbench.presets import get_preset
from workbench.workloads.checks import relative_error
from workbench.workloads.dense import Layer, activations

COPIES = 3


def tiles(m: int, n: int, k: int, warps: int, stages: int, **more: object) -> dict:
    return dict(block_m=m, block_n=n, block_k=k, num_warps=warps, num_stages=stages, **more)


# name: W8A16 options; "s" swapped (tokens on the MMA's N side), "d" direct; tokens x weights.
SETTINGS = {
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


def replay_ms(calls: list, device: torch.device, m: int) -> float:
    """Median ms of one call, over the copies' calls replayed back to back in a CUDA graph."""

    def run() -> None:
        for call in calls:
            call()

    return time_call(run, device, m, graph=True)[0] / len(calls)


def setting_rows(name: str, options: dict, layer: Layer, xs: dict, want: list, bf16: list,
                 m: int, device: torch.device) -> list[dict]:  # fmt: skip
    """One row per projection: the setting checked, then timed (cuBLAS too for the default)."""
    linear = partial(dense.linear_w8a16, **options)
    group = dense.group_linear("w8a16", linear, **options)
    copies = [layer.calls(linear, group, xs, w) for w in layer.fp8]
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
    out, ms = sys.argv[1], [int(a) for a in sys.argv[2:]] or [64, 128, 256]
    device = torch.device("cuda")
    shapes = get_preset("dsv4-flash-tp2").rank_shapes()
    layer = Layer(shapes, COPIES, 128, torch.bfloat16, device, seed=0)
    reference = partial(dense.one_by_one, dense.linear_reference)
    rows = []
    for m in ms:
        xs = activations(m, layer.input_widths, 0, device, torch.bfloat16)
        want = layer.calls(dense.linear_reference, reference, xs, layer.fp8[0])
        bf16 = [layer.calls(lambda x, w: x @ w.T, linear_bf16_group, xs, w) for w in layer.masters]
        for name, options in SETTINGS.items():
            if options.get("block_m", 0) <= 2 * m:
                rows += setting_rows(name, options, layer, xs, want, bf16, m, device)
    table = pd.DataFrame(rows)
    table.to_csv(out, index=False)
    pd.set_option("display.width", 200)
    print(table.pivot_table(index=["m", "proj"], columns="setting", values="ms").round(4))


if __name__ == "__main__":
    main()
