"""Work started on a side stream, to run beside what the current stream launches next.

Why: a few of a call's kernels do not depend on each other and none of them fills the GPU.
At prefill, `moe_w8a8`'s activation quantiser (DRAM-bound, most of the SMs) needs only x,
while the routing layout's kernels before it (a histogram, two scans, the permutation, the
row table: atomics and a few blocks each) need only the routing; one after the other they
leave the GPU part idle for both. Forked and joined by stream waits, as CUDA graphs record
them, the pair is captured as two branches of one graph too.

Off the GPU (the CPU interpreter) the work simply runs where it is called.
"""

from collections.abc import Callable

import torch
from torch import Tensor

_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream a device, made once: a new stream a call would cost a driver call."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(device=index)
    return _STREAMS[index]


class Beside:
    """`work()` started on the device's side stream after everything the current stream has
    launched so far (its inputs included); `join()` makes the current stream wait for it and
    returns its tensors."""

    def __init__(self, work: Callable[[], tuple[Tensor, ...]], device: torch.device) -> None:
        if device.type != "cuda":
            self._stream = None
            self._result = work()
            return
        self._stream = _side_stream(device)
        self._stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self._stream):
            self._result = work()

    def join(self) -> tuple[Tensor, ...]:
        if self._stream is not None:
            current = torch.cuda.current_stream(self._stream.device)
            current.wait_stream(self._stream)
            for tensor in self._result:  # made on the side stream, used and freed on this one
                tensor.record_stream(current)
        return self._result
