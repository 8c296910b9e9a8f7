"""Time a short, hand-picked grid of tile settings of the FP8 dense kernels on the GPU, over all
dense projections of one `dsv4-flash-tp2` layer, in one process (each setting checked against
its fp32 reference first), to choose their defaults per M class.

    python scripts/tune_dense.py OUT_DIR [--budget-s 240] [--m 4096 16384]
                                 [--grid pdl|middle-splits|wgmma-waves|small|gemv]

Writes OUT_DIR/tune-dense.csv and prints one line per setting as it finishes; cuBLAS bf16 on
the same layer is timed at every M for scale. A developer's tool for picking defaults, like
tune_moe.py; `workbench bench dense` is the product's benchmark. plans/tune.toml runs it on a
GPU box; the H200 grid behind the current defaults is raw/logs/h200-tune-dense.csv.
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch

import kernels.dense as dense
from workbench.capture.bench_rows import call_with_facts, compile_facts
from workbench.capture.timing import time_launch
from workbench.presets import get_preset
from workbench.workloads.checks import passes, relative_error
from workbench.workloads.dense import Layer, activations


def tiles(m: int, n: int, k: int, w: int, s: int) -> dict:
    return dict(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=s)


DECODE = [{}, {"swap_ab": True}, tiles(16, 64, 128, 4, 4), tiles(16, 128, 128, 4, 4),
          tiles(16, 128, 256, 4, 3),
          tiles(16, 64, 512, 4, 3), tiles(16, 128, 128, 8, 4), tiles(16, 256, 128, 8, 3),
          tiles(16, 64, 128, 4, 6), tiles(16, 64, 256, 4, 4) | {"split_k": 1}]  # fmt: skip
MIDDLE = [{}, tiles(32, 128, 128, 4, 4), tiles(32, 64, 128, 4, 4), tiles(64, 64, 128, 4, 4),
          tiles(16, 128, 128, 4, 4)]  # fmt: skip
PREFILL = [{}, tiles(128, 128, 64, 8, 3), tiles(128, 256, 64, 8, 3), tiles(64, 128, 64, 4, 4),
           tiles(128, 128, 128, 8, 3), tiles(128, 64, 64, 4, 4), tiles(256, 128, 64, 8, 3),
           tiles(128, 128, 64, 4, 4)]  # fmt: skip
W8A8_PREFILL = [{}, tiles(128, 128, 128, 8, 4), tiles(128, 128, 128, 8, 6),
                tiles(128, 256, 128, 8, 4), tiles(64, 128, 128, 4, 4), tiles(128, 64, 128, 4, 4),
                tiles(256, 128, 128, 8, 3)]  # fmt: skip
WS = {"warp_specialize": True}
PAIRED = {"paired_k": True}
W8A8_TMA = [{}, tiles(128, 128, 128, 8, 3), tiles(128, 128, 128, 8, 4) | WS,
            tiles(128, 128, 128, 8, 3) | PAIRED, tiles(128, 128, 128, 8, 4) | PAIRED | WS,
            tiles(256, 128, 128, 16, 3), tiles(256, 128, 128, 16, 3) | PAIRED,
            tiles(128, 128, 128, 8, 5), tiles(128, 128, 128, 4, 3) | PAIRED,
            tiles(128, 256, 128, 8, 3), tiles(128, 256, 128, 8, 3) | WS,
            tiles(64, 128, 128, 4, 4), tiles(128, 128, 128, 4, 4), tiles(256, 128, 128, 8, 3),
            tiles(128, 128, 128, 8, 4) | {"tma": False}]  # fmt: skip
# The Gluon kernel (kernels/dense/w8a8_wgmma.py) against the TMA kernel's default ({}).
WGMMA = {"wgmma": True}
W8A8_WGMMA = [{}, WGMMA, tiles(128, 128, 128, 8, 5) | WGMMA, tiles(128, 128, 128, 8, 4) | WGMMA,
              tiles(128, 64, 128, 8, 6) | WGMMA]  # fmt: skip
W8A16_MID = [{}, *MIDDLE[1:], tiles(64, 64, 128, 4, 4) | {"swap_ab": False},
             tiles(64, 64, 128, 4, 4) | {"split_k": 1}, tiles(64, 64, 128, 4, 4) | {"split_k": 4},
             tiles(64, 64, 256, 4, 3), tiles(64, 32, 128, 4, 4), tiles(128, 64, 128, 4, 4),
             tiles(64, 64, 128, 8, 4)]  # fmt: skip
# From 17 to 32 rows: the 32-row swapped middle tiles (the default) against direct tiles of 16
# rows (two row tiles, the second reading the weights from L2) and of 32 rows.
DIRECT = {"swap_ab": False}
W8A16_SMALL = [{}, tiles(16, 64, 128, 4, 4) | DIRECT, tiles(16, 128, 128, 4, 4) | DIRECT,
               tiles(32, 64, 128, 4, 4) | DIRECT, tiles(32, 128, 128, 4, 4) | DIRECT,
               tiles(64, 64, 128, 4, 4) | DIRECT, tiles(32, 64, 128, 4, 3) | DIRECT]  # fmt: skip
TMA = {"tma": True}
W8A8_MID = [{}, tiles(64, 64, 128, 4, 4), tiles(32, 128, 128, 4, 4), tiles(16, 128, 128, 4, 4),
            tiles(64, 128, 128, 4, 4) | {"split_k": 8}, tiles(32, 64, 128, 4, 4),
            tiles(64, 128, 128, 4, 4) | TMA, tiles(64, 64, 128, 4, 4) | TMA,
            tiles(128, 128, 128, 8, 3) | TMA, tiles(64, 128, 128, 4, 3) | TMA,
            WGMMA, tiles(128, 64, 128, 8, 6) | WGMMA]  # fmt: skip
# Programmatic dependent launch (kernels.pdl) off and on, the rest as the defaults at each M.
PDL_AB = [{"pdl": False}, {"pdl": None}]
# The middle sizes' direct tiles with more programs an SM (ncu/dense-w8a16-T6-128-4096 has o_b at
# M=128 on a grid too small for the SMs' block slots: 15% of warps resident against 25%).
MIDDLE_SPLITS = [{}, *(tiles(32, 64, 128, 4, 3) | DIRECT | {"split_k": s} for s in (2, 3, 4)),
                 tiles(16, 64, 128, 4, 4) | DIRECT,
                 tiles(16, 64, 128, 4, 4) | DIRECT | {"split_k": 2},
                 tiles(32, 32, 128, 4, 3) | DIRECT, tiles(32, 64, 128, 4, 4) | DIRECT]  # fmt: skip
# The Gluon kernel's default tiles (w8a8_wgmma.default_block_m) against one wave (128 rows)
# and two (256 rows sharing each K step's weight tile: a quarter fewer bytes from L2 per FLOP)
# everywhere; the first H200 run of this grid also had two waves at 3 stages, 1.5x slower.
WGMMA_WAVES = [{}, WGMMA | {"block_m": 128, "num_stages": 5},
               WGMMA | {"block_m": 256, "num_stages": 4}]  # fmt: skip
# The CUDA-core kernel (kernels/dense/w8a16_gemv.py) against the tensor-core decode tiles, over
# a program's bytes and warps.
GEMV = [{"gemv": False}, *({"gemv": True, "tile_bytes": b * 1024, "num_warps": w}
                           for b in (4, 8, 16, 32) for w in (2, 4, 8))]  # fmt: skip
GRIDS = {  # --grid NAME: this grid alone, at every --m
    "pdl": ("w8a16", 128, PDL_AB),
    "middle-splits": ("w8a16", 128, MIDDLE_SPLITS),
    "wgmma-waves": ("w8a8", 128, WGMMA_WAVES),
    "small": ("w8a16", 128, W8A16_SMALL),
    "gemv": ("w8a16", 128, GEMV),
}
# (variant, weight block, M, grid)
CASES = [
    ("w8a8", 128, 4096, W8A8_WGMMA),
    ("w8a8", 128, 16384, W8A8_WGMMA),
    ("w8a8", 128, 4096, W8A8_TMA),
    ("w8a8", 128, 16384, W8A8_TMA[:9]),
    ("w8a8", 128, 64, W8A8_MID),
    ("w8a8", 128, 128, W8A8_MID),
    ("w8a8", 128, 256, W8A8_MID),
    ("w8a16", 128, 4, DECODE),
    ("w8a16", 128, 32, W8A16_SMALL),
    ("w8a16", 128, 64, W8A16_SMALL),
    ("w8a16", 128, 256, W8A16_SMALL),
    ("w8a16", 128, 128, W8A16_MID),
    ("w8a16", 128, 4096, PREFILL),
    ("w8a8", 32, 4096, W8A8_PREFILL),
    ("w8a16", 32, 24, MIDDLE),
    ("w8a16", 32, 256, PREFILL[:4]),
    ("w8a8", 32, 256, W8A8_PREFILL[:4]),
    ("w8a8", 32, 4, [DECODE[0], *DECODE[2:5]]),
]
SEED = 0


def layer_calls(variant: str, layer: Layer, xs: dict, weights: list, **options) -> list:
    """The layer's projections as `variant` runs them with tile `options` (its output
    projection's group as one launch where the variant has one: kernels.dense.grouped)."""
    linear = partial(dense.VARIANTS[variant], **options)
    return layer.calls(linear, dense.group_linear(variant, linear, **options), xs, weights)


def layer_call(variant: str, layer: Layer, xs: dict, sets: list, **options):
    calls = [
        call for weights in sets for call in layer_calls(variant, layer, xs, weights, **options)
    ]

    def run() -> None:
        for call in calls:
            call()

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--m", type=int, nargs="*", help="only the cases at these M")
    parser.add_argument("--grid", choices=sorted(GRIDS), help="only this grid, at every --m")
    args = parser.parse_args()
    cases = CASES
    if args.grid:
        if not args.m:
            parser.error("--grid needs the sizes to run it at: --m 1 4 16 64")
        variant, block, grid = GRIDS[args.grid]
        cases = [(variant, block, m, grid) for m in args.m]
    deadline = time.monotonic() + args.budget_s
    device = torch.device("cuda")
    s = get_preset("dsv4-flash-tp2").rank_shapes()
    layers = {b: Layer(s, 3, b, torch.bfloat16, device, SEED) for b in (32, 128)}
    rows = []
    for variant, block, m, grid in cases:
        if args.m and m not in args.m:
            continue
        layer = layers[block]
        xs = activations(m, layer.input_widths, SEED, device, torch.bfloat16)
        sets = layer.fp8 if m <= 48 else layer.fp8[:1]
        bf16 = layer_call("bf16", layer, xs, layer.masters if m <= 48 else layer.masters[:1])
        cublas_ms = time_launch(bf16, device, m, graph=True, units=len(sets)).median_ms
        reference = dense.w8a8_reference if variant == "w8a8" else dense.linear_reference
        references = layer.calls(reference, partial(dense.one_by_one, reference), xs,
                                 layer.fp8[0])  # fmt: skip
        for options in grid:
            if time.monotonic() > deadline:
                break
            row = {"variant": variant, "block": block, "m": m, **options, "cublas_ms": cublas_ms}
            try:
                facts: list[dict] = []
                errors = [
                    relative_error(call_with_facts(call, facts), want())
                    for call, want in zip(
                        layer_calls(variant, layer, xs, layer.fp8[0], **options), references,
                        strict=True,
                    )
                ]  # fmt: skip
                row |= {"rel_error": max(errors), **compile_facts(facts)}
                if not passes(row["rel_error"], "dense", variant):
                    row["status"] = "wrong"
                else:
                    run = layer_call(variant, layer, xs, sets, **options)
                    row["ms"] = time_launch(run, device, m, graph=True, units=len(sets)).median_ms
                    row["vs_cublas"] = cublas_ms / row["ms"]
                    row["status"] = "spills" if row.get("spills") else "ok"
            except Exception as err:  # noqa: BLE001 (a failing setting is a result)
                row["status"] = f"{type(err).__name__}: {str(err)[:120]}"
            print(row, flush=True)
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out / "tune-dense.csv", index=False)


if __name__ == "__main__":
    main()
