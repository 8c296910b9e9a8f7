"""How near a decode layer's W8A16 GEMMs run to plain reads of the same bytes, kernel by kernel.

    python scripts/dense_decode_read_floor.py OUT.csv [M ...]      (default M: 1 4 16)

A `dsv4-flash-tp2` layer at decode sizes is six dependent GEMMs of 6 to 32 MB of FP8 weights
each, and every one pays a fixed cost (launch, the first DRAM round trips, the tail) that its
bytes at the copy bandwidth do not show. To see how much of a GEMM's time a kernel of any
design would pay, each projection's weight bytes (FP8, and bf16 for cuBLAS's side) are also
read by a Triton kernel that does nothing else: each program loads one chunk in one go and
stores its sum, the best of a few chunk sizes and warp counts a projection. The six reads run
as one CUDA graph as the six GEMMs do, so the chain's time is what six dependent kernels that
only read the layer's weights take: the floor a six-launch layer can reach.

Times are medians of CUDA-graph replays by the workbench's timer (L2 flushed by a read before
each sample). Each chain is then traced once by the PyTorch profiler over a few replays, which
gives every kernel's duration inside the graph and the gaps between them. A developer's tool,
like dense_w8a16_gemm_times.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from statistics import median

import torch
import triton
import triton.language as tl
from dense_w8a16_gemm_times import gpu_layer, run_all, saved_table  # scripts/: on the path

import kernels.dense as dense
from workbench.capture.timing import time_launch
from workbench.workloads.dense import activations

# (int32 elements a program reads, warps): 8 to 32 KB a program, every load issued at once
READ_SETTINGS = [(2048, 4), (4096, 4), (8192, 4), (8192, 8)]
TRACE_REPLAYS = 20


@triton.jit
def _sum_chunk(src_ptr, out_ptr, n, CHUNK: tl.constexpr):
    """Sum this program's chunk of src: the loads are all it does that costs anything."""
    offsets = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    values = tl.load(src_ptr + offsets, mask=offsets < n, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(values, 0))


@triton.jit
def _read_kernel(src_ptr, out_ptr, n, CHUNK: tl.constexpr):
    """A projection's read (`read_call`)."""
    _sum_chunk(src_ptr, out_ptr, n, CHUNK)


@triton.jit
def _l2_flush_kernel(src_ptr, out_ptr, n, CHUNK: tl.constexpr):
    """The same read under a name of its own, so the traces can leave the flushes out."""
    _sum_chunk(src_ptr, out_ptr, n, CHUNK)


def read_call(nbytes: int, chunk: int, warps: int, device: torch.device) -> Callable[[], None]:
    """A launch that reads `nbytes` of a fresh buffer, `chunk` int32 a program."""
    src = torch.zeros(triton.cdiv(nbytes, 4), dtype=torch.int32, device=device)
    programs = triton.cdiv(src.numel(), chunk)
    out = torch.empty(programs, dtype=torch.int32, device=device)
    return partial(_read_kernel[(programs,)], src, out, src.numel(), CHUNK=chunk, num_warps=warps)


def fastest_read(nbytes: int, device: torch.device) -> tuple[Callable[[], None], str, float]:
    """(call, setting, ms): the fastest of READ_SETTINGS at reading `nbytes` alone."""
    best = None
    for chunk, warps in READ_SETTINGS:
        call = read_call(nbytes, chunk, warps, device)
        ms = time_launch(call, device, 1, graph=True).median_ms
        if best is None or ms < best[2]:
            best = (call, f"{chunk * 4 // 1024}KBx{warps}w", ms)
    return best


def traced_kernels(calls: list[Callable], device: torch.device) -> list[tuple[float, float]]:
    """Per kernel of one replay of `calls` in a CUDA graph: (median duration, median gap to
    the kernel before it, 0 for the first) in us over TRACE_REPLAYS replays, each after an L2
    flush."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_all(calls)
    flush_src = torch.zeros(64 * 2**20, dtype=torch.int32, device=device)  # 256 MB, over L2
    flush_out = torch.empty(flush_src.numel() // 8192, dtype=torch.int32, device=device)
    spans: list[list[tuple[float, float]]] = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(TRACE_REPLAYS):
            _l2_flush_kernel[(flush_out.numel(),)](flush_src, flush_out, flush_src.numel(),
                                                   CHUNK=8192, num_warps=8)  # fmt: skip
            graph.replay()
        torch.cuda.synchronize(device)
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and "_l2_flush_kernel" not in e.name
    )
    per_replay = len(kernels) // TRACE_REPLAYS
    for r in range(TRACE_REPLAYS):
        spans.append(kernels[r * per_replay : (r + 1) * per_replay])
    out = []
    for i in range(per_replay):
        durations = [s[i][1] - s[i][0] for s in spans]
        gaps = [s[i][0] - s[i - 1][1] if i else 0.0 for s in spans]
        out.append((median(durations), median(gaps)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("m", type=int, nargs="*", default=[1, 4, 16])
    args = parser.parse_args()
    device, layer = gpu_layer()
    rows: list[dict] = []
    chains: dict[str, list[Callable]] = {}
    for fmt, element in (("fp8", 1), ("bf16", 2)):
        chains[f"read-{fmt}"] = []
        for p in layer.projections:
            nbytes = p.n * p.k * p.count * element
            call, setting, ms = fastest_read(nbytes, device)
            chains[f"read-{fmt}"].append(call)
            rows.append({"m": 0, "proj": p.name, "setting": f"read-{fmt}", "mb": nbytes / 1e6,
                         "read": setting, "ms": ms})  # fmt: skip
    for m in [0, *args.m]:
        if m:
            xs = activations(m, layer.input_widths, 0, device, torch.bfloat16)
            chains["w8a16"] = layer.calls(dense.linear_w8a16, dense.linear_w8a16_group, xs,
                                          layer.weights("w8a16")[0])  # fmt: skip
            chains["bf16"] = layer.calls(dense.linear, dense.group_linear("bf16", dense.linear),
                                         xs, layer.weights("bf16")[0])  # fmt: skip
        for name, calls in chains.items():
            if (m == 0) != name.startswith("read"):
                continue
            ms = time_launch(partial(run_all, calls), device, max(m, 1), graph=True).median_ms
            traced = traced_kernels(calls, device)
            row = {"m": m, "proj": "layer", "setting": name, "ms": ms,
                   "kernel_us": sum(d for d, _ in traced), "gap_us": sum(g for _, g in traced),
                   "per_kernel_us": " ".join(f"{d:.1f}" for d, _ in traced),
                   "gaps_us": " ".join(f"{g:.1f}" for _, g in traced)}  # fmt: skip
            rows.append(row)
    print(saved_table(rows, args.out).round(4).to_string(index=False, line_width=250))


if __name__ == "__main__":
    main()
