"""Time a short, hand-picked grid of tile settings of one MoE scheduler on the GPU, in one
process (each setting checked against the reference first), to choose its defaults.

    python scripts/tune_moe.py OUT_DIR [--variant flat] [--budget-s 120] [--case fp8:6 ...]
                                       [--grid decode-fine|down-decode|int4-prefill|
                                               int4-decode-rings]

`--variant w8a8` takes its own grid (FP8 experts at T = 4,096 and 33,863); its rel_error is
then against the bf16-activation reference, FP8 activations' rounding included.

Writes OUT_DIR/tune-<variant>.csv and prints one line per setting as it finishes. This is a
developer's tool for picking defaults; `workbench sweep` is the product's isolated sweep.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from kernels.moe import (
    VARIANTS,
    W8A8_VARIANTS,
    MoeWeights,
    flat,
    int4_mma,
    last_facts,
    trusted_routing,
)
from kernels.moe.routing import sm_count
from workbench.capture.bench_rows import compile_facts
from workbench.capture.timing import time_launch
from workbench.presets import get_preset
from workbench.workloads.checks import relative_error
from workbench.workloads.moe import expert_masters, moe_problem, reference

SEED = 0

PREFILL = [
    {},  # the current defaults (bf16 on sm_90: the Gluon kernels; tile options run Triton)
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3),
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
    dict(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=4),
    dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3),
    dict(block_m=64, block_n=256, block_k=64, num_warps=8, num_stages=3),
    dict(block_m=64, block_n=128, block_k=128, num_warps=8, num_stages=3),
    dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=2),
    # weights as the MMA's first operand, dequantised in registers (no trip through shared
    # memory); the rows a tile become the MMA's N
    dict(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=3, swap_ab=True),
    dict(block_m=64, block_n=128, block_k=128, num_warps=8, num_stages=3, swap_ab=True),
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3, swap_ab=True),
    dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3, swap_ab=True),
    dict(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=4, swap_ab=True),
]
DECODE = [
    {},
    dict(swap_ab=True),
    dict(block_n=64, block_k=128),
    dict(block_n=128, block_k=128, num_stages=3),
    dict(block_n=256, block_k=128, num_stages=3, num_warps=8),
    dict(block_n=64, block_k=256, num_stages=3),
    dict(block_n=128, block_k=64, num_stages=6),
    dict(block_n=128, block_k=128, split_k=1),
    dict(block_n=64, block_k=64, num_stages=4, num_warps=2),
    dict(block_n=256, block_k=64, num_stages=5, num_warps=8),
    dict(block_n=128, block_k=128, num_stages=4, num_warps=8),
    dict(block_n=128, block_k=128, num_stages=4, num_warps=8, swap_ab=True),
    dict(block_n=128, block_k=128, num_stages=6, num_warps=8),
    dict(block_n=128, block_k=128, num_stages=6, num_warps=4),
    dict(block_n=256, block_k=128, num_stages=3, num_warps=8, swap_ab=True),
    dict(block_n=128, block_k=64, num_stages=6, num_warps=4, swap_ab=True),
    # flat's programs an SM (its default: flat.default_programs, at decode two for bf16 and
    # INT4 and three for FP8, since one 8-warp program an SM was latency-bound in Nsight
    # Compute); flat only, the other schedulers refuse the option
    dict(programs_per_sm=1),
    dict(programs_per_sm=2),
    dict(block_n=64, block_k=128, num_warps=4, num_stages=4, programs_per_sm=2),
    dict(block_n=64, block_k=128, num_warps=4, num_stages=4, programs_per_sm=3),
    dict(block_n=128, block_k=128, num_warps=4, num_stages=3, programs_per_sm=2),
    dict(block_n=128, block_k=128, num_warps=4, num_stages=4, programs_per_sm=2),
    dict(block_n=64, block_k=128, num_warps=4, num_stages=3, programs_per_sm=4),
    dict(block_n=64, block_k=128, num_warps=2, num_stages=4, programs_per_sm=4),
]
PROGRAMS = DECODE[-8:]  # the rows that set flat's programs an SM
# --grid decode-fine: around the 64-wide, 128-deep decode tiles (flat's programs_per_sm rows are
# refused by the other schedulers)
DECODE_FINE = [
    {},
    dict(block_n=64, block_k=128, num_warps=4, num_stages=3),
    dict(block_n=64, block_k=128, num_warps=4, num_stages=5),
    dict(block_n=64, block_k=128, num_warps=2, num_stages=4),
    dict(block_n=32, block_k=128, num_warps=2, num_stages=4),
    dict(block_n=32, block_k=128, num_warps=4, num_stages=4),
    dict(block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=2),
    dict(block_n=128, block_k=128, num_warps=4, num_stages=4),
    dict(block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=1, programs_per_sm=3),
    dict(block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=1, programs_per_sm=4),
    dict(block_n=32, block_k=128, num_warps=2, num_stages=4, programs_per_sm=6),
    dict(block_n=64, block_k=128, num_warps=4, num_stages=4, programs_per_sm=4),
]
# --grid down-decode: flat's down projection at decode on launch settings of its own
# (flat.DECODE_DOWN_OPTIONS and DECODE_DOWN_PROGRAMS_PER_SM), gate/up on its defaults; the
# defaults first and last, to show the drift of the run
DOWN_DECODE = [
    {},
    dict(down_block_n=128),
    dict(down_programs_per_sm=4),
    dict(down_block_n=128, down_programs_per_sm=4),
    dict(down_num_stages=4),
    dict(down_num_stages=4, down_programs_per_sm=4),
    dict(down_block_n=128, down_num_stages=4),
    dict(down_block_n=32, down_num_warps=2, down_programs_per_sm=6),
    dict(down_block_n=128, down_num_warps=8, down_programs_per_sm=2),
    dict(down_programs_per_sm=2),
    {},
]
# --grid int4-prefill: INT4 prefill tiles (launch.INT4_PREFILL_TILES, weights as the MMA's first
# operand) for padded and stock; under Triton 3.6 the defaults spill 64 bytes in stock's gate/up
# (8 in padded's before its slot ids stayed 32-bit), these compile without spills in both
# (scripts/moe_compile_facts.py)
INT4_PREFILL = [
    {},
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3, swap_ab=True),
    dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, swap_ab=True),
    dict(block_m=64, block_n=128, block_k=128, num_warps=8, num_stages=3, swap_ab=True),
    dict(block_m=64, block_n=128, block_k=128, num_warps=8, num_stages=4, swap_ab=True),
    dict(block_m=64, block_n=128, block_k=64, num_warps=8, num_stages=4, swap_ab=True),
]
# --grid int4-decode-rings: the Gluon INT4 decode kernels' rings (int4_mma.GATE_UP_RING and
# DOWN_RING: K steps a slot, slots, programs an SM) against the defaults' two slots of two
# steps: one-step slots, more programs an SM at the registers they leave (96 at five: down
# spills nothing there, gate/up 40 bytes), and down launched with PDL (int4_mma.DOWN_PDL);
# the defaults first and last, to show the drift of the run
INT4_DECODE_RINGS = [
    {},
    dict(int4_gate_up=(1, 4), int4_down=(1, 4)),  # one-step slots, the defaults before
    dict(int4_down_pdl=True),
    dict(int4_down=(2, 2, 5)),
    dict(int4_down=(2, 2, 5), int4_down_pdl=True),
    dict(int4_down=(1, 4, 5)),
    dict(int4_gate_up=(1, 4, 5), int4_down=(1, 4, 5)),
    dict(int4_down=(2, 2, 6)),
    dict(int4_gate_up=(2, 4, 3), int4_down=(2, 4, 3)),
    {},
]
# --grid int4-decode-fp16: gate/up on fp16 operands (int4_mma.GATE_UP_FP16: five integer
# instructions a packed word against eight) against bf16, alternated so that the run's drift
# falls on both alike
INT4_DECODE_FP16 = [dict(int4_gate_up_fp16=False), dict(int4_gate_up_fp16=True)] * 3 + [
    dict(int4_gate_up_fp16=False)
]
GRIDS = {"decode-fine": DECODE_FINE, "down-decode": DOWN_DECODE, "int4-prefill": INT4_PREFILL,
         "int4-decode-rings": INT4_DECODE_RINGS, "int4-decode-fp16": INT4_DECODE_FP16}  # fmt: skip
CASES = [("fp8", 6, DECODE), ("bf16", 33863, PREFILL), ("fp8", 33863, PREFILL),
         ("bf16", 6, DECODE[:4] + PROGRAMS), ("int4", 6, DECODE),
         ("int4", 33863, PREFILL)]  # fmt: skip
# the W8A8 path (FP8 experts only, 128-column tiles): the Triton down kernel in place of the
# Gluon one (the default on sm_90 at 128-row tiles), rows a tile, warps and stages
W8A8 = [{}, dict(wgmma=False), dict(num_stages=4), dict(block_m=64),
        dict(block_m=64, num_stages=4), dict(block_m=64, num_warps=4)]  # fmt: skip
W8A8_CASES = [("fp8", 4096, W8A8), ("fp8", 33863, W8A8)]


def with_programs(params: dict, device: torch.device) -> dict:
    """The call's options: `programs_per_sm` becomes flat's num_programs on this GPU (rows
    without it run flat's default, which depends on the format and size)."""
    params = dict(params)
    per_sm = params.pop("programs_per_sm", None)
    if per_sm is not None:
        params["num_programs"] = per_sm * sm_count(device)
    return params


@contextmanager
def down_settings(params: dict, fmt: str) -> Iterator[dict]:
    """The call's options without the `down_*` keys, which set flat's decode launch of down
    (DECODE_DOWN_OPTIONS: block_n, num_stages, num_warps; DECODE_DOWN_PROGRAMS_PER_SM) for
    the call and are put back after it."""
    down = {k.removeprefix("down_"): v for k, v in params.items() if k.startswith("down_")}
    per_sm = down.pop("programs_per_sm", None)
    options, programs = flat.DECODE_DOWN_OPTIONS[fmt], flat.DECODE_DOWN_PROGRAMS_PER_SM[fmt]
    flat.DECODE_DOWN_OPTIONS[fmt] = options | down
    flat.DECODE_DOWN_PROGRAMS_PER_SM[fmt] = per_sm or programs
    try:
        yield {k: v for k, v in params.items() if not k.startswith("down_")}
    finally:
        flat.DECODE_DOWN_OPTIONS[fmt], flat.DECODE_DOWN_PROGRAMS_PER_SM[fmt] = options, programs


@contextmanager
def int4_rings(params: dict) -> Iterator[dict]:
    """The call's options without the `int4_*` keys, which set the Gluon INT4 decode kernels'
    rings (int4_mma.GATE_UP_RING, DOWN_RING: int4_mma.Ring's fields in order, groups, stages
    and programs an SM), whether down launches with PDL (int4_mma.DOWN_PDL) and whether
    gate/up takes fp16 operands (int4_mma.GATE_UP_FP16) for the call and are put back after
    it."""
    rings = int4_mma.GATE_UP_RING, int4_mma.DOWN_RING, int4_mma.DOWN_PDL, int4_mma.GATE_UP_FP16
    try:
        int4_mma.DOWN_PDL = params.get("int4_down_pdl", int4_mma.DOWN_PDL)
        int4_mma.GATE_UP_FP16 = params.get("int4_gate_up_fp16", int4_mma.GATE_UP_FP16)
        if "int4_gate_up" in params:
            int4_mma.GATE_UP_RING = int4_mma.Ring(*params["int4_gate_up"])
        if "int4_down" in params:
            int4_mma.DOWN_RING = int4_mma.Ring(*params["int4_down"])
        yield {k: v for k, v in params.items() if not k.startswith("int4_")}
    finally:
        (int4_mma.GATE_UP_RING, int4_mma.DOWN_RING, int4_mma.DOWN_PDL,
         int4_mma.GATE_UP_FP16) = rings  # fmt: skip


def chosen_cases(names: list[str] | None, grid: str | None, w8a8: bool) -> list[tuple]:
    """(format, tokens, grid) of each case to run: with `grid`, each of `names` (FMT:TOKENS)
    on it; else the variant's cases, those of `names` only where given, each on its own grid.
    A name that is malformed or, without `grid`, not among the cases is an error."""
    base = W8A8_CASES if w8a8 else CASES
    if grid is None:
        known = {f"{fmt}:{tokens}" for fmt, tokens, _ in base}
        unknown = sorted(set(names or ()) - known)
        if unknown:
            raise ValueError(f"--case {' '.join(unknown)}: not a case of this variant "
                             f"({' '.join(sorted(known))}); with --grid any size runs")  # fmt: skip
        return [case for case in base if not names or f"{case[0]}:{case[1]}" in names]
    if not names:
        raise ValueError("--grid needs the cases to run it on: --case fp8:6 bf16:6")
    cases = []
    for name in names:
        fmt, _, tokens = name.partition(":")
        if fmt not in ("bf16", "fp8", "int4") or not tokens.isdigit() or int(tokens) < 1:
            raise ValueError(f"--case {name}: use FMT:TOKENS, FMT bf16, fp8 or int4, e.g. int4:6")
        cases.append((fmt, int(tokens), GRIDS[grid]))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--variant", default="flat")
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--case", nargs="*", metavar="FMT:TOKENS",
                        help="only these cases, e.g. fp8:6 int4:33863; with --grid, any "
                        "format and token count")  # fmt: skip
    parser.add_argument("--grid", choices=sorted(GRIDS), help="this grid for every case")
    args = parser.parse_args()
    try:
        cases = chosen_cases(args.case, args.grid, args.variant in W8A8_VARIANTS)
    except ValueError as err:
        parser.error(str(err))
    deadline = time.monotonic() + args.budget_s
    dev = torch.device("cuda")
    s = get_preset("dsv4-flash-tp2").rank_shapes()
    # only the formats the cases take: all three beside the bf16 masters and an fp32
    # reference's dequantised copy do not fit an 80 GB H100
    masters = expert_masters(s, SEED, dev, torch.bfloat16)
    weights = {fmt: MoeWeights.quantize(*masters, fmt) for fmt in {fmt for fmt, _, _ in cases}}
    del masters
    rows = []
    for fmt, tokens, grid in cases:
        problem = moe_problem(s, tokens, "uniform", SEED, dev, torch.bfloat16)
        expected = reference(problem, weights[fmt])
        for params in grid:
            if time.monotonic() > deadline:
                break
            row = {"variant": args.variant, "fmt": fmt, "tokens": tokens, **params}
            with int4_rings(params) as params, down_settings(params, fmt) as options:
                call = partial(VARIANTS[args.variant], *problem.args(), weights[fmt],
                               **with_programs(options, dev))  # fmt: skip
                try:
                    row["rel_error"] = relative_error(call(), expected)
                    row |= compile_facts([last_facts()])
                    row["ms"] = time_launch(trusted_routing()(call), dev, tokens).median_ms
                except Exception as err:  # noqa: BLE001 (a failing setting is a result)
                    row["error"] = f"{type(err).__name__}: {str(err)[:100]}"
            print(row, flush=True)
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out / f"tune-{args.variant}.csv", index=False)


if __name__ == "__main__":
    main()
