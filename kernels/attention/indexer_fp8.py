"""The lightning indexer in FP8, as DeepSeek serves it.

Keys are cached in FP8 (E4M3) with one power-of-two scale per key (`kernels.attention.key_cache`).
Queries are quantised per (query, head) row inside the indexer, and since ReLU commutes with a
positive scale, both scales leave the MMA:

    score[q, j] = ks[j] * sum_h (w[q, h] * sq[q, h]) * relu(q8[q, h] . k8[j])

The kernel puts keys on the MMA's M side and (query, head) pairs on N: S = K8 @ Q8^T is one FP8
wgmma per key block on sm_90, and the weighted head sum is a second, small MMA, relu(S) @ W,
where W (N, 16) holds each pair's weight in its query's column. A reduction across the rows of
an MMA accumulator would instead need a trip through shared memory per key block. Causal key
blocks after a tile's last query are not multiplied and score -inf.

In the prompt's layout the key blocks come by TMA (`_indexer_fp8_tma_kernel`) in two loops:
the blocks up to a tile's last query, their copies pipelined, then the -inf rest. With
pointer loads the causal test stays inside one key loop (`_indexer_fp8_kernel`, which every
layout takes), since two loops of pointer loads were pipelined but took 149 registers instead
of 100 and ran 7.0 ms against 4.7
(raw/logs/h200-tune-attention-pipelined-indexer-20261201T1406.csv); a TMA copy needs no
address registers (124). A program scores a run of up to RUN_BLOCKS key blocks, its query
tile loaded and quantised once a run. On the H200, a 4096-query prefill chunk at 46K context
(one run, raw/logs/h200-indexer-tma-runs-20261201T1640.csv): 3.90 ms by TMA in runs of up to
64 blocks, 4.51 by pointers in such runs, 4.85 by pointers in runs of 16 (the kernel before);
1.82x its floor, against 2.22x before.

With `head_sum="cores"`, `kernels.attention.indexer_fp8_rows` sums the heads on the CUDA cores
instead; `indexer_scores_fp8` says what it measured.

Decode caches are laid out as the prompt, then each stream's tail; with `split` and `shift`, a
query's virtual positions from `split` on read cache rows `shift[q]` further on, so one launch
scores a stream's prompt and its own tail together (decode tiles hold one query).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.attention.formats import NewTokens, QuantizedKeys, score_rows
from kernels.attention.indexer import DECODE_QUERIES, keys_per_program_for
from kernels.attention.indexer_fp8_rows import _indexer_fp8_rows_kernel, check_head_sum
from kernels.attention.key_cache import cache_token, quantized_key
from kernels.attention.select import high_byte_histogram
from kernels.attention.select_chunked import SELECT_CHUNK, FirstRound
from kernels.compiled import launch, recording
from kernels.fp8_quant import fp8_rows
from kernels.moe.routing import dot_options

COLUMNS = 16  # the head-sum MMA's N: at least 16 on the tensor cores
RUN_BLOCKS = 64  # key blocks a program scores at most: its query tile quantised once a run


@triton.jit
def _new_token(new_key_ptr, new_kv_ptr, rows_ptr, k_ptr, ks_ptr, kv_cache_ptr, q8, weights,
               out_ptr, q, start, end, pos, stride_nk, stride_nkv, stride_kl, stride_kvc,
               stride_oq, DIM: tl.constexpr, DIM_P: tl.constexpr, KV_DIM: tl.constexpr,
               KV_P: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """Query q's new token at position `pos`, after a program has scored keys [start, end):
    the first program stores it in the caches (its key quantised as `write_cache` does), and
    the program that scored `pos` from a cache row not yet written scores it again from
    registers. The stale score never reached the select: the query's own position is in its
    window. Kept out of the key loop, this is the tail of two programs, not work in every
    one (scoring the key from registers inside the loop made the indexer 2.1 us slower on the
    H200: raw/logs/h200-decode-attention-new-token-in-loop-*.csv)."""
    k8, scale = quantized_key(new_key_ptr + q * stride_nk, DIM, DIM_P)
    if start == 0:
        cache_token(tl.load(rows_ptr + q).to(tl.int64), k8, scale, new_kv_ptr + q * stride_nkv,
                    kv_cache_ptr, k_ptr, ks_ptr, stride_kvc, stride_kl, DIM, DIM_P, KV_DIM,
                    KV_P)  # fmt: skip
    if (start <= pos) & (pos < end):
        dots = tl.sum(q8.to(tl.float32) * k8.to(tl.float32)[None, :], axis=1)  # exact products
        relu = tl.maximum(dots, 0.0)
        if not UPCAST:  # as the MMA sees them
            relu = relu.to(tl.bfloat16).to(tl.float32)
        tl.debug_barrier()  # after the loop's store of the stale score, from other threads
        tl.store(out_ptr + q * stride_oq + pos, tl.sum(relu * weights, axis=0) * scale)


@triton.jit
def _query_tile(q_ptr, w_ptr, pos_ptr, q0, Q, V, stride_qq, stride_qh, stride_wq, stride_wh,
                HEADS: tl.constexpr, DIM: tl.constexpr, HEADS_P: tl.constexpr,
                DIM_P: tl.constexpr, BLOCK_Q: tl.constexpr, COLS: tl.constexpr,
                CAUSAL: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    """The query tile from q0 as the MMA's N side: (q8 (N, DIM_P) FP8, each (query, head)
    pair's weight times its scale (N,), the head-sum operand (N, COLS) holding them in their
    query's column, the tile's queries (COLS,), which exist, their positions, the last)."""
    n = tl.arange(0, BLOCK_Q * HEADS_P)  # the MMA's N: (query, head) pairs
    n_query = (q0 + n // HEADS_P).to(tl.int64)
    n_head = n % HEADS_P
    n_ok = (n_query < Q) & (n_head < HEADS)
    d = tl.arange(0, DIM_P)
    qh = tl.load(
        q_ptr + n_query[:, None] * stride_qq + n_head[:, None] * stride_qh + d[None, :],
        mask=n_ok[:, None] & (d < DIM)[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    q8, q_scale = fp8_rows(qh)
    w = tl.load(w_ptr + n_query * stride_wq + n_head * stride_wh, mask=n_ok, other=0.0)
    col = tl.arange(0, COLS)
    head_weights = w * q_scale
    head_sum = tl.where((n // HEADS_P)[:, None] == col[None, :], head_weights[:, None], 0.0)
    if not UPCAST:
        head_sum = head_sum.to(tl.bfloat16)
    queries = (q0 + col).to(tl.int64)
    query_ok = (col < BLOCK_Q) & (queries < Q)
    if CAUSAL:
        pos = tl.load(pos_ptr + queries, mask=query_ok, other=-1)
        last = tl.max(pos, axis=0)
    else:
        pos = queries  # unused
        last = V
    return q8, head_weights, head_sum, queries, query_ok, pos, last


@triton.jit
def _tile_scores(k8, k_scale, q8, head_sum, keys, pos, CAUSAL: tl.constexpr,
                 UPCAST: tl.constexpr):  # fmt: skip
    """A key block's scores for the query tile, (BLOCK_L, COLS) fp32: the FP8 MMA of keys and
    (query, head) pairs, its ReLU, the weighted head sum as a second MMA, the key scales, and
    -inf where a key is after its query."""
    dots = tl.dot(k8, tl.trans(q8))  # (BLOCK_L, N) fp32, FP8 wgmma
    relu = tl.maximum(dots, 0.0)
    if UPCAST:  # the interpreter's bf16 tl.dot multiplies bit patterns
        scores = tl.dot(relu, head_sum, input_precision="ieee")
    else:
        scores = tl.dot(relu.to(tl.bfloat16), head_sum)
    scores = scores * k_scale[:, None]
    if CAUSAL:
        scores = tl.where(keys[:, None] <= pos[None, :], scores, float("-inf"))
    return scores


@triton.jit
def _indexer_fp8_kernel(
    q_ptr, w_ptr, k_ptr, ks_ptr, pos_ptr, shift_ptr, out_ptr, hist_ptr, totals_ptr, Q, V, split,
    keys_per_program, window, stride_qq, stride_qh, stride_wq, stride_wh, stride_kl, stride_oq,
    new_key_ptr, new_kv_ptr, rows_ptr, kv_cache_ptr, stride_nk, stride_nkv, stride_kvc,
    HEADS: tl.constexpr, DIM: tl.constexpr, HEADS_P: tl.constexpr, DIM_P: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_L: tl.constexpr, COLS: tl.constexpr, CAUSAL: tl.constexpr,
    SHIFTED: tl.constexpr, UPCAST: tl.constexpr, HISTOGRAM: tl.constexpr, NEW: tl.constexpr,
    KV_DIM: tl.constexpr, KV_P: tl.constexpr,
):  # fmt: skip
    q0 = tl.program_id(0) * BLOCK_Q
    q8, head_weights, head_sum, queries, query_ok, pos, last = _query_tile(
        q_ptr, w_ptr, pos_ptr, q0, Q, V, stride_qq, stride_qh, stride_wq, stride_wh, HEADS, DIM,
        HEADS_P, DIM_P, BLOCK_Q, COLS, CAUSAL, UPCAST,
    )  # fmt: skip
    col = tl.arange(0, COLS)
    d = tl.arange(0, DIM_P)
    shift = tl.load(shift_ptr + q0) if SHIFTED else 0
    start = tl.program_id(1) * keys_per_program
    if HISTOGRAM:  # one query a tile: the select's first round over this program's keys
        candidates = tl.minimum(tl.maximum(tl.load(pos_ptr + q0) - window + 1, 0), V)
        counts = tl.zeros((256,), tl.int32)
    for l0 in range(start, tl.minimum(start + keys_per_program, V), BLOCK_L):
        keys = l0 + tl.arange(0, BLOCK_L)
        key_ok = keys < V
        out_ptrs = out_ptr + queries[None, :] * stride_oq + keys[:, None]
        out_mask = key_ok[:, None] & query_ok[None, :]
        if l0 <= last:
            rows = keys.to(tl.int64)
            if SHIFTED:
                rows = tl.where(keys >= split, rows + shift, rows)
            k8 = tl.load(k_ptr + rows[:, None] * stride_kl + d[None, :],
                         mask=key_ok[:, None] & (d < DIM)[None, :], other=0.0)  # fmt: skip
            k_scale = tl.load(ks_ptr + rows, mask=key_ok, other=0.0)
            scores = _tile_scores(k8, k_scale, q8, head_sum, keys, pos, CAUSAL, UPCAST)
            tl.store(out_ptrs, scores, mask=out_mask)
            if HISTOGRAM:
                mine = tl.sum(tl.where(col[None, :] == 0, scores, 0.0), axis=1)
                counts += high_byte_histogram(mine, keys < candidates)
        else:
            tl.store(out_ptrs, tl.full((BLOCK_L, COLS), float("-inf"), tl.float32), out_mask)
    if HISTOGRAM:
        chunk = q0.to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
        bins = tl.arange(0, 256)
        tl.store(hist_ptr + chunk * 256 + bins, counts)
        tl.atomic_add(totals_ptr + q0.to(tl.int64) * 256 + bins, counts, sem="relaxed")
    if NEW:  # one query a tile (q0): its new token
        if not UPCAST:
            head_weights = head_weights.to(tl.bfloat16).to(tl.float32)
        _new_token(
            new_key_ptr, new_kv_ptr, rows_ptr, k_ptr, ks_ptr, kv_cache_ptr, q8, head_weights,
            out_ptr, q0.to(tl.int64), start, tl.minimum(start + keys_per_program, V),
            tl.load(pos_ptr + q0), stride_nk, stride_nkv, stride_kl, stride_kvc, stride_oq,
            DIM, DIM_P, KV_DIM, KV_P, UPCAST,
        )  # fmt: skip


@triton.jit
def _indexer_fp8_tma_kernel(
    q_ptr, w_ptr, k_desc, ks_ptr, pos_ptr, out_ptr, Q, V, keys_per_program, stride_qq,
    stride_qh, stride_wq, stride_wh, stride_oq, HEADS: tl.constexpr, DIM: tl.constexpr,
    HEADS_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_L: tl.constexpr, COLS: tl.constexpr,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """`_indexer_fp8_kernel` for the prompt's layout, its key blocks copied by TMA: two
    loops, the key blocks up to the tile's last query (scored, their copies pipelined) and
    then the rest (-inf, nothing read), so no branch keeps the loads from being pipelined,
    and the copies need no address registers (the pointer version of two loops took 149)."""
    q0 = tl.program_id(0) * BLOCK_Q
    q8, _, head_sum, queries, query_ok, pos, last = _query_tile(
        q_ptr, w_ptr, pos_ptr, q0, Q, V, stride_qq, stride_qh, stride_wq, stride_wh, HEADS, DIM,
        HEADS_P, DIM, BLOCK_Q, COLS, CAUSAL, UPCAST,
    )  # fmt: skip
    start = tl.program_id(1) * keys_per_program
    end = tl.minimum(start + keys_per_program, V)
    scored_end = tl.minimum(end, last + 1).to(tl.int32)  # TMA offsets are 32-bit
    for l0 in range(start, scored_end, BLOCK_L):
        keys = l0 + tl.arange(0, BLOCK_L)
        key_ok = keys < V
        k_scale = tl.load(ks_ptr + keys, mask=key_ok, other=0.0)
        scores = _tile_scores(k_desc.load([l0, 0]), k_scale, q8, head_sum, keys, pos, CAUSAL,
                              UPCAST)  # fmt: skip
        tl.store(out_ptr + queries[None, :] * stride_oq + keys[:, None], scores,
                 mask=key_ok[:, None] & query_ok[None, :])  # fmt: skip
    unscored = start + tl.cdiv(tl.maximum(scored_end - start, 0), BLOCK_L) * BLOCK_L
    for l0 in range(unscored, end, BLOCK_L):
        keys = l0 + tl.arange(0, BLOCK_L)
        tl.store(out_ptr + queries[None, :] * stride_oq + keys[:, None],
                 tl.full((BLOCK_L, COLS), float("-inf"), tl.float32),
                 mask=(keys < V)[:, None] & query_ok[None, :])  # fmt: skip


def _check(q_idx: Tensor, weights: Tensor, keys: QuantizedKeys, query_pos: Tensor | None) -> None:
    if not isinstance(keys, QuantizedKeys):
        raise ValueError("the FP8 indexer reads QuantizedKeys: quantize_keys(k) or write_cache.")
    values, scales = keys
    if (
        q_idx.dim() != 3
        or weights.shape != q_idx.shape[:2]
        or values.dim() != 2
        or values.shape[1] != q_idx.shape[2]
        or scales.shape != values.shape[:1]
        or (query_pos is not None and query_pos.shape != q_idx.shape[:1])
    ):
        raise ValueError(
            f"indexer_scores_fp8 expects q_idx (Q, h, d), weights (Q, h), keys (L, d) with "
            f"scales (L,), query_pos (Q,) or None; got {tuple(q_idx.shape)}, "
            f"{tuple(weights.shape)}, {tuple(values.shape)}, {tuple(scales.shape)}, "
            f"{None if query_pos is None else tuple(query_pos.shape)}"
        )
    if values.dtype != torch.float8_e4m3fn or q_idx.stride(2) != 1 or values.stride(1) != 1:
        raise ValueError("keys must be float8_e4m3fn; q_idx and keys contiguous along d.")


def _check_new(
    new: NewTokens, num_q: int, dim: int, block_q: int, query_pos: Tensor | None, shifted: bool
) -> None:
    if block_q != 1 or query_pos is None:
        raise ValueError("writing new tokens needs causal scores (query_pos) and block_q=1.")
    if num_q > 1 and not shifted:
        raise ValueError("new tokens of several queries need the decode layout (split and "
                         "shift), where each is in its own tail: without it, another query "
                         "could read a token's row while it is being written.")  # fmt: skip
    kv_cache, rows, kv, index_k = new
    if (
        rows.shape != (num_q,)
        or rows.is_floating_point()
        or kv.shape != (num_q, kv_cache.shape[1])
        or index_k.shape != (num_q, dim)
    ):
        raise ValueError(
            f"new tokens for {num_q} queries need rows ({num_q},) of ints, kv ({num_q}, "
            f"{kv_cache.shape[1]}) and index_k ({num_q}, {dim}); got {tuple(rows.shape)} "
            f"{rows.dtype}, {tuple(kv.shape)} and {tuple(index_k.shape)}"
        )
    if kv.stride(1) != 1 or index_k.stride(1) != 1 or kv_cache.stride(1) != 1:
        raise ValueError("new tokens need kv, index_k and kv_cache contiguous along the last dim.")


def _takes_tma(
    tma: bool | None,
    keys: QuantizedKeys,
    shift: Tensor | None,
    histogram: FirstRound | None,
    new: NewTokens | None,
    head_sum: str,
) -> bool:
    """Whether the key blocks come by TMA (`indexer_scores_fp8`'s `tma`), after a clear error
    where they were asked to and cannot."""
    if tma is False:
        return False
    dim = keys.values.shape[1]
    blockers = [what for what, present in (
        ("shift (the decode layout)", shift is not None), ("histogram", histogram is not None),
        ("new tokens", new is not None), (f"head_sum={head_sum!r}", head_sum != "mma"),
        (f"a head dim of {dim} (a power of two from 16)", dim < 16 or dim & (dim - 1)),
        ("keys whose rows are not 16-byte aligned",
         keys.values.stride(0) % 16 or keys.values.data_ptr() % 16),
    ) if present]  # fmt: skip
    if blockers and tma:
        raise ValueError(f"tma=True cannot take {', '.join(blockers)}; use tma=None or False.")
    return not blockers


def indexer_scores_fp8(
    q_idx: Tensor,
    weights: Tensor,
    keys: QuantizedKeys,
    query_pos: Tensor | None = None,
    length: int | None = None,
    split: int | None = None,
    shift: Tensor | None = None,
    block_q: int | None = None,
    block_l: int = 128,
    num_warps: int | None = None,
    histogram: FirstRound | None = None,
    window: int = 0,
    chunk: int = SELECT_CHUNK,
    new: NewTokens | None = None,
    head_sum: str = "mma",
    tma: bool | None = None,
    num_stages: int | None = None,
) -> Tensor:
    """Indexer scores (Q, length) fp32 over FP8 keys; `reference.indexer_scores_fp8` defines
    them. Causal when `query_pos` is given; `length` defaults to the keys held; with `split`
    and `shift` (Q,), positions from `split` on read rows `shift[q]` further on.

    With `histogram` (a `select_chunked.FirstRound` of (Q, cdiv(length, chunk), 256) chunks) and
    `window`, one query a tile, each program scores `chunk` keys (a multiple of `block_l`) and
    also writes the first round of the top-k select over them (`select.high_byte_histogram`
    of the scores of the positions before the query's window) and adds it to the row's
    total, which `select_chunked.select_after_first_round` goes on from.

    With `new` (one query a tile, causal), the kernel is also the step's cache write: query
    q's new token is written at cache row new.rows[q], which must hold position
    query_pos[q] and be read by query q alone (one query, or the decode layout's tails), and
    scored from registers, so a decode layer needs no `write_cache` launch.

    `head_sum`: how a query's heads are summed. "mma" (the default): every (query, head)
    pair is a column of one MMA and a second, small MMA sums them, each head's relu rounded
    to bf16 (`_indexer_fp8_kernel`, which every layout takes). "cores": each query's heads are
    an MMA of their own, summed in fp32 on the CUDA cores (`_indexer_fp8_rows_kernel`: one or
    two queries a tile, without `shift`, `histogram` or `new`). On the H200 a 4096-query
    chunk at 46K context took 4.82 ms on the cores at 4 warps against 4.83 by MMA, 5.71 at 8
    warps, and its error against the fp32 reference was 1.2e-4 (DeepGEMM's too) instead of
    2.3e-3 (raw/logs/h200-tune-attention-head-sum-20261201T1413.csv). The profiles were
    measured with "mma", which stays the default until one is measured with "cores".

    `tma`: copy the key blocks by TMA (`_indexer_fp8_tma_kernel`, module docstring): None
    (the default) where it can for more than DECODE_QUERIES queries (one decode query at 46K
    context took 9.0 us by TMA against 8.9 by pointers on the H200,
    raw/logs/h200-tune-indexer-tma-20261201T1634.csv), True or an error where it cannot (the
    decode layout, a histogram, new tokens, the cores' head sum, a head dim that is not a power
    of two of at least 16 bytes), False never. `num_stages` defaults to 3 by TMA, 2 otherwise."""
    _check(q_idx, weights, keys, query_pos)
    (num_q, heads, dim), length = q_idx.shape, length or keys.values.shape[0]
    if (split is None) != (shift is None):
        raise ValueError("give split and shift together, or neither.")
    if num_q == 0 or length == 0:
        raise ValueError("indexer_scores_fp8 needs at least one query and one key.")
    heads_p = max(16, triton.next_power_of_2(heads))  # tl.dot wants N >= 16
    dim_p = max(32, triton.next_power_of_2(dim))  # FP8 MMA wants K >= 32
    check_head_sum(head_sum, block_q, shift, histogram, new)
    if block_q is None:
        block_q = 1 if num_q <= DECODE_QUERIES or shift is not None else max(1, 128 // heads_p)
        if head_sum == "cores":  # one or two queries a tile there
            block_q = min(block_q, 2)
    if shift is not None and block_q != 1:
        raise ValueError("a shifted (decode) layout takes one query per tile: block_q=1.")
    q_tiles = triton.cdiv(num_q, block_q)
    keys_per_program = keys_per_program_for(length, block_l, q_tiles, q_idx.device, RUN_BLOCKS)
    if histogram is not None:
        chunks = triton.cdiv(length, chunk)
        if (block_q != 1 or query_pos is None or chunk % block_l
                or histogram.chunks.shape != (num_q, chunks, 256)
                or histogram.totals.shape != (num_q, 256)):  # fmt: skip
            raise ValueError(f"a histogram needs causal scores, one query a tile, a chunk that "
                             f"is a multiple of block_l={block_l} and shape ({num_q}, {chunks}, "
                             f"256); got block_q={block_q}, chunk={chunk} and "
                             f"{tuple(histogram.chunks.shape)}.")  # fmt: skip
        keys_per_program = chunk
    if new is not None:
        _check_new(new, num_q, dim, block_q, query_pos, shift is not None)
        if histogram is not None and window < 1:
            raise ValueError("new tokens are scored after the select's first round, so they "
                             "must be in the window: window >= 1.")  # fmt: skip
    scores = score_rows(num_q, length, q_idx.device)
    upcast = dot_options(torch.bfloat16)[1]
    kv_dim = new.kv.shape[1] if new is not None else 1
    new_args = (new.index_k, new.kv, new.rows, new.kv_cache) if new is not None else (scores,) * 4
    rows = block_q * heads_p
    grid = (q_tiles, triton.cdiv(length, keys_per_program))
    if tma is None and num_q <= DECODE_QUERIES:  # decode's one key block a program: no gain
        tma = False
    by_tma = _takes_tma(tma, keys, shift, histogram, new, head_sum)
    if head_sum == "cores":
        with recording():
            launch(
                _indexer_fp8_rows_kernel, grid, q_idx, weights, keys.values, keys.scales,
                q_idx if query_pos is None else query_pos, scores, num_q, length,
                keys_per_program, q_idx.stride(0), q_idx.stride(1), *weights.stride(),
                keys.values.stride(0), scores.stride(0), HEADS=heads, DIM=dim, HEADS_P=heads_p,
                DIM_P=dim_p, BLOCK_Q=block_q, BLOCK_L=block_l, CAUSAL=query_pos is not None,
                num_warps=num_warps or 4, num_stages=2,
            )  # fmt: skip
        return scores
    warps = num_warps or (8 if rows * block_l >= 128 * 128 else 4)
    if by_tma:
        with recording():
            launch(
                _indexer_fp8_tma_kernel, grid, q_idx, weights,
                TensorDescriptor.from_tensor(keys.values, [block_l, dim]), keys.scales,
                q_idx if query_pos is None else query_pos, scores, num_q, length,
                keys_per_program, q_idx.stride(0), q_idx.stride(1), *weights.stride(),
                scores.stride(0), HEADS=heads, DIM=dim, HEADS_P=heads_p, BLOCK_Q=block_q,
                BLOCK_L=block_l, COLS=max(COLUMNS, block_q), CAUSAL=query_pos is not None,
                UPCAST=upcast, num_warps=warps, num_stages=num_stages or 3,
            )  # fmt: skip
        return scores
    with recording():
        launch(
            _indexer_fp8_kernel, grid, q_idx, weights, keys.values, keys.scales,
            q_idx if query_pos is None else query_pos, q_idx if shift is None else shift, scores,
            scores if histogram is None else histogram.chunks,
            scores if histogram is None else histogram.totals, num_q, length,
            length if split is None else split, keys_per_program, window,
            q_idx.stride(0), q_idx.stride(1), *weights.stride(), keys.values.stride(0),
            scores.stride(0), *new_args, new_args[0].stride(0), new_args[1].stride(0),
            new_args[3].stride(0), HEADS=heads, DIM=dim, HEADS_P=heads_p, DIM_P=dim_p,
            BLOCK_Q=block_q, BLOCK_L=block_l, COLS=max(COLUMNS, block_q),
            CAUSAL=query_pos is not None, SHIFTED=shift is not None, UPCAST=upcast,
            HISTOGRAM=histogram is not None, NEW=new is not None, KV_DIM=kv_dim,
            KV_P=triton.next_power_of_2(kv_dim),
            num_warps=warps, num_stages=num_stages or 2,
        )  # fmt: skip
    return scores
