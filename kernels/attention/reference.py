"""Torch references for indexer-driven sparse attention (one shared latent KV head, as in MLA).

The real shapes (Q=4096 queries against L=34000 keys) make full (Q, h, L) or (Q, heads, n_sel, D)
intermediates too large, so the functions work on blocks of queries.
"""

import torch
from torch import Tensor

from kernels.attention.formats import QuantizedKeys
from kernels.dense.reference import quantize_activations_reference


def _causal_extent(query_pos: Tensor | None, length: int) -> tuple[int, int]:
    """(first key some query of a causal block cannot see, keys the block can see): past keys
    before the first, future ones from the second. Read on the CPU only, where the references
    are the model's attention and the tail is most of the work (a 4096-query prefill chunk
    early in a 33,863-token prompt sees a fraction of the keys, and only the keys between the
    two need a causal mask); on a GPU reading them would sync with the host, which a CUDA-graph
    capture forbids: (0, length) there."""
    if query_pos is None or query_pos.device.type != "cpu" or query_pos.numel() == 0:
        return 0, length
    seen = max(0, min(length, int(query_pos.max()) + 1))
    return min(seen, max(0, int(query_pos.min()) + 1)), seen


def cache_rows(positions: Tensor, split: int | None, shift: Tensor | None) -> Tensor:
    """Cache rows of (Q, n) per-query positions: from `split` on, a query's positions read rows
    `shift[q]` further on (a decode stream's own tail, after the prompt); -1 stays -1."""
    if shift is None:
        return positions
    moved = positions + shift.to(positions.device)[:, None]
    return torch.where(positions >= split, moved, positions)


FEW_HEADS = 4  # up to this many, the head sum is a few fused multiply-adds into the output


def _weighted_head_sum(dots: Tensor, weights: Tensor, out: Tensor) -> None:
    """out[q, j] = sum_h weights[q, h] * dots[q, h, j], written into `out` (a strided view).

    A few heads (the CPU `tiny` preset's two) as multiply-adds straight into `out`: a batched
    matrix product with an inner dimension of two, then a copy into the view, took three
    times as long on two CPU cores. Many heads as that product."""
    if dots.shape[1] > FEW_HEADS:
        out.copy_(torch.matmul(weights[:, None, :], dots).squeeze(1))
        return
    torch.mul(dots[:, 0], weights[:, :1], out=out)
    for h in range(1, dots.shape[1]):
        out.addcmul_(dots[:, h], weights[:, h : h + 1])


def indexer_scores(
    q_idx: Tensor,
    weights: Tensor,
    k_idx: Tensor,
    query_pos: Tensor | None = None,
    length: int | None = None,
    split: int | None = None,
    shift: Tensor | None = None,
    query_block: int | None = None,
) -> Tensor:
    """Indexer score of every key for every query, (Q, length) float32.

    score[q, j] = sum_h weights[q, h] * relu(q_idx[q, h] . k_idx[j]). The dot products run in the
    input dtype; the weighted head sum runs in fp32. With `query_pos` (Q,), the scores are
    causal: keys after a query's position score -inf (a kernel skips them). `length` defaults
    to the keys held; with `split` and `shift` (Q,), query q's positions from `split` on read
    key rows `shift[q]` further on (`cache_rows`).

    Queries go in blocks of `query_block`: 512 on a GPU, 64 on a CPU, where a 4096-query chunk
    at 33.9K context took 0.34 s against 0.62 at 512 on two cores (the (block, heads, keys)
    products are read and written several times over, and smaller ones stay nearer the core).
    """
    query_block = query_block or (64 if q_idx.device.type == "cpu" else 512)
    num_q, heads, dim = q_idx.shape
    if weights.shape != (num_q, heads) or k_idx.dim() != 2 or k_idx.shape[1] != dim:
        raise ValueError(
            f"indexer_scores expects q_idx (Q, h, d), weights (Q, h), k_idx (L, d); got "
            f"{tuple(q_idx.shape)}, {tuple(weights.shape)}, {tuple(k_idx.shape)}"
        )
    length = length or k_idx.shape[0]
    if shift is not None:  # decode: a handful of queries, each over its own rows
        positions = torch.arange(length, device=k_idx.device).expand(num_q, length)
        rows = cache_rows(positions, split, shift)
        return torch.cat([
            indexer_scores(q_idx[i : i + 1], weights[i : i + 1], k_idx[rows[i]],
                           None if query_pos is None else query_pos[i : i + 1])
            for i in range(num_q)
        ])  # fmt: skip
    k_idx = k_idx[:length]
    scores = torch.empty(num_q, length, dtype=torch.float32, device=q_idx.device)
    for start in range(0, num_q, query_block):
        stop = min(start + query_block, num_q)
        block_pos = None if query_pos is None else query_pos[start:stop].to(scores.device)
        seen = _causal_extent(block_pos, length)[1]  # keys after `seen` are left unset here
        # Contiguous queries fold into one matrix product (a strided view would go batched).
        queries = q_idx[start:stop].contiguous()
        dots = torch.relu_(torch.matmul(queries, k_idx[:seen].T))  # (b, h, seen)
        _weighted_head_sum(dots.float(), weights[start:stop].float(), scores[start:stop, :seen])
    if query_pos is not None:  # one mask for the call: fewer ops for a profile to record
        query_pos = query_pos.to(scores.device)
        past = _causal_extent(query_pos, length)[0]  # keys from here on are some query's future
        keys = torch.arange(past, length, device=scores.device)
        scores[:, past:].masked_fill_(keys[None, :] > query_pos[:, None], float("-inf"))
    return scores


def indexer_scores_fp8(
    q_idx: Tensor,
    weights: Tensor,
    keys: QuantizedKeys,
    query_pos: Tensor | None = None,
    length: int | None = None,
    split: int | None = None,
    shift: Tensor | None = None,
) -> Tensor:
    """What the FP8 indexer computes, in fp32: queries quantised per (query, head) row with a
    power-of-two scale, as the kernel does, against the dequantised FP8 keys."""
    num_q, heads, dim = q_idx.shape
    values, scales = quantize_activations_reference(q_idx.reshape(-1, dim), dim)
    q_dequantized = (values.float() * scales).view(num_q, heads, dim)
    return indexer_scores(q_dequantized, weights.float(), keys.dequantize(), query_pos,
                          length=length, split=split, shift=shift)  # fmt: skip


def _top_candidates(scores: Tensor, last: Tensor, k: int, common: int) -> Tensor:
    """Column indices of each row's k best scores among columns j <= last[row], best first.

    Columns before `common` are candidates of every row: they are ranked where they lie, and
    only the columns from there on are copied to be masked (on a CPU prefill chunk a tenth of
    the row), then the two rankings merge."""
    band = scores[:, common:]
    keys = torch.arange(common, common + band.shape[1], device=scores.device)
    values, picked = band.masked_fill(keys > last, float("-inf")).topk(
        min(k, band.shape[1]), dim=-1
    )
    picked = picked + common
    if common == 0:
        return picked
    shared_values, shared = scores[:, :common].topk(min(k, common), dim=-1)
    order = torch.cat([shared_values, values], 1).topk(k, dim=-1).indices
    return torch.cat([shared, picked], 1).gather(1, order)


def select_positions(
    scores: Tensor,
    query_pos: Tensor,
    topk: int,
    window: int,
    split: int | None = None,
    shift: Tensor | None = None,
) -> Tensor:
    """Key positions each query attends to, (Q, topk + window) int64 with -1 for unused slots.

    The first `topk` columns are the best-scoring positions j <= p - window (strictly before the
    local window), best first; the last `window` columns are p, p-1, ..., p-window+1. Positions
    outside [0, L) and future positions (j > p) are never returned. With `split` and `shift`,
    they come back as cache rows (`cache_rows`).
    """
    num_q, length = scores.shape
    pos = query_pos.to(device=scores.device, dtype=torch.int64)[:, None]  # (Q, 1)

    recent = pos - torch.arange(window, device=scores.device)  # (Q, window)
    recent = recent.masked_fill((recent < 0) | (recent >= length), -1)

    last_sparse = pos - window  # latest position the top-k part may pick
    past, seen = _causal_extent(None if query_pos is None else query_pos - window, length)
    seen = max(min(topk, length), seen)  # topk needs topk columns
    picked = _top_candidates(scores[:, :seen], last_sparse, min(topk, length), past)
    # Fewer than topk candidates: topk has filled the tail with masked positions; drop them.
    picked = picked.masked_fill(picked > last_sparse, -1)
    missing = topk - picked.shape[1]
    padding = torch.full((num_q, missing), -1, dtype=torch.int64, device=scores.device)
    return cache_rows(torch.cat([picked, padding, recent], dim=1), split, shift)


def sparse_attention(
    q: Tensor,
    kv: Tensor,
    index: Tensor,
    scale: float | None = None,
    query_block: int = 256,
) -> Tensor:
    """Attention of each query over the kv rows named by `index` (-1 = unused), (Q, heads, D).

    Keys and values are the same latent vector: out[q, h] = softmax_j(scale * q[q, h] . kv[i_j])
    @ kv[i_j] over the valid j, with scale defaulting to D**-0.5. Logits, softmax and the value
    sum run in fp32; a query with no valid index gets zeros rather than the NaN of an empty softmax.
    """
    num_q, heads, dim = q.shape
    if kv.dim() != 2 or kv.shape[1] != dim or index.dim() != 2 or index.shape[0] != num_q:
        raise ValueError(
            f"sparse_attention expects q (Q, heads, D), kv (N, D), index (Q, n_sel); got "
            f"{tuple(q.shape)}, {tuple(kv.shape)}, {tuple(index.shape)}"
        )
    scale = dim**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    for start in range(0, num_q, query_block):
        stop = min(start + query_block, num_q)
        idx = index[start:stop].long()
        valid = idx >= 0  # (b, n)
        selected = kv[idx.clamp(min=0)].float()  # (b, n, D)
        logits = torch.matmul(q[start:stop].float(), selected.transpose(1, 2)) * scale
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))  # (b, heads, n)
        probs = torch.softmax(logits, dim=-1)
        probs = probs.masked_fill(~valid.any(dim=1)[:, None, None], 0.0)
        out[start:stop] = torch.matmul(probs, selected).to(q.dtype)
    return out
