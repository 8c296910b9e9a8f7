"""The FP8 indexer with the heads summed on the CUDA cores (`head_sum="cores"` of
`indexer_scores_fp8`): one or two queries a tile, each query's heads an MMA's N of their own,
its scores of a key block one contiguous row of the output. The default kernels sum the heads
with a second, small MMA instead (`kernels.attention.indexer_fp8`)."""

import triton
import triton.language as tl
from torch import Tensor

from kernels.attention.formats import NewTokens
from kernels.attention.select_chunked import FirstRound
from kernels.fp8_quant import fp8_rows


@triton.jit
def _query_heads(q_ptr, w_ptr, query, Q, stride_qq, stride_qh, stride_wq, stride_wh,
                 HEADS: tl.constexpr, DIM: tl.constexpr, HEADS_P: tl.constexpr,
                 DIM_P: tl.constexpr):  # fmt: skip
    """One query's heads in FP8, each head quantised with its power-of-two scale, and each
    head's weight times that scale (fp32): the (HEADS_P, DIM_P) operand of its MMA."""
    h = tl.arange(0, HEADS_P)
    d = tl.arange(0, DIM_P)
    ok = (h < HEADS) & (query < Q)
    qh = tl.load(q_ptr + query * stride_qq + h[:, None] * stride_qh + d[None, :],
                 mask=ok[:, None] & (d < DIM)[None, :], other=0.0).to(tl.float32)  # fmt: skip
    q8, scale = fp8_rows(qh)
    weights = tl.load(w_ptr + query * stride_wq + h * stride_wh, mask=ok, other=0.0)
    return q8, weights.to(tl.float32) * scale


@triton.jit
def _query_scores(k8, k_scale, q8, weights, keys, pos, CAUSAL: tl.constexpr):
    """One query's scores of a key block: relu(K8 @ q8^T) (BLOCK_L, HEADS_P) from one FP8
    MMA, its heads summed with their weights in fp32 on the CUDA cores."""
    dots = tl.dot(k8, tl.trans(q8))
    scores = tl.sum(tl.maximum(dots, 0.0) * weights[None, :], axis=1) * k_scale
    if CAUSAL:
        scores = tl.where(keys <= pos, scores, float("-inf"))
    return scores


@triton.jit
def _indexer_fp8_rows_kernel(
    q_ptr, w_ptr, k_ptr, ks_ptr, pos_ptr, out_ptr, Q, V, keys_per_program, stride_qq,
    stride_qh, stride_wq, stride_wh, stride_kl, stride_oq, HEADS: tl.constexpr,
    DIM: tl.constexpr, HEADS_P: tl.constexpr, DIM_P: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_L: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """`_indexer_fp8_kernel` for one or two queries a tile with the heads summed on the CUDA
    cores instead of by a second MMA: each query's heads are an MMA's N of their own, and a
    query's scores of a key block are one contiguous row of the output."""
    qa = (tl.program_id(0) * BLOCK_Q).to(tl.int64)
    qb = qa + 1
    q8a, wa = _query_heads(q_ptr, w_ptr, qa, Q, stride_qq, stride_qh, stride_wq, stride_wh,
                           HEADS, DIM, HEADS_P, DIM_P)  # fmt: skip
    pos_a = tl.load(pos_ptr + qa) if CAUSAL else V
    last = pos_a
    if BLOCK_Q == 2:
        q8b, wb = _query_heads(q_ptr, w_ptr, qb, Q, stride_qq, stride_qh, stride_wq, stride_wh,
                               HEADS, DIM, HEADS_P, DIM_P)  # fmt: skip
        pos_b = tl.load(pos_ptr + qb, mask=qb < Q, other=-1) if CAUSAL else V
        last = tl.maximum(pos_a, pos_b)
    d = tl.arange(0, DIM_P)
    start = tl.program_id(1) * keys_per_program
    for l0 in range(start, tl.minimum(start + keys_per_program, V), BLOCK_L):
        keys = l0 + tl.arange(0, BLOCK_L)
        key_ok = keys < V
        if l0 <= last:
            rows = keys.to(tl.int64)
            k8 = tl.load(k_ptr + rows[:, None] * stride_kl + d[None, :],
                         mask=key_ok[:, None] & (d < DIM)[None, :], other=0.0)  # fmt: skip
            k_scale = tl.load(ks_ptr + rows, mask=key_ok, other=0.0)
            tl.store(
                out_ptr + qa * stride_oq + keys,
                _query_scores(k8, k_scale, q8a, wa, keys, pos_a, CAUSAL),
                mask=key_ok,
            )
            if BLOCK_Q == 2:
                tl.store(out_ptr + qb * stride_oq + keys,
                         _query_scores(k8, k_scale, q8b, wb, keys, pos_b, CAUSAL),
                         mask=key_ok & (qb < Q))  # fmt: skip
        else:
            minus_inf = tl.full((BLOCK_L,), float("-inf"), tl.float32)
            tl.store(out_ptr + qa * stride_oq + keys, minus_inf, mask=key_ok)
            if BLOCK_Q == 2:
                tl.store(out_ptr + qb * stride_oq + keys, minus_inf, mask=key_ok & (qb < Q))


def check_head_sum(
    head_sum: str,
    block_q: int | None,
    shift: Tensor | None,
    histogram: FirstRound | None,
    new: NewTokens | None,
) -> None:
    """A clear error for a head sum the kernels cannot do: the cores' kernel takes one or two
    queries a tile in the prompt's layout, and neither the select's first round nor new
    tokens."""
    if head_sum not in ("mma", "cores"):
        raise ValueError(f"head_sum must be 'mma' or 'cores'; got {head_sum!r}.")
    if head_sum != "cores":
        return
    blockers = [what for what, present in (
        (f"block_q={block_q} (it takes 1 or 2)", block_q is not None and block_q > 2),
        ("shift (the decode layout)", shift is not None),
        ("histogram", histogram is not None), ("new tokens", new is not None),
    ) if present]  # fmt: skip
    if blockers:
        raise ValueError(f"head_sum='cores' cannot take {', '.join(blockers)}; use "
                         "head_sum='mma'.")  # fmt: skip
