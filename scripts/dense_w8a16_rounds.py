"""How the Gluon W8A16 kernel's time grows past one round of the SMs: one program a tile
(`split_k=1`), N from a quarter of the SMs' worth of 128-row tiles to three rounds, at a K
and at 64 and 128 token rows.

    python scripts/dense_w8a16_rounds.py OUT.csv [--k 1280 5120]

Each GEMM is timed as CUDA-graph replays with L2 flushed (the workbench's timer), and its
time is also given per round (over ceil(tiles / SMs)). It is the measurement behind the stream
plan's verdict in docs/design.md: at q_up's K a program's 10 K steps cost about the same
however many SMs run, so a GEMM's time goes by rounds (raw/logs/h200-dense-w8a16-rounds-*.txt,
taken by an earlier form of this script with the same tiles). A developer's tool, like
dense_w8a16_gemm_times.py.
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch
import triton

from kernels.dense import DenseWeights
from kernels.dense.w8a16_wgmma import ROWS, linear_w8a16_wgmma
from kernels.moe.routing import planned_sms
from workbench.capture.timing import time_launch

ROUNDS = (0.25, 0.5, 0.75, 1.0, 1.21, 1.455, 1.75, 2.0, 2.5, 3.0)  # tiles, in rounds of the SMs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--k", type=int, nargs="+", default=[1280, 5120])
    args = parser.parse_args()
    device = torch.device("cuda")
    sms = planned_sms(device)
    rows = []
    for k in args.k:
        for m in (64, 128):
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            for share in ROUNDS:
                tiles = round(share * sms)
                master = torch.randn(tiles * ROWS, k, device=device) / k**0.5
                w = DenseWeights.quantize(master, "fp8", 128)
                ms = time_launch(lambda x=x, w=w, m=m: linear_w8a16_wgmma(x, w, split_k=1,
                                                                          block_t=m),
                                 device, m, graph=True).median_ms  # fmt: skip
                rounds = triton.cdiv(tiles, sms)
                row = {"m": m, "k": k, "row_tiles": tiles, "ms": ms,
                       "us_per_round": ms * 1e3 / rounds}  # fmt: skip
                print(row, flush=True)
                rows.append(row)
    table = pd.DataFrame(rows)
    table.to_csv(args.out, index=False)
    print(table.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
