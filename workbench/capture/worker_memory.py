"""What one sweep or A/B worker needs in memory, and how a worker that died of it is told apart.

A MoE worker at the default preset's shapes holds 384 experts' weights several times over
while it quantises them and builds the reference: some 80 GB on a CPU (fp32), where two such
workers once took a 24 GB host down. So the parent estimates each worker before starting it,
runs only as many at once as the host holds, and records one that cannot fit at all as a row
with status `oom` and the estimate, without starting it. The MoE estimate follows the code's
allocations and errs a little high: measured at the default preset on an H200 it was within
5% of the peak GPU memory reserved, and at small shapes on the CPU within 15% of peak RSS.

When the kernel's OOM killer strikes anyway, the worker dies of SIGKILL, as from `kill -9`.
To tell the two apart, each worker keeps its peak RSS and the least free host memory it saw
in memory shared with the parent (a thread samples /proc), and the parent compares the
kernel's OOM-kill counters from before and after. The same thread ends the worker and its
process group once its parent is gone, so a SIGKILLed sweep leaves no worker running. This
module imports no torch: the worker runs it before its environment is set.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from workbench.capture.memory import GIB, HEADROOM, available_host_bytes, estimate_bytes
from workbench.presets import Preset, RankShapes

CPU_WORKER_BYTES = GIB // 2  # a CPU worker's Python, torch and triton before any tensor (~0.35)
GPU_WORKER_HOST_BYTES = 2 * GIB  # a GPU worker's host side: the above and the CUDA context
WATCH_PERIOD_S = 0.2
# SIGKILL with the host's free memory below this fraction of the worker's own peak RSS at its
# last reading: out of memory (a reading is at most WATCH_PERIOD_S old; allocation is faster).
NEAR_LIMIT = 0.25

_lock = threading.Lock()
_readings: Any = None  # in a worker: [peak RSS, least free host memory] shared with the parent


def moe_bytes(s: RankShapes, fmt: str, tokens: int, on_gpu: bool) -> int:
    """Peak bytes a MoE measurement (`experiments.measure_moe`) allocates on its device."""
    n = s.experts * 3 * s.hidden * s.expert_intermediate  # expert weight elements
    element = 2 if on_gpu else 4  # the masters in `serving_dtype`: bf16, fp32 on the CPU
    masters = n * element
    # Drawn in fp32, then cast: for a moment gate_up (2/3 of n) is held in both dtypes.
    drawing = 2 * n // 3 * (4 + element) if on_gpu else masters
    if fmt == "bf16":
        # The kernels read the masters; the interpreter copies some (1.17x measured).
        weights = max(drawing, masters if on_gpu else masters * 4 // 3)
    else:
        stored = n if fmt == "fp8" else n // 2
        # Quantising, then dequantising for the reference, holds ~3.5 fp32 copies of gate_up.
        weights = max(drawing, masters + stored + int(3.5 * (2 * n // 3) * 4))
    # slot buffers counted in fp32 (split-K partials are; unsplit rows are bf16): a bound
    slots = s.top_k * (3 * s.expert_intermediate + s.hidden) * 4 * 2
    activations = tokens * (s.hidden * 4 * 3 + slots)
    return weights + activations + (HEADROOM if on_gpu else 0)


def moe_host_bytes(s: RankShapes, fmt: str, tokens: int, on_gpu: bool) -> int:
    """Host memory of a MoE worker: its tensors too on the CPU, only its process on a GPU."""
    if on_gpu:
        return GPU_WORKER_HOST_BYTES
    return CPU_WORKER_BYTES + moe_bytes(s, fmt, tokens, on_gpu=False)


def dense_host_bytes(elements: int, io_elements: int, tokens: int, on_gpu: bool) -> int:
    """Host memory of a dense A/B worker (`experiments.measure_dense`): one layer copy of
    `elements` weights on the CPU as fp32 masters, FP8 values and their dequantised fp32
    reference copy, and the layer's inputs and outputs (`io_elements` a token) in fp32 for the
    kernel and the two references; only its process on a GPU."""
    if on_gpu:
        return GPU_WORKER_HOST_BYTES
    return CPU_WORKER_BYTES + elements * (4 + 1 + 4) + tokens * io_elements * 4 * 3


def profile_host_bytes(
    preset: Preset, tokens: int, chunk: int | None, streams: int, on_gpu: bool
) -> int:
    """Host memory of a profile A/B arm: on the CPU the bound `profile_run` itself checks (fp32
    doubles `memory.estimate_bytes`); on a GPU the profile checks its device memory itself."""
    if on_gpu:
        return GPU_WORKER_HOST_BYTES
    return CPU_WORKER_BYTES + 2 * estimate_bytes(preset, tokens, min(chunk or tokens, tokens),
                                                 streams)  # fmt: skip


def oom_row(need: int, free: int, where: str) -> dict:
    """The row of a configuration refused because its estimate does not fit."""
    return {
        "status": "oom",
        "error": f"not started: needs about {need / GIB:.1f} GiB of {where} memory and "
        f"{free / GIB:.1f} GiB is free (estimate)",
        "need_bytes": need,
        "free_bytes": free,
    }


def record(peak_rss: int | None, free: int | None) -> None:
    """Fold one reading into what the parent sees if this worker dies: the highest peak RSS
    and the least free host memory so far."""
    if _readings is None:
        return
    with _lock:
        if peak_rss is not None:
            _readings[0] = max(_readings[0], peak_rss)
        if free is not None:
            _readings[1] = free if _readings[1] < 0 else min(_readings[1], free)


def _peak_rss() -> int | None:
    """This process's peak resident memory (VmHWM), or None without /proc."""
    try:
        for line in open("/proc/self/status"):  # noqa: SIM115 (read once per sample)
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _watch(parent: int) -> None:
    while True:
        if os.getppid() != parent:  # orphaned: the sweep is gone, so is its watchdog
            os.killpg(0, signal.SIGKILL)  # this worker's own process group (it called setpgrp)
        record(_peak_rss(), available_host_bytes())
        time.sleep(WATCH_PERIOD_S)


def watch(readings: Any, parent: int) -> None:
    """In a worker: sample its memory into `readings` (a shared [peak RSS, least free] array
    the parent made) and end its process group as soon as `parent` is gone.

    A thread that polls the parent pid rather than prctl(PR_SET_PDEATHSIG): the signal would
    kill the worker alone and leave its own children running."""
    global _readings
    _readings = readings
    threading.Thread(target=_watch, args=(parent,), name="worker-watch", daemon=True).start()


def oom_kill_reason(
    exitcode: int | None,
    peak_rss: int,
    least_free: int,
    kills_before: dict[str, int],
    kills_after: dict[str, int],
) -> str | None:
    """Why a worker that died without a result is taken to be out of memory, or None.

    The OOM killer sends SIGKILL. Evidence that it was the OOM killer: a kernel OOM-kill
    counter (`memory.oom_kill_counts`) rose while the worker ran, or the worker's readings
    show the host nearly out of memory (`least_free` below NEAR_LIMIT of its `peak_rss`; -1
    and 0 mean no reading)."""
    if exitcode != -signal.SIGKILL:
        return None
    peak = f"peak RSS {peak_rss / GIB:.1f} GiB" if peak_rss > 0 else "no memory reading"
    if any(kills_after.get(name, n) > n for name, n in kills_before.items()):
        return f"killed by the kernel's OOM killer (SIGKILL; {peak})"
    if peak_rss > 0 and 0 <= least_free < NEAR_LIMIT * peak_rss:
        return (
            f"out of host memory: killed by SIGKILL with {least_free / GIB:.1f} GiB left ({peak})"
        )
    return None
