"""Programmatic dependent launch (PDL) for decode-size GEMMs, whose weights do not depend on
the kernel before them.

A decode layer is a chain of small GEMMs, each a few microseconds of weight streaming, and
between two of them the GPU idles: the next grid launches only when the last block of the one
before has finished, then its blocks ramp up their loads. With PDL (Hopper's
griddepcontrol, `launch_pdl=True`) the next grid launches while the one before still runs;
its blocks ask L2 for the first K tiles of their weights (one bulk prefetch a weight row), then
wait (`griddepcontrol.wait`) until the grid before has finished and its writes are visible, and
only then read their activations. So the weight stream of one GEMM overlaps the tail of the
other. A block lets the next grid launch once its main loop is done. A kernel launched after
one that does not use PDL waits for it to finish, as usual; a CUDA graph keeps the early
launches (programmatic edges). The Gluon W8A16 kernel (kernels.dense.w8a16_wgmma) takes the
same option with its own order: its programs start their first ring slot's weight copy by
TMA and load their scales before the wait, and let the next grid launch once all of them are
resident (one holds a whole SM, so the next grid can only take the SMs this one has left).

Measured on the H200, it is an option, not a default: six back-to-back W8A16 GEMMs of a layer
took up to 5% less time with it at 1-16 rows (the Triton kernel) and 4-12% at 48-256 (the
Gluon kernel), but in the served profile, where a norm or a torch op comes before most W8A16
GEMMs, a decode step took 0.30 ms longer with the Triton kernel's (one comparison across runs)
and 1.7% longer with the Gluon kernel's at 64 rows (an A/B; kernels.dense.w8a16_wgmma). A trace
of a PDL kernel shows its wait inside its span; the kernel tables cut it off (`waited_us`).

The PTX runs on Hopper and newer only; under TRITON_INTERPRET and on older GPUs the kernels
take `enabled() == False` and launch as before.
"""

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels.compiled import interpreting

PREFETCH_ALIGN = 16  # cp.async.bulk.prefetch takes 16-byte aligned addresses and sizes


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: a Hopper or newer GPU, not the interpreter."""
    if interpreting() or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def check_option(pdl: object) -> None:
    """Refuse a `pdl` option that is not True, False or None (where available)."""
    if pdl is not None and not isinstance(pdl, bool):
        raise ValueError(f"pdl={pdl!r} must be True, False or None (where available).")


def launches_with_pdl(pdl: bool | None, device: torch.device) -> bool:
    """Whether a kernel with the `pdl` option launches with PDL on `device`: `pdl`, or where
    available when None; True where there is none is an error that names the fix. False
    (every default) asks nothing of the device: it is on every GEMM launch's path."""
    if pdl is False:
        return False
    available = enabled(device)
    if pdl and not available:
        raise ValueError(
            f"pdl=True needs a Hopper or newer GPU outside the Triton interpreter; {device} "
            f"has none. Pass pdl=None to use it where available."
        )
    return available if pdl is None else pdl


def prefetchable(*strides_and_offsets: int) -> bool:
    """Whether weight rows starting at these byte strides and offsets stay 16-byte aligned, as
    the bulk prefetch needs (a data pointer, the row stride, a group's stride)."""
    return all(value % PREFETCH_ALIGN == 0 for value in strides_and_offsets)


@triton.jit
def prefetch_rows_to_l2(row_ptrs, nbytes):
    """Ask L2 for `nbytes` (rounded down to 16) from each of `row_ptrs`: one bulk prefetch a
    row, nothing where nbytes is 0 (rows past the matrix). Returns a dummy to keep it live."""
    return tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        setp.gt.s32 p, $2, 0;
        @p cp.async.bulk.prefetch.L2.global [$1], $2;
        mov.b32 $0, 0;
        }""",
        "=r,l,r",
        [row_ptrs, nbytes & -16],  # PREFETCH_ALIGN
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def wait_for_grid_before():
    """griddepcontrol.wait for Gluon kernels (Triton's `gdc_wait` is for Triton's language):
    until the grid before has finished and its writes are visible. Returns a dummy."""
    return gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [],
                                     dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip


@gluon.jit
def let_next_grid_launch():
    """griddepcontrol.launch_dependents for Gluon kernels: the next grid may launch once every
    program of this one has passed here or exited. Returns a dummy."""
    return gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                     dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip
