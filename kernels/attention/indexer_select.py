"""The FP8 indexer and the top-k select as the `fp8` variant runs them together.

At decode a row is one query over the whole context: the one-program select walked its 46K
scores on one SM (136 us on the H200, against 9 us for the indexer). Here the indexer's
programs each score SELECT_CHUNK keys and take the select's first round over them as they go
(`indexer_scores_fp8(histogram=...)`), and `select_after_first_round` finishes the select
over as many programs, its second round reading the row's first-round total (which the
indexer adds to atomically) instead of summing every chunk's histogram: three launches, the
first of which was already being paid for, and the same picks in the same slots. At decode the
indexer also writes the step's new token into the caches (`NewTokens`), which took a launch
of its own. Rows enough to fill the GPU (prefill) keep the indexer and the one-program select,
which is then one program a row on every SM: the sampled select (`select_sampled`), which
reads a row once instead of three times.

A compressed (CSA) layer's queries pick entries, which live past the raw rows in the latent
buffer, and attend to a window of raw rows given by the caller: `entry_select_fp8` has the
picks kernel write both, so a CSA decode layer's rows take no launch of their own.
"""

import triton
from torch import Tensor

from kernels.attention.compress import csa_rows_triton
from kernels.attention.formats import NewTokens, QuantizedKeys
from kernels.attention.indexer import DECODE_QUERIES
from kernels.attention.indexer_fp8 import indexer_scores_fp8
from kernels.attention.key_cache import write_cache
from kernels.attention.select_chunked import SELECT_CHUNK, FirstRound, select_after_first_round
from kernels.attention.select_sampled import select_positions_sampled


def indexer_select_fp8(
    q_idx: Tensor,
    weights: Tensor,
    keys: QuantizedKeys,
    query_pos: Tensor,
    length: int | None,
    topk: int,
    window: int,
    split: int | None = None,
    shift: Tensor | None = None,
    chunk: int = SELECT_CHUNK,
    num_warps: int = 4,
    new: NewTokens | None = None,
) -> Tensor:
    """Key positions each query attends to, (Q, topk + window), from the FP8 indexer's scores:
    what `select_positions_sampled(indexer_scores_fp8(...))` returns, in three launches for a
    few queries (decode) and two otherwise. `chunk` (positions a select program owns) and
    `num_warps` (the select's) are for tuning. `new` tokens are written to the caches first:
    by the indexer itself for a few queries (one `write_cache` launch fewer a decode layer),
    else by `write_cache`."""
    num_q = q_idx.shape[0]
    length = length or keys.values.shape[0]
    if num_q > DECODE_QUERIES or not 1 <= topk <= chunk:
        if new is not None:
            write_cache(new.kv_cache, keys, new.rows, new.kv, new.index_k)
        scores = indexer_scores_fp8(q_idx, weights, keys, query_pos, length, split, shift)
        return select_positions_sampled(scores, query_pos, topk, window, split, shift)
    first_round = FirstRound.empty(num_q, triton.cdiv(length, chunk), q_idx.device)
    scores = indexer_scores_fp8(q_idx, weights, keys, query_pos, length, split, shift, block_q=1,
                                histogram=first_round, window=window, chunk=chunk,
                                new=new)  # fmt: skip
    return select_after_first_round(scores, query_pos, first_round, topk, window, split, shift,
                                    chunk, num_warps)  # fmt: skip


def entry_select_fp8(
    q_idx: Tensor,
    weights: Tensor,
    keys: QuantizedKeys,
    entry_pos: Tensor,
    query_pos: Tensor,
    length: int,
    topk: int,
    window_rows: Tensor,
    offset: int,
    split: int | None = None,
    shift: Tensor | None = None,
) -> Tensor:
    """`compress.csa_rows` of the entries `indexer_select_fp8` picks: (Q, topk + w) rows, the
    picked entries `offset` rows on (-1 unused, all of them while a query's entry position
    entry_pos is -1), then `window_rows`. For a few queries (decode) the indexer scores from
    entry_pos itself, which gives a query without an entry no candidates, and the picks kernel
    writes the rows: three launches. Otherwise the `fp8` variant's own steps: the picks from
    query_pos (entry_pos, 0 for -1) and `csa_rows_triton`."""
    num_q = q_idx.shape[0]
    if length < 1:
        raise ValueError(f"entry_select_fp8 needs at least one entry to score; got {length}.")
    if num_q > DECODE_QUERIES or not 1 <= topk <= SELECT_CHUNK:
        picked = indexer_select_fp8(q_idx, weights, keys, query_pos, length, topk, 0, split,
                                    shift)  # fmt: skip
        return csa_rows_triton(picked, entry_pos, window_rows, offset)
    first_round = FirstRound.empty(num_q, triton.cdiv(length, SELECT_CHUNK), q_idx.device)
    scores = indexer_scores_fp8(q_idx, weights, keys, entry_pos, length, split, shift, block_q=1,
                                histogram=first_round, window=0)  # fmt: skip
    return select_after_first_round(scores, entry_pos, first_round, topk, 0, split, shift,
                                    offset=offset, extra=window_rows)  # fmt: skip
