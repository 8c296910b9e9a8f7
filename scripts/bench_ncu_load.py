"""Benchmark: load each Nsight Compute report and build every table of it, on this machine.

    ./dev python scripts/bench_ncu_load.py [REPORT ...]   (default: ncu/*.ncu-rep*)

Prints, per report, its size and the best of three wall times of `load_ncu` plus summary,
stalls, hotspots, occupancy, rules and a diff against itself. Issue 5 asks for under 2 s on a
12 MB report on the CPU machine; this measures it rather than asserting it in a timed test.
"""

from __future__ import annotations

import glob
import sys
import time
from pathlib import Path

import pandas as pd

from workbench.analysis.ncu import load_ncu


def build_everything(path: Path) -> int:
    report = load_ncu(path)
    report.summary(), report.stalls(), report.hotspots(), report.occupancy(), report.rules()
    report.kernel_time()
    report.diff(report)
    return len(report)


def main(paths: list[str]) -> None:
    rows = []
    for path in map(Path, paths or sorted(glob.glob("ncu/*.ncu-rep*"))):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            launches = build_everything(path)
            times.append(time.perf_counter() - start)
        rows.append({"report": path.name, "MB": round(path.stat().st_size / 1e6, 1),
                     "launches": launches, "best_s": round(min(times), 3),
                     "worst_s": round(max(times), 3)})  # fmt: skip
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
