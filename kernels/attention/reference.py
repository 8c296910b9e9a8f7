"""Torch references for indexer-driven sparse attention (one shared latent KV head, as in MLA).

The real shapes (Q=4096 queries against L=34000 keys) make full (Q, h, L) or (Q, heads, n_sel, D)
intermediates too large, so the functions work on blocks of queries.
"""

import torch
from torch import Tensor


def _causal_extent(query_pos: Tensor | None, length: int) -> int:
    """Keys a block of causal queries can see: up to its latest position. Read on the CPU only,
    where the references are the model's attention and the tail is most of the work (a
    4096-query prefill chunk early in a 33,863-token prompt sees a fraction of the keys); on a
    GPU reading it would sync with the host, which a CUDA-graph capture forbids."""
    if query_pos is None or query_pos.device.type != "cpu" or query_pos.numel() == 0:
        return length
    return max(0, min(length, int(query_pos.max()) + 1))


def indexer_scores(
    q_idx: Tensor,
    weights: Tensor,
    k_idx: Tensor,
    query_pos: Tensor | None = None,
    query_block: int = 512,
) -> Tensor:
    """Indexer score of every key for every query, (Q, L) float32.

    score[q, j] = sum_h weights[q, h] * relu(q_idx[q, h] . k_idx[j]). The dot products run in the
    input dtype; the weighted head sum runs in fp32. With `query_pos` (Q,), the scores are
    causal: keys after a query's position score -inf (a kernel skips them).
    """
    num_q, heads, dim = q_idx.shape
    if weights.shape != (num_q, heads) or k_idx.dim() != 2 or k_idx.shape[1] != dim:
        raise ValueError(
            f"indexer_scores expects q_idx (Q, h, d), weights (Q, h), k_idx (L, d); got "
            f"{tuple(q_idx.shape)}, {tuple(weights.shape)}, {tuple(k_idx.shape)}"
        )
    scores = torch.empty(num_q, k_idx.shape[0], dtype=torch.float32, device=q_idx.device)
    for start in range(0, num_q, query_block):
        stop = min(start + query_block, num_q)
        seen = k_idx.shape[0] if query_pos is None else (
            _causal_extent(query_pos[start:stop], k_idx.shape[0]))  # fmt: skip
        dots = torch.relu(torch.matmul(q_idx[start:stop], k_idx[:seen].T))  # (b, h, seen)
        head_weights = weights[start:stop, None, :].float()  # (b, 1, h)
        scores[start:stop, :seen] = torch.matmul(head_weights, dots.float()).squeeze(1)
        scores[start:stop, seen:] = float("-inf")  # no query of the block sees these
    if query_pos is not None:
        keys = torch.arange(k_idx.shape[0], device=scores.device)
        future = keys[None, :] > query_pos.to(scores.device)[:, None]
        scores.masked_fill_(future, float("-inf"))
    return scores


def select_positions(scores: Tensor, query_pos: Tensor, topk: int, window: int) -> Tensor:
    """Key positions each query attends to, (Q, topk + window) int64 with -1 for unused slots.

    The first `topk` columns are the best-scoring positions j <= p - window (strictly before the
    local window), best first; the last `window` columns are p, p-1, ..., p-window+1. Positions
    outside [0, L) and future positions (j > p) are never returned.
    """
    num_q, length = scores.shape
    pos = query_pos.to(device=scores.device, dtype=torch.int64)[:, None]  # (Q, 1)

    recent = pos - torch.arange(window, device=scores.device)  # (Q, window)
    recent = recent.masked_fill((recent < 0) | (recent >= length), -1)

    last_sparse = pos - window  # latest position the top-k part may pick
    seen = max(min(topk, length), _causal_extent(query_pos, length))  # topk needs topk columns
    keys = torch.arange(seen, device=scores.device)
    candidates = scores[:, :seen].masked_fill(keys > last_sparse, float("-inf"))
    picked = candidates.topk(min(topk, length), dim=-1).indices
    # Fewer than topk candidates: topk has filled the tail with masked positions; drop them.
    picked = picked.masked_fill(picked > last_sparse, -1)
    missing = topk - picked.shape[1]
    padding = torch.full((num_q, missing), -1, dtype=torch.int64, device=scores.device)
    return torch.cat([picked, padding, recent], dim=1)


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
