"""The lightning indexer as one Triton kernel: every query's score against every cached key.

score[q, j] = sum_h w[q, h] * relu(q_idx[q, h] . k[j]). The kernel flattens (query, head) into
the rows of one MMA, so a decode query with 64 heads already fills a 64-row tile (16 would
waste three quarters of it), then sums each query's head rows. Each program keeps its query
tile while it walks a run of key blocks, so queries are read once per run, not once per block.
With query positions given, it is causal: key blocks wholly after a tile's last query are not
multiplied at all (the first prefill chunk skips half its work) and score -inf like the
reference. Scores and the top-k that follows stay in fp32.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.attention.formats import score_rows
from kernels.compiled import launch, recording
from kernels.moe.routing import dot_options, planned_sms

DECODE_QUERIES = 4  # at or below: one query per tile, one key block per program


@triton.jit
def _indexer_kernel(
    q_ptr, w_ptr, k_ptr, pos_ptr, shift_ptr, out_ptr, Q, L, split, keys_per_program,
    stride_qq, stride_qh, stride_wq, stride_wh, stride_kl, stride_oq,
    HEADS: tl.constexpr, DIM: tl.constexpr, HEADS_P: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, CAUSAL: tl.constexpr,
    SHIFTED: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    q0 = tl.program_id(0) * BLOCK_Q
    r = tl.arange(0, BLOCK_Q * HEADS_P)
    row_query = (q0 + r // HEADS_P).to(tl.int64)
    row_head = r % HEADS_P
    row_ok = (row_query < Q) & (row_head < HEADS)
    d = tl.arange(0, BLOCK_D)
    qh = tl.load(
        q_ptr + row_query[:, None] * stride_qq + row_head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & (d < DIM)[None, :], other=0.0,
    )  # fmt: skip
    w = tl.load(w_ptr + row_query * stride_wq + row_head * stride_wh, mask=row_ok, other=0.0)
    if UPCAST:
        qh = qh.to(tl.float32)
    queries = (q0 + tl.arange(0, BLOCK_Q)).to(tl.int64)
    query_ok = queries < Q
    if CAUSAL:
        pos = tl.load(pos_ptr + queries, mask=query_ok, other=-1)
        last = tl.max(pos, axis=0)
    else:
        last = L
    shift = tl.load(shift_ptr + q0) if SHIFTED else 0
    start = tl.program_id(1) * keys_per_program
    for l0 in range(start, tl.minimum(start + keys_per_program, L), BLOCK_L):
        keys = l0 + tl.arange(0, BLOCK_L)
        key_ok = keys < L
        out_ptrs = out_ptr + queries[:, None] * stride_oq + keys[None, :]
        out_mask = query_ok[:, None] & key_ok[None, :]
        if l0 <= last:
            rows = keys.to(tl.int64)
            if SHIFTED:
                rows = tl.where(keys >= split, rows + shift, rows)
            k = tl.load(k_ptr + rows[:, None] * stride_kl + d[None, :],
                        mask=key_ok[:, None] & (d < DIM)[None, :], other=0.0)  # fmt: skip
            if UPCAST:
                k = k.to(tl.float32)
            dots = tl.dot(qh, tl.trans(k), input_precision=PRECISION)  # (rows, BLOCK_L) fp32
            heads = tl.maximum(dots, 0.0) * w[:, None]
            scores = tl.sum(tl.reshape(heads, (BLOCK_Q, HEADS_P, BLOCK_L)), axis=1)
            if CAUSAL:
                scores = tl.where(keys[None, :] <= pos[:, None], scores, float("-inf"))
            tl.store(out_ptrs, scores, mask=out_mask)
        else:
            tl.store(out_ptrs, tl.full((BLOCK_Q, BLOCK_L), float("-inf"), tl.float32), out_mask)


def keys_per_program_for(
    length: int, block_l: int, q_tiles: int, device: torch.device, most_blocks: int = 16
) -> int:
    """Keys one indexer program scores: one key block until there are programs enough for
    four per SM, then a run of up to `most_blocks` blocks (a query tile is read once per
    run)."""
    sms = planned_sms(device)
    return max(1, min(most_blocks, triton.cdiv(length, block_l) * q_tiles // (4 * sms))) * block_l


def _check(q_idx: Tensor, weights: Tensor, k_idx: Tensor, query_pos: Tensor | None) -> None:
    num_q, heads, dim = q_idx.shape if q_idx.dim() == 3 else (None, None, None)
    if (
        num_q is None
        or weights.shape != (num_q, heads)
        or k_idx.dim() != 2
        or k_idx.shape[1] != dim
        or (query_pos is not None and query_pos.shape != (num_q,))
    ):
        raise ValueError(
            f"indexer_scores expects q_idx (Q, h, d), weights (Q, h), k_idx (L, d) and "
            f"query_pos (Q,) or None; got {tuple(q_idx.shape)}, {tuple(weights.shape)}, "
            f"{tuple(k_idx.shape)}, {None if query_pos is None else tuple(query_pos.shape)}"
        )
    if num_q == 0 or k_idx.shape[0] == 0:
        raise ValueError("indexer_scores needs at least one query and one key.")
    if q_idx.dtype != k_idx.dtype or not q_idx.is_floating_point():
        raise ValueError(
            f"q_idx and k_idx must share a float dtype, got {q_idx.dtype} and {k_idx.dtype}."
        )


def indexer_scores_triton(
    q_idx: Tensor,
    weights: Tensor,
    k_idx: Tensor,
    query_pos: Tensor | None = None,
    length: int | None = None,
    split: int | None = None,
    shift: Tensor | None = None,
    block_l: int = 64,
    num_warps: int | None = None,
) -> Tensor:
    """Indexer scores (Q, length) fp32, as `reference.indexer_scores` defines them (causal when
    `query_pos` is given; `length`, `split` and `shift` as there). q_idx and weights are read
    through their strides; rows of k_idx must be contiguous."""
    _check(q_idx, weights, k_idx, query_pos)
    (num_q, heads, dim), length = q_idx.shape, length or k_idx.shape[0]
    if (split is None) != (shift is None):
        raise ValueError("give split and shift together, or neither.")
    if q_idx.stride(2) != 1 or k_idx.stride(1) != 1:
        raise ValueError("q_idx and k_idx must be contiguous along d; call .contiguous().")
    heads_p = triton.next_power_of_2(heads)
    # Rows of one MMA are (query, head) pairs: at least 16 of them, two queries for prefill.
    block_q = max(1 if num_q <= DECODE_QUERIES else 2, triton.cdiv(16, heads_p))
    if shift is not None:  # a tile of one query (its own rows), padded to 16 MMA rows
        block_q, heads_p = 1, max(16, heads_p)
    block_d = max(16, triton.next_power_of_2(dim))
    q_tiles = triton.cdiv(num_q, block_q)
    keys_per_program = keys_per_program_for(length, block_l, q_tiles, q_idx.device)
    scores = score_rows(num_q, length, q_idx.device)
    precision, upcast = dot_options(q_idx.dtype)
    rows = block_q * heads_p
    grid = (q_tiles, triton.cdiv(length, keys_per_program))
    with recording():
        launch(
            _indexer_kernel, grid, q_idx, weights, k_idx,
            q_idx if query_pos is None else query_pos, q_idx if shift is None else shift,
            scores, num_q, length, length if split is None else split, keys_per_program,
            q_idx.stride(0), q_idx.stride(1), *weights.stride(), k_idx.stride(0),
            scores.stride(0), HEADS=heads, DIM=dim, HEADS_P=heads_p, BLOCK_Q=block_q,
            BLOCK_D=block_d, BLOCK_L=block_l, CAUSAL=query_pos is not None,
            SHIFTED=shift is not None, PRECISION=precision,
            UPCAST=upcast, num_warps=num_warps or (8 if rows >= 128 else 4), num_stages=2,
        )  # fmt: skip
    return scores
