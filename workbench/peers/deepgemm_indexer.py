"""deepgemm_indexer: DeepGEMM's lightning-indexer kernels, peers of the workbench's FP8 indexer.

score[q, j] = sum_h w[q, h] * relu(q_idx[q, h] . k[j]), keys past a query's position -inf
(`kernels.attention.reference.indexer_scores_fp8` on FP8 keys with one scale per key).

DeepGEMM 2.8 (the one vLLM's wheel bundles) names them `fp8_fp4_mqa_logits` (prefill: keys in
one contiguous FP8 tensor, each query's keys a range [start, end)) and
`fp8_fp4_paged_mqa_logits` (decode: keys in 64-key pages of a fused FP8 cache, a block table
and a context length per query, and a schedule computed ahead by
`get_paged_mqa_logits_metadata`). Earlier releases called them `fp8_mqa_logits` and
`fp8_paged_mqa_logits` and took a `clean_logits` flag; 2.8 has neither.

On SM90 both take FP8 q with no scale of its own and fp32 per-head weights, and apply each
key's fp32 scale after the head sum. Since relu(s * x) = s * relu(x) for s > 0, a query's
per-(query, head) power-of-two scale folds into its weight, exactly (vLLM folds it the same
way): the workbench's quantisation of q (`quantize_activations_reference`, one scale per
(query, head) row) gives the FP8 q, and w * scale the weights. That and the key cast are done
once in `prepare_*`, untimed; the workbench's own FP8 indexer quantises q inside its kernel.

What DeepGEMM leaves unwritten, and the -inf this peer writes there, timed:
- prefill logits come back "compressed": row q holds keys start[q] .. end[q]-1 from column
  0. With start = 0 for every query (causal: keys [0, pos + 1)) column j is key j, as in the
  workbench; columns from end[q] on are never written (torch.empty, garbage).
- decode writes whole 256-key splits: past a query's context length, the rest of its last
  page and then page 0 again (the kernel reads page 0 for pages past the table's), then
  nothing further.
So each callable ends with one `masked_fill_` over the (Q, L) fp32 logits with a (Q, L) bool
mask made in `prepare_*`: about 9 bytes of traffic per logit (read and write 4, read the mask
1), ~1.7 GB for the 4096-query, 46K-key prefill (a few tenths of a millisecond on an H200,
next to a kernel of milliseconds) and nothing to speak of for one decode query. A server skips
it: its top-k reads only [start, end) of each row.

Shapes on SM90: 32 or 64 heads, head dim 32, 64 or 128, weights rows 16-byte aligned; any Q and
L (DeepGEMM pads its output rows to 1024 bytes, so the (Q, L) result is a strided view). Every
shape JIT-compiles through nvcc on its first call: `prepare_*` runs it once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from kernels.attention.formats import QuantizedKeys
from kernels.dense.reference import quantize_activations_reference
from workbench.peers.availability import jit_peer_available
from workbench.peers.deepgemm import INSTALL

BLOCK_KV = 64  # keys per page of the decode cache: SM90 takes 32 or 64; vLLM's indexer uses 64
SCALE_BYTES = 4  # one fp32 scale per key, after the page's FP8 values
HEADS = (32, 64)  # what SM90's kernels are built for
DIMS = (32, 64, 128)
PEER_NOTE = (
    "DeepGEMM fp8_fp4_mqa_logits (prefill) / fp8_fp4_paged_mqa_logits (decode, 64-key FP8 "
    "pages, schedule made once); q quantised to FP8 with its scales folded into the weights "
    "once outside the timed call; the -inf fill past each query's keys timed with it"
)

Logits = Callable[[], Tensor]


class IndexerOperands(NamedTuple):
    """The indexer's inputs as DeepGEMM takes them on SM90."""

    q: Tensor  # (Q, h, d) float8_e4m3fn, no scales: they are folded into the weights
    weights: Tensor  # (Q, h) fp32: index_w times that row's q scale
    keys: QuantizedKeys  # (L, d) float8_e4m3fn, (L,) fp32


def available() -> tuple[bool, str]:
    """Whether deep_gemm imports with the 2.8 names, on an SM90 GPU (Hopper): SM100 takes MX
    scales for q and bf16 weights and returns bf16, which this adapter does not pass."""
    ok, why = jit_peer_available("DeepGEMM", ("deep_gemm",), INSTALL, 9, "DeepGEMM's MQA logits")
    if not ok:
        return ok, why
    import deep_gemm

    if not hasattr(deep_gemm, "fp8_fp4_paged_mqa_logits"):
        return False, f"{why} predates fp8_fp4_mqa_logits (DeepGEMM 2.8's names): {INSTALL}"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return False, f"this adapter passes SM90's operand formats; this GPU is sm_{major}{minor}"
    return ok, why


def quantize_operands(
    index_q: Tensor, index_w: Tensor, keys: Tensor | QuantizedKeys
) -> IndexerOperands:
    """FP8 q with its scales folded into the weights, and FP8 keys (as given when already
    `QuantizedKeys`, e.g. the FP8 variant's cache), quantised as `indexer_scores_fp8` does."""
    num_q, heads, dim = index_q.shape
    if index_w.shape != (num_q, heads) or heads not in HEADS or dim not in DIMS:
        raise ValueError(
            f"DeepGEMM's indexer takes index_q (Q, h, d) with h in {HEADS} and d in {DIMS}, "
            f"index_w (Q, h); got {tuple(index_q.shape)} and {tuple(index_w.shape)}"
        )
    values, scales = quantize_activations_reference(index_q.reshape(-1, dim), dim)
    weights = index_w.float() * scales.view(num_q, heads)
    if not isinstance(keys, QuantizedKeys):
        if keys.dim() != 2 or keys.shape[1] != dim:
            raise ValueError(f"keys must be (L, {dim}); got {tuple(keys.shape)}")
        key_values, key_scales = quantize_activations_reference(keys, dim)
        keys = QuantizedKeys(key_values, key_scales[:, 0].contiguous())
    return IndexerOperands(values.view(num_q, heads, dim), weights.contiguous(), keys)


def key_ranges(pos: Tensor, length: int) -> tuple[Tensor, Tensor]:
    """Each query's keys [start, end) as DeepGEMM's (Q,) int32 `cu_seq_len_k_start/end`:
    start 0, end pos + 1 (clamped to [0, length]), so the logits are causal and column j of a
    row is key j."""
    end = (pos.long() + 1).clamp(0, length).to(torch.int32)
    return torch.zeros_like(end), end


def outside(end: Tensor, length: int) -> Tensor:
    """(Q, length) bool: True at the keys a query does not see (j >= end[q]), which the
    kernels leave unwritten or fill with page padding; made once, filled -inf per call."""
    return torch.arange(length, device=end.device)[None, :] >= end.long()[:, None]


def paged_cache(keys: QuantizedKeys, block_kv: int = BLOCK_KV) -> Tensor:
    """The fused FP8 cache `fp8_fp4_paged_mqa_logits` reads: (pages, block_kv, 1, d + 4) uint8.

    Each page is block_kv * d FP8 bytes (key-major) followed by block_kv fp32 scales; the 4-D
    view's rows are not keys, only the shape DeepGEMM checks (stride(1) == d + 4). Keys fill
    pages in order (key j at page j // block_kv); the last page is zero-padded.
    """
    values, scales = keys
    length, dim = values.shape
    pages = -(-length // block_kv)
    padded_values = torch.zeros(pages * block_kv, dim, dtype=torch.uint8, device=values.device)
    padded_values[:length] = values.view(torch.uint8)
    padded_scales = torch.zeros(pages * block_kv, dtype=torch.float32, device=values.device)
    padded_scales[:length] = scales
    per_page = (padded_values.view(pages, -1), padded_scales.view(torch.uint8).view(pages, -1))
    cache = torch.cat(per_page, dim=1)
    return cache.view(pages, block_kv, 1, dim + SCALE_BYTES)


def block_table(queries: int, pages: int, device: torch.device) -> Tensor:
    """(Q, pages) int32: every query reads the same pages 0 .. pages-1 (one sequence's keys;
    each decode query is its own batch entry, with its own context length)."""
    row = torch.arange(pages, dtype=torch.int32, device=device)
    return row.expand(queries, pages).contiguous()


def _check_pos(pos: Tensor, num_q: int) -> None:
    if pos.shape != (num_q,):
        raise ValueError(f"pos must be (Q,) = ({num_q},); got {tuple(pos.shape)}")


def prepare_prefill(
    index_q: Tensor, index_w: Tensor, keys: Tensor | QuantizedKeys, pos: Tensor
) -> Logits:
    """`fp8_fp4_mqa_logits` over all L keys, causal by each query's key range; returns a
    callable giving (Q, L) fp32 logits, -inf past pos[q]. One call compiles it, here."""
    import deep_gemm

    ops = quantize_operands(index_q, index_w, keys)
    _check_pos(pos, ops.q.shape[0])
    length = ops.keys.values.shape[0]
    start, end = key_ranges(pos.to(index_q.device), length)
    mask = outside(end, length)
    kv = (ops.keys.values.contiguous(), ops.keys.scales.float().contiguous())

    def logits() -> Tensor:
        out = deep_gemm.fp8_fp4_mqa_logits((ops.q, None), kv, ops.weights, start, end, length)
        return out.masked_fill_(mask, float("-inf"))

    logits()
    return logits


def prepare_decode(
    index_q: Tensor, index_w: Tensor, keys: Tensor | QuantizedKeys, pos: Tensor
) -> Logits:
    """`fp8_fp4_paged_mqa_logits` over a paged FP8 cache of the L keys, each query a batch
    entry (next_n = 1) with context length pos + 1; the cache, block table and schedule are made
    here. Returns a callable giving (Q, L) fp32 logits, -inf past pos[q]."""
    import deep_gemm

    ops = quantize_operands(index_q, index_w, keys)
    num_q, heads, dim = ops.q.shape
    _check_pos(pos, num_q)
    length = ops.keys.values.shape[0]
    cache = paged_cache(ops.keys)
    table = block_table(num_q, cache.shape[0], cache.device)
    _, end = key_ranges(pos.to(index_q.device), length)
    context = end.view(num_q, 1).contiguous()  # (batch, next_n) int32
    schedule = deep_gemm.get_paged_mqa_logits_metadata(context, BLOCK_KV, deep_gemm.get_num_sms())
    mask = outside(end, length)
    q = ops.q.view(num_q, 1, heads, dim)

    def logits() -> Tensor:
        out = deep_gemm.fp8_fp4_paged_mqa_logits(
            (q, None), cache, ops.weights, context, table, schedule, length
        )
        return out.masked_fill_(mask, float("-inf"))

    logits()
    return logits
