"""What a fresh process pays the first time it uses torch's profiler or a CUDA graph.

    python scripts/first_use_cost.py {graph-then-profiler,profiler-then-graph}

Times, in this process: `import torch`, the CUDA context, capturing a one-kernel CUDA graph, and
a one-kernel torch.profiler session with CUDA activities, in the order given, then the first
of them again. Prints one line. It is the measurement behind run.json's `environment.bytecode`
(`workbench.capture.environment`): on the lent H200 the first profiler session took 4.3 to
6.2 s while Python compiled the torch modules it imports (torch was installed without bytecode
there and PYTHONDONTWRITEBYTECODE is set), and 1.0 to 1.1 s once they were compiled
(raw/logs/h200-first-use-cost-20261201T1357.txt).
Run it with CUDA_MODULE_LOADING=EAGER to see what loading every kernel up front costs instead.
A developer's tool, like graph_launch_cost.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

started = time.perf_counter()
import torch  # noqa: E402  (its import is what is timed)
from torch.profiler import ProfilerActivity, profile  # noqa: E402

ORDERS = {"graph-then-profiler": ("graph", "profiler", "graph"),
          "profiler-then-graph": ("profiler", "graph", "profiler")}  # fmt: skip


def capture_graph(x: torch.Tensor) -> float:
    """Seconds to capture one in-place add as a CUDA graph (after a warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    begun = time.perf_counter()
    with torch.cuda.graph(graph):
        x.add_(1)
    return time.perf_counter() - begun


def profiler_session(x: torch.Tensor) -> float:
    """Seconds for a profiler session around one add, start to stop."""
    begun = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        x.add_(1)
        torch.cuda.synchronize()
    return time.perf_counter() - begun


def main() -> None:
    order = sys.argv[1] if len(sys.argv) > 1 else ""
    if order not in ORDERS:
        sys.exit(f"usage: python scripts/first_use_cost.py {{{','.join(ORDERS)}}}")
    if not torch.cuda.is_available():
        sys.exit("first_use_cost.py needs a CUDA GPU: it times CUDA graphs and CUPTI.")
    seconds = {"import": time.perf_counter() - started}
    begun = time.perf_counter()
    x = torch.zeros(1000, device="cuda")
    torch.cuda.synchronize()
    seconds["cuda_init"] = time.perf_counter() - begun
    for i, step in enumerate(ORDERS[order]):
        use = capture_graph if step == "graph" else profiler_session
        seconds[f"{step}{'' if i < 2 else ' again'}"] = use(x)
    loading = os.environ.get("CUDA_MODULE_LOADING", "default")
    timings = ", ".join(f"{name} {s:.3f} s" for name, s in seconds.items())
    written = not sys.dont_write_bytecode
    cached = Path(importlib.util.cache_from_source(torch.__file__)).exists()
    print(f"{order} (CUDA_MODULE_LOADING {loading}, bytecode written {written}, torch's cached "
          f"{cached}): {timings}")  # fmt: skip


if __name__ == "__main__":
    main()
