"""The stock schedule with taller row tiles: `rows` x 16 rows per tile (16, 32 or 64).

Same kernels as kernels.moe.stock (BLOCK_M is their parameter), so a profile of multirow
against stock isolates one change: each weight tile loaded from memory now feeds more token
rows, which matters once experts receive more than 16 rows (prefill), and costs padding waste
when they receive fewer (decode).
"""

from torch import Tensor

from kernels.compiled import recording
from kernels.moe.formats import MoeWeights
from kernels.moe.launch import prepare
from kernels.moe.stock import STOCK_TILES, run_stock

ROWS = (1, 2, 4)


def moe_multirow(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor,
    w_down: Tensor | None = None,
    *,
    rows: int = 2,
    groups: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    split_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    swap_ab: bool | None = None,
) -> Tensor:
    """Routed-expert output (T, H) in x.dtype, like moe_stock with 16 * rows rows per tile.

    rows=1 is exactly moe_stock. Kernel facts of the call: kernels.moe.last_facts().
    """
    if rows not in ROWS:
        raise ValueError(f"rows={rows!r} must be one of {ROWS} (16-, 32- or 64-row tiles).")
    with recording():
        weights, shape, tiles = prepare(
            x,
            topk_ids,
            topk_weights,
            weights,
            w_down,
            STOCK_TILES,
            block_m=16 * rows,
            block_n=block_n,
            block_k=block_k,
            split_k=split_k,
            num_warps=num_warps,
            num_stages=num_stages,
            swap_ab=swap_ab,
        )
        return run_stock(x, topk_ids, topk_weights, weights, shape, tiles, groups)
