"""The device's GEMM ceilings timed alone against timed in turns, alternated in one process.

    python scripts/ceilings_alone_vs_turns.py OUT_DIR [--rounds 3]

'alone' times the bf16 GEMM and then the FP8 one (`torch._scaled_mm`), each by the one timer
on its own (`capture.timing.time_launch`: warm-up, then samples); 'turns' is
`measure_ceilings` (copy, bf16 and FP8 timed in turns by `time_launches`). The two alternate,
first one then the other, over `--rounds`; the FP8 GEMM alone always follows the bf16 one,
and each way builds the copy's buffers (only 'turns' times them). Writes
OUT_DIR/ceilings-alone-vs-turns.csv. It is the measurement behind timing the ceilings in turns
(capture/ceilings.py, docs/design.md): a rate taken alone was a floor that cuBLAS's own layer
beat. The committed logs (raw/logs/h200-ceilings-alone-vs-turns-*) ran before the rounds took
a Williams design's orders: theirs were rotated by one, each ceiling stopping by its own rule,
and the first one's 'alone' did not build the copy's buffers. A developer's tool, like
tune_dense.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from workbench.capture.ceilings import ceiling_work, measure_ceilings
from workbench.capture.timing import time_launch


def rates_alone(device: torch.device) -> dict[str, float]:
    """The GEMM rates (TFLOP/s), each GEMM timed by itself, one after the other."""
    work = ceiling_work(device)
    return {
        f"{name}_tflops": amount / (time_launch(fn, device, 0, graph=False).median_ms / 1e3) / 1e12
        for name, (fn, amount) in work.items()
        if name != "copy"
    }


def rates_in_turns(device: torch.device) -> dict[str, float]:
    """The GEMM rates (TFLOP/s) as a bench takes them: in turns with each other and the copy."""
    ceilings = measure_ceilings(device)
    return {
        "bf16_tflops": ceilings["bf16_flops"] / 1e12,
        "fp8_tflops": ceilings["fp8_flops"] / 1e12,
    }


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ceilings_alone_vs_turns.py times the GPU's ceilings: it needs a GPU")
    device = torch.device("cuda")
    ways = {"alone": rates_alone, "turns": rates_in_turns}
    rows = []
    for round_ in range(args.rounds):
        order = list(ways) if round_ % 2 == 0 else list(ways)[::-1]
        for how in order:
            rows.append({"round": round_, "how": how} | ways[how](device))
            print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "ceilings-alone-vs-turns.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
