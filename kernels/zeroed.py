"""Counters and sums kept at zero between kernel calls, one buffer per device.

Some kernels count or add across their programs into a buffer and leave it at zero when they
finish (the dense split-K arrival counters, the decode select's running totals). One buffer
per device then serves every call on its stream, and a CUDA graph replays those kernels
without a memset launch. The buffer is made, or grown, by the first call that needs that
many rows on the device, which in practice runs eagerly (a check or a warm-up) before any
graph capture. A buffer that is outgrown is kept, not freed: a graph captured with it may
still be replayed, and its kernels would otherwise write into memory that is no longer theirs.
"""

import torch
from torch import Tensor

_outgrown: list[Tensor] = []  # buffers a larger one replaced, kept for the graphs that hold them


def kept_zeros(
    store: dict[torch.device, Tensor],
    rows: int,
    device: torch.device,
    row_shape: tuple[int, ...] = (),
    least_rows: int = 0,
) -> Tensor:
    """The first `rows` rows of `store`'s int32 zeros on `device`, each `row_shape`, made with
    at least `least_rows` rows when it has to be made."""
    held = store.get(device)
    if held is None or held.shape[0] < rows:
        if held is not None:
            _outgrown.append(held)
        held = store[device] = torch.zeros(
            max(rows, least_rows), *row_shape, dtype=torch.int32, device=device
        )
    return held[:rows]
