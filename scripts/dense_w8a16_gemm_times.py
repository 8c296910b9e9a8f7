"""Time the Gluon W8A16 GEMM (kernels/dense/w8a16_wgmma.py) on each dense projection of one
`dsv4-flash-tp2` layer under several settings, beside the Triton W8A16 kernel and cuBLAS bf16,
and the layer's six calls in one CUDA graph for each, to choose its defaults and its range.
The `gemv-*` settings are the CUDA-core kernel (kernels/dense/w8a16_gemv.py) at a fixed number
of weight rows and warps a program, for the one- to four-row sizes it takes.

    python scripts/dense_w8a16_gemm_times.py OUT.csv [M ...] [--settings gluon ...]
                                                              (default M: 32 64 128 256)

Each setting is checked first against the dequantised weights in fp32 (as the bench checks
W8A16); times are medians of CUDA-graph replays by the workbench's timer. A developer's tool,
like dense_w8a8_gemm_times.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial

import pandas as pd
import torch

import kernels.dense as dense
from kernels.dense.w8a16_wgmma import linear_w8a16_wgmma, linear_w8a16_wgmma_group
from workbench.capture.timing import time_launch
from workbench.presets import get_preset
from workbench.workloads.checks import relative_error
from workbench.workloads.dense import Layer, activations

# name: linear_w8a16_wgmma options (none: its defaults)
SETTINGS = {
    "gluon": {},
    "gluon-t64": dict(block_t=64),
    "gluon-t128": dict(block_t=128),
    "gluon-s3": dict(num_stages=3),
    "gluon-t64s4": dict(block_t=64, num_stages=4),
    "gluon-t64s3": dict(block_t=64, num_stages=3),
    "gluon-split1": dict(split_k=1),
    "gluon-split2": dict(split_k=2),
    "gluon-split4": dict(split_k=4),
    "gluon-split8": dict(split_k=8),
    # automatic splits aiming at one program an SM (one round), not half
    "gluon-fill1": dict(split_fill=1.0),
    "gluon-fill1-min4": dict(split_fill=1.0, min_split_steps=4),
    "gluon-fill1-min2": dict(split_fill=1.0, min_split_steps=2),
    "gluon-t64-fill1-min4": dict(block_t=64, split_fill=1.0, min_split_steps=4),
    # the ring refilled two or three K steps after a slot's use, not one (128-token tiles have
    # four slots), so warpgroup 0 refills a slot the other released a step or two before
    "gluon-lag2": dict(refill_lag=2),
    "gluon-lag3": dict(refill_lag=3),
}
# name: linear_w8a16 options of the CUDA-core kernel: weight rows (b) and warps (w) a program
GEMV_SETTINGS = {
    f"gemv-b{rows}w{warps}": dict(gemv=True, block_n=rows, num_warps=warps)
    for rows in (1, 2, 4, 8, 16)
    for warps in (2, 4, 8)
}
GEMV_MOST_BYTES = 32 * 1024  # a program's weights beyond this are left untimed: they spill
# timed as the layer's six calls in one graph too
WHOLE_LAYER = ("bf16", "triton", "gluon", "gluon-fill1", "gluon-fill1-min4", "gluon-fill1-min2",
               "gluon-t64-fill1-min4", "gluon-lag2", "gluon-lag3")  # fmt: skip


def variants(settings: list[str] | None = None) -> dict[str, tuple[Callable, Callable]]:
    """name: (linear(x, w), linear_group(x (M, G, K), members)) of the variants timed: bf16,
    triton and the Gluon `settings` (None: all of SETTINGS)."""
    out = {
        "bf16": (dense.linear, dense.group_linear("bf16", dense.linear)),
        "triton": (dense.linear_w8a16, dense.linear_w8a16_group),
    }
    for name, options in SETTINGS.items():
        if settings is not None and name not in settings:
            continue
        out[name] = (partial(linear_w8a16_wgmma, **options),
                     partial(linear_w8a16_wgmma_group, **options))  # fmt: skip
    for name, options in GEMV_SETTINGS.items():
        if settings is not None and name in settings:
            out[name] = (partial(dense.linear_w8a16, **options),
                         partial(dense.linear_w8a16_group, **options))  # fmt: skip
    return out


def references(layer: Layer, xs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Each projection in fp32 on the dequantised weights; member g of a group reads its
    input's g-th K columns."""
    out, first = [], 0
    for p in layer.projections:
        x, members = xs[p.k * p.count], layer.fp8[0][first : first + p.count]
        first += p.count
        out.append(torch.cat([x[:, g * p.k : (g + 1) * p.k].float() @ w.dequantize().T
                              for g, w in enumerate(members)], 1))  # fmt: skip
    return out


def run_all(calls: list[Callable]) -> None:
    for call in calls:
        call()


def gpu_layer() -> tuple[torch.device, Layer]:
    """The GPU and one copy of a `dsv4-flash-tp2` layer's dense weights on it (bf16 and FP8)."""
    device = torch.device("cuda")
    return device, Layer(get_preset("dsv4-flash-tp2").rank_shapes(), 1, 128, torch.bfloat16,
                         device, 0)  # fmt: skip


def sizes_parser(doc: str, default_m: list[int]) -> argparse.ArgumentParser:
    """The command line these layer scripts share: the CSV to write and the token rows (M)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("m", type=int, nargs="*", default=default_m)
    return parser


def saved_table(rows: list[dict], out: str) -> pd.DataFrame:
    """`rows` as a table, written to `out` (CSV), pandas set to print it whole."""
    table = pd.DataFrame(rows)
    table.to_csv(out, index=False)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.max_rows", 500)
    return table


def main() -> None:
    parser = sizes_parser(__doc__, [32, 64, 128, 256])
    parser.add_argument("--settings", nargs="*", choices=[*SETTINGS, *GEMV_SETTINGS],
                        help="Gluon settings to time beside bf16 and triton (default: all "
                        "of them; the flag alone: none), and gemv settings to time when "
                        "named")  # fmt: skip
    args = parser.parse_args()
    device, layer = gpu_layer()
    rows = []
    for m in args.m:
        xs = activations(m, layer.input_widths, 0, device, torch.bfloat16)
        wants = references(layer, xs)  # once an M: every variant is checked against them
        for name, (linear, linear_group) in variants(args.settings).items():
            weights = layer.weights("bf16" if name == "bf16" else "w8a16")[0]
            calls = layer.calls(linear, linear_group, xs, weights)
            for p, call, want in zip(layer.projections, calls, wants, strict=True):
                row = {"m": m, "proj": p.name, "n": p.n, "k": p.k * p.count, "setting": name}
                rows_a_program = GEMV_SETTINGS.get(name, {}).get("block_n", 0)
                if rows_a_program * p.k > GEMV_MOST_BYTES:
                    continue
                try:
                    row["rel_error"] = relative_error(call(), want)
                    row["ms"] = time_launch(call, device, m, graph=True).median_ms
                except Exception as err:  # noqa: BLE001 (a failing setting is a result)
                    row["status"] = f"{type(err).__name__}: {str(err)[:120]}"
                print(row, flush=True)
                rows.append(row)
            if name in WHOLE_LAYER:
                row = {"m": m, "proj": "layer", "setting": name}
                row["ms"] = time_launch(partial(run_all, calls), device, m, graph=True).median_ms
                print(row, flush=True)
                rows.append(row)
    table = saved_table(rows, args.out)
    print(table.pivot_table(index=["m", "proj"], columns="setting", values="ms").round(4))


if __name__ == "__main__":
    main()
