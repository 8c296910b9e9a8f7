"""Groups of projections: y = cat_g(x[:, g] @ W_g.T) for x (M, G, K) and G weights of one
shape, as DeepSeek-V4's grouped output projection (o_a) runs over the heads' groups.

Run one by one, a group costs G launches and a concatenation. At decode sizes a launch costs
more than its bytes: on the H200 each of o_a's four 1024 x 4096 W8A16 GEMMs took 10.4 us
alone at M=1 for 4 MB of weights (a few us at the copy bandwidth). So each variant that can
runs a group as one launch: W8A16 with the group as a grid axis, bf16 as one cuBLAS batched
GEMM, the hybrid by its row threshold. Variants without one (W8A8, a peer's kernel) run the
members one by one and concatenate, as before.
"""

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor

from kernels.dense.formats import stacked_stride
from kernels.dense.hybrid import hybrid_threshold
from kernels.dense.w8a8 import linear_w8a8
from kernels.dense.w8a16 import linear_w8a16_group


def one_by_one(linear: Callable, x: Tensor, group: Sequence) -> Tensor:
    """The group through `linear(x_g, W_g)` member by member, concatenated."""
    return torch.cat([linear(x[:, g], w) for g, w in enumerate(group)], 1)


def linear_bf16_group(x: Tensor, group: Sequence[Tensor]) -> Tensor:
    """One batched cuBLAS GEMM over bf16 weights stacked at one stride (`stacked_stride`)."""
    step = stacked_stride(list(group))
    if step is None or x.dim() != 3 or x.shape[1] != len(group):
        raise ValueError(
            f"a bf16 group needs x (M, G={len(group)}, K) and weights of one shape stacked at "
            "one stride; build them with torch.stack(weights).unbind()."
        )
    first = group[0]
    weights = first.as_strided((len(group), *first.shape), (step, *first.stride()))
    y = torch.bmm(x.transpose(0, 1), weights.transpose(1, 2))  # (G, M, N)
    return y.transpose(0, 1).reshape(x.shape[0], -1)


def linear_hybrid_group(
    x: Tensor, group: Sequence, hybrid_m: int | None = None, pdl: bool | None = False
) -> Tensor:
    """The W8A16 group launch up to the hybrid's row threshold (with `pdl`, as
    `linear_hybrid` takes it), W8A8 member by member above."""
    if x.shape[0] <= hybrid_threshold(hybrid_m):
        return linear_w8a16_group(x, group, pdl=pdl)
    return one_by_one(linear_w8a8, x, group)


GROUP_VARIANTS: dict[str, Callable] = {
    "bf16": linear_bf16_group,
    "w8a16": linear_w8a16_group,
    "hybrid": linear_hybrid_group,
}


def group_linear(variant: str, linear: Callable, **options: object) -> Callable:
    """`(x, group) -> y` for a dense variant: its one-launch form where it has one (with
    `options`, e.g. hybrid_m), else `linear` member by member."""
    grouped = GROUP_VARIANTS.get(variant)
    if grouped is None:
        return partial(one_by_one, linear)
    return partial(grouped, **options) if options else grouped
