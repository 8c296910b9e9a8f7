"""The order of K that the Gluon W8A16 kernel (`w8a16_wgmma`) reads FP8 weights in.

wgmma takes a register operand in a fixed layout: a thread holds, for each 16-wide slice of K,
the value pairs at 2c and 2c + 8 (c = its lane mod 4). In nn.Linear's order those pairs lie
two bytes apart from the next ones, so the kernel loaded a K step's 64 bytes a row-pair as 32
two-byte shared loads, each with its own address arithmetic. With each 64-wide slice of K
reordered so that a thread's 16 values of a row are contiguous, they are one 16-byte load:

    stored column  q*64 + c*16 + j*4 + h*2 + b   holds   K index  q*64 + j*16 + h*8 + c*2 + b

for slice q, lane c in [0, 4), 16-wide slice j in [0, 4), half h and pair element b in [0, 2).
A sum over K does not depend on the order of its terms, so the kernel reads the activations as
they are and relabels the weights it loaded in registers (no data moves). Marlin repacks its
weights once for the same reason. The reorder stays inside 64-column slices, so the 128 x 128
scale blocks are unchanged.

The copy is made on a weight's first use by the kernel and kept while the weight lives, beside
the nn.Linear-ordered values the other kernels read: a served model would store one of them.
"""

import weakref

import torch
from torch import Tensor

SLICE = 64  # the reordered width of K: a thread's 16 bytes of a row


def reorder_k(values: Tensor) -> Tensor:
    """A contiguous copy of FP8 `values` (R, K), K a multiple of SLICE, in the kernel's order."""
    rows, k = values.shape
    if k % SLICE:
        raise ValueError(f"the wgmma K order needs K a multiple of {SLICE}, got {k}.")
    # K index q*64 + j*16 + h*8 + c*2 + b as (q, j, h, c, b), stored as (q, c, j, h, b)
    split = values.reshape(rows, k // SLICE, 4, 2, 4, 2)
    return split.permute(0, 1, 4, 2, 3, 5).reshape(rows, k).contiguous()


_copies: dict[tuple[int, int], Tensor] = {}


def has_reordered(values: Tensor, rows: int) -> bool:
    """Whether `reordered(values, rows)` has its copy already (else it makes it now)."""
    return (id(values), rows) in _copies


def reordered(values: Tensor, rows: int) -> Tensor:
    """`reorder_k` of the first `rows` rows at `values`' stride from its first element (a
    group's members lie one after another), made once for each (values, rows) and dropped
    when `values` is freed.

    Made inside a CUDA graph's capture, the copy would be a kernel of the graph and its memory
    the graph's, so it is refused there: one call before the capture makes it."""
    key = (id(values), rows)
    if key not in _copies:
        if values.is_cuda and torch.cuda.is_current_stream_capturing():
            raise ValueError(
                "the W8A16 wgmma kernel's first call on a weight makes the weight's K-ordered "
                "copy (kernels.dense.k_order), which a CUDA graph capture cannot hold; call it "
                "once before capturing, as a warm-up does."
            )
        view = values.as_strided((rows, values.shape[1]), values.stride())
        _copies[key] = reorder_k(view)
        weakref.finalize(values, _copies.pop, key, None)
    return _copies[key]
