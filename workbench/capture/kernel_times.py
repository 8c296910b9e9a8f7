"""Each kernel's share of a timed call: the device time of the kernels the call launches, by
kernel name, per call, read by the PyTorch profiler after the call was timed.

Why: a kernel A/B's ratio is over the whole call (a MoE layer: routing layout, gate/up, SiLU,
down, combine); an edit to one of its kernels moves that kernel's microseconds, which the
call's noise can swallow. By kernel name, the change shows where it is.

How to read it: the calls run eagerly, back to back, without the L2 flush the timer puts
before each sample, so the total is not the row's `ms`. Launches of one name add up (a
layer's projections that one kernel runs are one row). A launch that overlaps another (one
with programmatic dependent launch waits inside itself for the grid before; a side stream
runs beside the main one) counts its whole span, so a change to one kernel can show in its
neighbour too, and the total can exceed the call's time. GPU only: on a CPU the call
launches no kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.autograd import DeviceType

from workbench.analysis.tables import TOTAL, short_kernel_name

CALLS = 20  # profiled calls: enough for a stable mean of microsecond kernels, seconds at most
NAME_CHARS = 80  # a kernel's name shown this long at most (cuBLAS's run to hundreds)


def kernel_ms(call: Callable[[], object], device: torch.device, units: int = 1,
              calls: int = CALLS) -> dict[str, float]:  # fmt: skip
    """The mean device time, in ms per call and unit (a call of `units` layer copies counts
    each once), of each kernel `call` launches, by name, and their total (TOTAL); {} off a GPU.
    The call runs `calls` times, eagerly, after one unprofiled run."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize(device)
    return per_call(((e.name, e.device_time_total) for e in prof.events()
                     if e.device_type == DeviceType.CUDA), calls * units)  # fmt: skip


def per_call(launches: Iterable[tuple[str, float]], calls: int) -> dict[str, float]:
    """(kernel name, device us) of every launch -> ms per call by name, the longest first, and
    their total; names as the profile's tables show them (`tables.short_kernel_name`), so
    one whose templates or parameters are all that differs counts as one."""
    summed: dict[str, float] = {}
    for name, us in launches:
        key = short_kernel_name(name, NAME_CHARS)
        summed[key] = summed.get(key, 0.0) + us
    out = {k: us / calls / 1e3 for k, us in sorted(summed.items(), key=lambda kv: -kv[1])}
    return {**out, TOTAL: sum(out.values())} if out else {}
