"""What every builder of the ncu target's workloads uses: the device, the check of a launch's
output before it is profiled, and the NVTX mark around the launch.

Kept apart from the builders (`ncu_builders` for the workbench's kernels, `ncu_peers` for the
peers'), which both use them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workbench.capture.ncu_args import Mark
from workbench.errors import WorkbenchError
from workbench.presets import get_preset
from workbench.workloads.checks import relative_error
from workbench.workloads.dense import Projection, layer_projections

DEFAULT_PROJECTION = "o_b"  # the output projection's second half, 5120 x 4096


def device_for(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise WorkbenchError(
            "no CUDA GPU is visible (torch.cuda.is_available() is False); ncu captures run on "
            "the GPU machine."
        )
    return device


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_cached_memory(device: torch.device) -> None:
    """Give the allocator's cached blocks back to the driver once the checks are done.

    The checks' references (weights dequantised to fp32) and the quantisation's temporaries
    leave tens of GB cached. ncu's kernel replay saves and restores the memory a profiled
    kernel may write on every pass, and with the card's memory full (our reading) it keeps
    those copies on the host: an INT4 MoE capture on an 80 GB H100 ran past 280 s with the
    target process at full CPU, and took 42 s once the cache was given back
    (raw/logs/h100-ncu-moe-int4-T6-*)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_output(
    call: Callable[[], torch.Tensor], reference: Callable, label: str, tolerance: float, hint: str
) -> None:
    """Raise unless `call()` matches `reference()` to `tolerance` (relative error)."""
    error = relative_error(call(), reference())
    if not error <= tolerance:  # also catches NaN
        raise WorkbenchError(
            f"{label}: output differs from its reference (relative error {error:.3g}, tolerance "
            f"{tolerance:g}); a wrong kernel is not profiled. Reproduce at small shapes with "
            f"{hint}."
        )


def marked(call: Callable[[], object], name: str) -> Callable[[Mark], None]:
    """A workload's run: `call` inside `mark(name)`."""

    def run(mark: Mark) -> None:
        with mark(name):
            call()

    return run


def dense_projection(preset: str, name: str) -> Projection:
    """The layer's dense GEMM called `name` at `preset`'s rank shapes."""
    projections = {p.name: p for p in layer_projections(get_preset(preset).rank_shapes())}
    if name not in projections:
        known = ", ".join(projections)
        raise WorkbenchError(f"unknown projection={name}; the layer's are {known}.")
    return projections[name]
