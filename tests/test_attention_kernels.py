"""The Triton indexer and top-k sparse attention under the interpreter against the torch
references: odd sizes, one query, causal masks, more top-k than positions, the window at the
start of the sequence, split (decode) and unsplit (prefill) forms, and bad input."""

import pytest
import torch
from helpers import relative_error

import kernels.attention as attention
from kernels.attention import (
    indexer_scores,
    indexer_scores_fp8,
    indexer_scores_triton,
    select_positions,
    select_positions_triton,
    sparse_attention,
    sparse_attention_triton,
)
from kernels.attention.select import default_row_programs
from kernels.attention.select_sampled import select_positions_sampled


def randn(*shape, seed=0, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def indexer_inputs(queries, heads, dim, length, dtype=torch.float32, device="cpu"):
    return (
        randn(queries, heads, dim, seed=1, dtype=dtype, device=device),
        randn(queries, heads, seed=2, device=device) * heads**-0.5,
        randn(length, dim, seed=3, dtype=dtype, device=device),
    )


def assert_same_selection(index, ref, topk):
    """The same window columns and the same set of top-k picks per row (order aside: the
    Triton select writes picks in position order, the reference best first)."""
    assert torch.equal(index[:, topk:], ref[:, topk:])
    assert torch.equal(index[:, :topk].sort(dim=1).values, ref[:, :topk].sort(dim=1).values)


def assert_scores_match(out, ref, tolerance):
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out)), "different keys masked"
    assert not torch.isnan(out).any()
    assert relative_error(out[finite], ref[finite]) < tolerance


@pytest.mark.parametrize(
    ("queries", "heads", "dim", "length"),
    [(1, 8, 32, 200), (7, 3, 20, 150), (9, 2, 16, 33)],  # decode, odd heads and dims, prefill
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_indexer_matches_the_reference(queries, heads, dim, length, dtype, device):
    q_idx, weights, k_idx = indexer_inputs(queries, heads, dim, length, dtype, device)
    out = indexer_scores_triton(q_idx, weights, k_idx)
    assert out.dtype == torch.float32 and out.shape == (queries, length)
    ref = indexer_scores(q_idx.float(), weights, k_idx.float())
    assert_scores_match(out, ref, 1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("block_l", [16, 64])
def test_causal_indexer_scores_future_keys_minus_infinity(block_l, device):
    # Queries at the start of the sequence (positions 0..4) and further on: key blocks past a
    # tile's last query are skipped, the rest masked per query.
    q_idx, weights, k_idx = indexer_inputs(12, 4, 24, 90, device=device)
    pos = torch.tensor([0, 1, 2, 3, 4, 40, 41, 42, 60, 61, 88, 89], device=device)
    out = indexer_scores_triton(q_idx, weights, k_idx, pos, block_l=block_l)
    ref = indexer_scores(q_idx, weights, k_idx, pos)
    assert torch.isinf(ref[0, 1:]).all() and torch.isfinite(ref[0, 0])
    assert_scores_match(out, ref, 1e-5)


def sparse_inputs(queries, heads, dim, rows, slots, dtype=torch.float32, device="cpu"):
    q = randn(queries, heads, dim, seed=4, dtype=dtype, device=device)
    kv = randn(rows, dim, seed=5, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(6)
    index = torch.randint(-1, rows, (queries, slots), generator=gen).to(device)
    return q, kv, index


@pytest.mark.parametrize("block_n", [16, 32, 64])
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_attention_matches_the_reference(splits, dtype, block_n, device):
    q, kv, index = sparse_inputs(5, 20, 40, 70, 75, dtype, device)  # 20 heads: two head blocks
    index[2] = -1  # a query with no valid slot: zeros, not NaN
    out = sparse_attention_triton(q, kv, index, splits=splits, block_n=block_n)
    ref = sparse_attention(q.float(), kv.float(), index)
    assert out.dtype == dtype and not torch.isnan(out).any()
    assert torch.equal(out[2].float(), torch.zeros_like(ref[2]))
    assert relative_error(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_sparse_attention_at_head_dim_512_decode_and_prefill(device):
    # The preset's head dim; one query split over programs (decode), then several unsplit.
    for queries, splits in ((1, 4), (3, 1)):
        q, kv, index = sparse_inputs(queries, 16, 512, 300, 96, torch.bfloat16, device)
        out = sparse_attention_triton(q, kv, index, scale=0.05, splits=splits)
        ref = sparse_attention(q.float(), kv.float(), index, scale=0.05)
        assert relative_error(out, ref) < 1e-2


def test_top_k_larger_than_the_positions_and_the_window_at_the_start(device):
    # Positions 0..5 of a 6-key sequence with top-k 8 and a window of 4: most slots are -1,
    # the window reaches before position 0, and query 0 sees only itself.
    heads, dim = 3, 32
    q_idx, weights, k_idx = indexer_inputs(6, 2, 16, 6, device=device)
    pos = torch.arange(6, device=device)
    variant = attention.VARIANTS["triton"]
    scores = variant.indexer_scores(q_idx, weights, k_idx, pos)
    index = variant.select_positions(scores, pos, 8, 4)
    assert index.shape == (6, 12) and (index[0] == -1).sum() == 11
    q = randn(6, heads, dim, seed=7, device=device)
    kv = randn(6, dim, seed=8, device=device)
    out = variant.attend(q, kv, index)
    assert torch.isfinite(out).all()
    assert torch.allclose(out[0], kv[0].expand(heads, dim), atol=1e-6)  # only itself to see
    assert relative_error(out, sparse_attention(q, kv, index)) < 1e-5
    ref_index = select_positions(indexer_scores(q_idx, weights, k_idx, pos), pos, 8, 4)
    assert_same_selection(index, ref_index, topk=8)


def test_variants_share_one_interface(device):
    assert set(attention.VARIANTS) == {"torch", "triton", "fp8"}
    triton_variant = attention.VARIANTS["triton"]
    assert triton_variant.indexer_scores is indexer_scores_triton
    assert triton_variant.select_positions is attention.select_positions_sampled
    assert attention.VARIANTS["fp8"].indexer_scores is indexer_scores_fp8
    assert attention.VARIANTS["fp8"].select_positions is attention.select_positions_sampled
    q, kv, index = sparse_inputs(2, 4, 16, 9, 5, device=device)
    assert torch.equal(triton_variant(q, kv, index), sparse_attention_triton(q, kv, index))


@pytest.mark.gpu
@pytest.mark.parametrize("queries", [1, 4, 256])  # decode (split), 4 streams, a prefill piece
def test_preset_shapes_compile_without_spills_and_match(queries):
    # dsv4-flash-tp2 per rank: 32 heads of 512, indexer 64 x 128, top-512 plus a 128 window.
    from kernels.moe import last_facts

    context = 4096
    q_idx, weights, k_idx = indexer_inputs(queries, 64, 128, context, torch.bfloat16, "cuda")
    pos = torch.arange(context - queries, context, device="cuda")
    scores = indexer_scores_triton(q_idx, weights, k_idx, pos)
    assert all(f.n_spills == 0 for f in last_facts().values()), last_facts()
    assert_scores_match(scores, indexer_scores(q_idx.float(), weights, k_idx.float(), pos), 1e-2)
    index = select_positions(scores, pos, 512, 128)
    q, kv, _ = sparse_inputs(queries, 32, 512, context, 1, torch.bfloat16, "cuda")
    out = sparse_attention_triton(q, kv, index)
    assert all(f.n_spills == 0 for f in last_facts().values()), last_facts()
    assert relative_error(out, sparse_attention(q.float(), kv.float(), index)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("queries", [1, 4, 512])  # decode, 4 streams, a prefill piece
def test_fp8_indexer_and_select_at_preset_shapes(queries):
    # dsv4-flash-tp2 per rank: indexer 64 heads x 128, top-512 plus a 128 window.
    from kernels.moe import last_facts

    context = 8192
    q_idx, weights, k_idx = indexer_inputs(queries, 64, 128, context, torch.bfloat16, "cuda")
    keys = attention.quantize_keys(k_idx)
    pos = torch.arange(context - queries, context, device="cuda")
    scores = indexer_scores_fp8(q_idx, weights, keys, pos)
    assert all(f.n_spills == 0 for f in last_facts().values()), last_facts()
    ref = attention.reference.indexer_scores_fp8(q_idx, weights, keys, pos)
    assert_scores_match(scores, ref, 1e-2)
    by_pointers = indexer_scores_fp8(q_idx, weights, keys, pos, tma=False)
    assert all(f.n_spills == 0 for f in last_facts().values()), last_facts()
    assert_scores_match(by_pointers, scores, 1e-6)
    index = select_positions_triton(ref, pos, 512, 128, rounds=4)
    assert all(f.n_spills == 0 for f in last_facts().values()), last_facts()
    assert_same_selection(index, select_positions(ref, pos, 512, 128), topk=512)
    fused = attention.indexer_select_fp8(q_idx, weights, keys, pos, context, 512, 128)
    assert all(f.n_spills == 0 for f in last_facts().values()), last_facts()
    assert torch.equal(fused, select_positions_triton(scores, pos, 512, 128))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda q, kv, i: sparse_attention_triton(q[0], kv, i), "expects q"),
        (lambda q, kv, i: sparse_attention_triton(q, kv[:, :8], i), "expects q"),
        (lambda q, kv, i: sparse_attention_triton(q, kv.double(), i), "both be bf16 or fp32"),
        (lambda q, kv, i: sparse_attention_triton(q, kv, i.float()), "integer tensor"),
        (lambda q, kv, i: sparse_attention_triton(q[:0], kv, i[:0]), "at least one query"),
    ],
)
def test_sparse_attention_bad_input(call, message):
    q, kv, index = sparse_inputs(2, 4, 16, 9, 5)
    with pytest.raises(ValueError, match=message):
        call(q, kv, index)


def test_indexer_bad_input():
    q_idx, weights, k_idx = indexer_inputs(3, 2, 16, 10)
    with pytest.raises(ValueError, match="expects q_idx"):
        indexer_scores_triton(q_idx, weights[:, :1], k_idx)
    with pytest.raises(ValueError, match="query_pos"):
        indexer_scores_triton(q_idx, weights, k_idx, torch.arange(2))
    with pytest.raises(ValueError, match="share a float dtype"):
        indexer_scores_triton(q_idx, weights, k_idx.double())
    with pytest.raises(ValueError, match="at least one query and one key"):
        indexer_scores_triton(q_idx, weights, k_idx[:0])


def tied_scores(queries, length, seed=0):
    """Scores with long runs of exact ties and one row of a single value."""
    scores = randn(queries, length, seed=seed)
    scores[:, length // 4 : length // 2] = 0.5
    scores[0] = 1.0
    return scores


@pytest.mark.parametrize(("block", "rounds", "digit_bits"), [(64, 4, 8), (256, 4, 8), (256, 8, 4)])
def test_radix_select_is_exact_over_all_32_bits(block, rounds, digit_bits, device):
    # Ties broken by position, fewer candidates than top-k, a window before position 0.
    scores = tied_scores(9, 700).to(device)
    pos = torch.tensor([0, 5, 20, 65, 66, 300, 500, 650, 699], device=device)
    out = select_positions_triton(scores, pos, 50, 16, rounds=rounds, block=block,
                                  digit_bits=digit_bits)  # fmt: skip
    ref = select_positions(scores, pos, 50, 16)
    assert torch.equal(out[:, 50:], ref[:, 50:])
    for row, ref_row, score in zip(out[:, :50], ref[:, :50], scores, strict=True):
        picked, wanted = row[row >= 0], ref_row[ref_row >= 0]
        assert len(picked) == len(set(picked.tolist())) == len(wanted)
        assert torch.equal(score[picked].sort().values, score[wanted].sort().values)


@pytest.mark.parametrize("digit_bits", [4, 5, 6, 8])
def test_default_rounds_cut_within_bf16_precision_of_the_exact_cut(digit_bits, device):
    # The default rounds fix at least the top 16 bits of the key, whatever the digit.
    scores = randn(6, 3000, seed=4).to(device) * 3
    pos = torch.tensor([100, 600, 1200, 2000, 2500, 2999], device=device)
    out = select_positions_triton(scores, pos, 256, 32, digit_bits=digit_bits)
    ref = select_positions(scores, pos, 256, 32)
    assert torch.equal(out[:, 256:], ref[:, 256:])
    for row, ref_row, score in zip(out[:, :256], ref[:, :256], scores, strict=True):
        picked = row[row >= 0]
        assert len(picked) == len(set(picked.tolist())) == (ref_row >= 0).sum()
        cut = score[ref_row[ref_row >= 0]].min()
        assert (score[picked] >= cut - cut.abs() * 2**-7).all()


def test_select_maps_a_streams_tail_to_its_cache_rows(device):
    # Two decode streams over a 200-token prompt with tails of 20: stream 1's tail starts 20
    # rows after stream 0's.
    scores = randn(2, 220, seed=5).to(device)
    pos = torch.tensor([205, 205], device=device)
    shift = torch.tensor([0, 20], device=device)
    out = select_positions_triton(scores, pos, 30, 8, split=200, shift=shift)
    ref = select_positions(scores, pos, 30, 8, split=200, shift=shift)
    assert_same_selection(out, ref, topk=30)
    assert out[1, 30] == 225 and out[0, 30] == 205  # each stream's own latest token


@pytest.mark.parametrize(("queries", "block_q"), [(1, None), (5, None), (40, 4)])
def test_fp8_indexer_matches_its_reference(queries, block_q, device):
    q_idx, weights, k_idx = indexer_inputs(queries, 8, 32, 300, device=device)
    keys = attention.quantize_keys(k_idx)
    pos = torch.arange(300 - queries, 300, device=device)
    pos[0] = 0  # a query at the start: most of its keys are in the future
    for query_pos in (None, pos):
        out = indexer_scores_fp8(q_idx, weights, keys, query_pos, block_q=block_q, block_l=32)
        ref = attention.reference.indexer_scores_fp8(q_idx, weights, keys, query_pos)
        assert_scores_match(out, ref, 1e-2)
    # FP8 rounding against the unquantised fp32 scores: a few percent, reported by the bench.
    fp32 = indexer_scores(q_idx, weights, k_idx, pos)
    assert 1e-3 < relative_error(out[torch.isfinite(fp32)], fp32[torch.isfinite(fp32)]) < 0.1


@pytest.mark.parametrize("block_l", [16, 64])
def test_fp8_indexer_skips_key_blocks_after_a_tiles_last_query(block_l, device):
    # Early tiles write the key blocks after their last query as -inf without reading them;
    # later tiles score every block, masked per query.
    q_idx, weights, k_idx = indexer_inputs(12, 4, 32, 90, device=device)
    keys = attention.quantize_keys(k_idx)
    pos = torch.tensor([0, 1, 2, 3, 4, 40, 41, 42, 60, 61, 88, 89], device=device)
    for block_q in (1, 4):
        out = indexer_scores_fp8(q_idx, weights, keys, pos, block_q=block_q, block_l=block_l)
        ref = attention.reference.indexer_scores_fp8(q_idx, weights, keys, pos)
        assert torch.isinf(out[0, 1:]).all() and (out[0, 1:] < 0).all()
        assert_scores_match(out, ref, 1e-2)


def launched_kernels(monkeypatch) -> list[str]:
    """The names of the kernels the FP8 indexer launches from now on, in order."""
    import kernels.attention.indexer_fp8 as module

    names, launch = [], module.launch

    def noting(kernel, *args, **kwargs):
        names.append(kernel.fn.__name__)
        return launch(kernel, *args, **kwargs)

    monkeypatch.setattr(module, "launch", noting)
    return names


@pytest.mark.parametrize("block_q", [1, 2, None])
def test_fp8_indexer_sums_heads_on_the_cores_as_the_mma_does(block_q, device, monkeypatch):
    # An odd query count leaves the last two-query tile half empty; the first query sits at
    # the start, so most of its key blocks are after it. 13 queries of 8 heads take 8 a tile
    # by MMA unless told: the cores take 2.
    q_idx, weights, k_idx = indexer_inputs(13, 8, 32, 200, device=device)
    keys = attention.quantize_keys(k_idx)
    pos = torch.tensor([0, 150, 151, 170, 180, 185, 186, 190, 191, 195, 197, 198, 199],
                       device=device)  # fmt: skip
    launched = launched_kernels(monkeypatch)
    for query_pos in (None, pos):
        ref = attention.reference.indexer_scores_fp8(q_idx, weights, keys, query_pos)
        by = {}
        for how in ("mma", "cores"):
            launched.clear()
            by[how] = indexer_scores_fp8(q_idx, weights, keys, query_pos, block_q=block_q,
                                         block_l=32, head_sum=how)  # fmt: skip
            kernel = "_indexer_fp8_rows_kernel" if how == "cores" else "_indexer_fp8_tma_kernel"
            assert launched == [kernel]
            assert_scores_match(by[how], ref, 1e-2)
        # the cores sum in fp32 where the MMA rounds each head's relu to bf16 on a GPU
        finite = torch.isfinite(ref)
        assert relative_error(by["cores"][finite], ref[finite]) < 1e-3
        assert torch.equal(torch.isinf(by["cores"]), torch.isinf(ref))


def test_fp8_indexer_refuses_a_head_sum_it_cannot_do(device):
    from kernels.attention.select_chunked import FirstRound

    q_idx, weights, k_idx = indexer_inputs(8, 8, 32, 64, device=device)
    keys = attention.quantize_keys(k_idx)
    pos = torch.arange(56, 64, device=device)
    with pytest.raises(ValueError, match="got 'fma'"):
        indexer_scores_fp8(q_idx, weights, keys, head_sum="fma")
    with pytest.raises(ValueError, match=r"cannot take block_q=4 \(it takes 1 or 2\)"):
        indexer_scores_fp8(q_idx, weights, keys, block_q=4, head_sum="cores")
    with pytest.raises(ValueError, match="cannot take shift"):
        indexer_scores_fp8(q_idx, weights, keys, pos, split=32, head_sum="cores",
                           shift=torch.zeros(8, dtype=torch.int64, device=device))  # fmt: skip
    first = FirstRound.of(torch.zeros(8, 1, 256, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="cannot take histogram; use head_sum='mma'"):
        indexer_scores_fp8(q_idx, weights, keys, pos, head_sum="cores", histogram=first)


@pytest.mark.parametrize(("block_q", "block_l"), [(1, 16), (4, 32), (None, 64)])
def test_fp8_indexer_by_tma_writes_what_pointer_loads_write(block_q, block_l, device,
                                                            monkeypatch):  # fmt: skip
    # Early queries leave whole key blocks after them (the -inf loop), later ones score
    # every block; 90 keys leave the last block part empty (TMA reads zeros past the end).
    q_idx, weights, k_idx = indexer_inputs(12, 4, 32, 90, device=device)
    keys = attention.quantize_keys(k_idx)
    pos = torch.tensor([0, 1, 2, 3, 4, 40, 41, 42, 60, 61, 88, 89], device=device)
    launched = launched_kernels(monkeypatch)
    for query_pos in (None, pos):
        by_pointers = indexer_scores_fp8(q_idx, weights, keys, query_pos, block_q=block_q,
                                         block_l=block_l, tma=False)  # fmt: skip
        for tma in (True, None):
            launched.clear()
            by_tma = indexer_scores_fp8(q_idx, weights, keys, query_pos, block_q=block_q,
                                        block_l=block_l, tma=tma)  # fmt: skip
            assert launched == ["_indexer_fp8_tma_kernel"]
            assert torch.equal(by_tma, by_pointers)
    launched.clear()  # a decode query (DECODE_QUERIES or fewer) keeps pointer loads by default
    indexer_scores_fp8(q_idx[:1], weights[:1], keys, pos[-1:], block_l=block_l)
    assert launched == ["_indexer_fp8_kernel"]


def test_fp8_indexer_refuses_tma_where_it_cannot_copy_by_tma(device, monkeypatch):
    from kernels.attention.select_chunked import FirstRound

    q_idx, weights, k_idx = indexer_inputs(8, 8, 32, 64, device=device)
    keys = attention.quantize_keys(k_idx)
    pos = torch.arange(56, 64, device=device)
    shift = torch.zeros(8, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match=r"tma=True cannot take shift \(the decode layout\)"):
        indexer_scores_fp8(q_idx, weights, keys, pos, split=32, shift=shift, block_q=1, tma=True)
    first = FirstRound.of(torch.zeros(8, 1, 256, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="cannot take histogram"):
        indexer_scores_fp8(
            q_idx, weights, keys, pos, block_q=1, histogram=first, window=4, tma=True
        )
    with pytest.raises(ValueError, match="cannot take head_sum='cores'"):
        indexer_scores_fp8(q_idx, weights, keys, head_sum="cores", tma=True)
    q_odd, w_odd, k_odd = indexer_inputs(4, 8, 8, 64, device=device)
    with pytest.raises(ValueError, match="a head dim of 8"):
        indexer_scores_fp8(q_odd, w_odd, attention.quantize_keys(k_odd), tma=True)
    # tma=None falls back to pointer loads where TMA cannot copy
    launched = launched_kernels(monkeypatch)
    indexer_scores_fp8(q_odd, w_odd, attention.quantize_keys(k_odd), tma=None)
    assert launched == ["_indexer_fp8_kernel"]


@pytest.mark.parametrize("variant", ["triton", "fp8"])
def test_indexers_score_a_streams_own_tail(variant, device):
    # Prompt 200, tails of 20, two streams at step 5: the scores over virtual positions equal
    # the scores over each stream's own rows gathered by hand.
    _, _, keys = indexer_inputs(1, 1, 32, 240, torch.bfloat16, device)
    q_idx, weights, _ = indexer_inputs(2, 8, 32, 1, torch.bfloat16, device)
    run = attention.VARIANTS[variant]
    cached = run.cache_keys(keys)
    pos, shift = torch.tensor([205, 205], device=device), torch.tensor([0, 20], device=device)
    out = run.indexer_scores(q_idx, weights, cached, pos, 220, split=200, shift=shift)
    for stream in range(2):
        rows = torch.cat([torch.arange(200), 200 + 20 * stream + torch.arange(20)]).to(device)
        own = attention.formats.QuantizedKeys(*(part[rows] for part in cached)) if (
            variant == "fp8") else cached[rows]  # fmt: skip
        alone = run.indexer_scores(q_idx[stream : stream + 1], weights[stream : stream + 1], own,
                                   pos[stream : stream + 1])  # fmt: skip
        assert_scores_match(out[stream : stream + 1], alone, 1e-6)


def test_fp8_cache_write_stores_rows_and_quantised_keys(device):
    kv_cache = torch.zeros(50, 24, device=device)
    keys = attention.formats.empty_keys(50, 32, device)
    kv, index_k = randn(3, 24, seed=6, device=device), randn(3, 32, seed=7, device=device)
    expected = attention.quantize_keys(index_k)
    for rows, where in ((torch.tensor([4, 9, 30], device=device), [4, 9, 30]), (10, [10, 11, 12])):
        attention.write_cache(kv_cache, keys, rows, kv, index_k)
        assert torch.equal(kv_cache[where], kv)
        assert torch.equal(keys.values[where].float(), expected.values.float())
        assert torch.equal(keys.scales[where], expected.scales)
    assert relative_error(keys.dequantize()[where], index_k) < 0.05


def test_select_and_fp8_indexer_bad_input(device):
    scores = randn(3, 40, device=device)
    with pytest.raises(ValueError, match="expects scores"):
        select_positions_triton(scores, torch.arange(2, device=device), 4, 2)
    with pytest.raises(ValueError, match="fp32 scores"):
        select_positions_triton(scores.double(), torch.arange(3, device=device), 4, 2)
    with pytest.raises(ValueError, match="rounds"):
        select_positions_triton(scores, torch.arange(3, device=device), 4, 2, rounds=5)
    with pytest.raises(ValueError, match="digit_bits"):
        select_positions_triton(scores, torch.arange(3, device=device), 4, 2, digit_bits=3)
    with pytest.raises(ValueError, match="split and shift"):
        select_positions_triton(scores, torch.arange(3, device=device), 4, 2, split=20)
    q_idx, weights, k_idx = indexer_inputs(3, 2, 16, 10, device=device)
    with pytest.raises(ValueError, match="QuantizedKeys"):
        indexer_scores_fp8(q_idx, weights, k_idx)
    with pytest.raises(ValueError, match="one query per tile"):
        indexer_scores_fp8(q_idx, weights, attention.quantize_keys(k_idx), block_q=2, split=5,
                           shift=torch.zeros(3, dtype=torch.int64, device=device))  # fmt: skip
    from dataclasses import replace

    from kernels.attention.select_chunked import FirstRound

    first_round = torch.zeros(3, 1, 256, dtype=torch.int32, device=device)
    pos = torch.arange(7, 10, device=device)
    with pytest.raises(ValueError, match="a histogram needs causal scores"):
        indexer_scores_fp8(q_idx, weights, attention.quantize_keys(k_idx), pos,
                           histogram=replace(FirstRound.of(first_round),
                                             chunks=first_round[:, :, :128]))  # fmt: skip
    with pytest.raises(ValueError, match="a multiple of block_l"):
        indexer_scores_fp8(q_idx, weights, attention.quantize_keys(k_idx), pos,
                           histogram=FirstRound.of(first_round), chunk=100)  # fmt: skip


@pytest.mark.parametrize(
    ("length", "topk", "window", "positions"),
    [
        (2500, 64, 16, [2499, 1800]),  # five chunks, the last ones all future to the second query
        (1030, 64, 16, [1029, 40]),  # the second query has fewer candidates than picks
    ],
)
def test_chunked_decode_select_writes_what_the_one_program_select_writes(
    length, topk, window, positions, device
):
    q_idx, weights, k_idx = indexer_inputs(len(positions), 8, 32, length, device=device)
    keys = attention.quantize_keys(k_idx)
    pos = torch.tensor(positions, device=device)
    fused = attention.indexer_select_fp8(q_idx, weights, keys, pos, length, topk, window)
    scores = indexer_scores_fp8(q_idx, weights, keys, pos)
    assert torch.equal(fused, select_positions_triton(scores, pos, topk, window))
    # The running totals are zero again, so the next select (a replay) starts clean.
    from kernels.attention.select_chunked import row_totals

    assert not row_totals(len(positions), torch.device(device)).any()
    again = attention.indexer_select_fp8(q_idx, weights, keys, pos, length, topk, window)
    assert torch.equal(again, fused)


def test_chunked_select_breaks_ties_across_chunks_in_position_order(device):
    from kernels.attention.select_chunked import SELECT_CHUNK, FirstRound, select_after_first_round

    length, topk, window = 2200, 40, 8
    scores = (randn(1, length, seed=9, device=device) * 2).round() / 2  # a handful of values
    pos = torch.tensor([length - 1], device=device)
    keys = scores.view(torch.int32)
    keys = torch.where(keys < 0, keys ^ 0x7FFFFFFF, keys)
    candidates = length - window + 1
    chunks = -(-length // SELECT_CHUNK)
    first = torch.zeros(1, chunks, 256, dtype=torch.int32, device=device)
    for c in range(chunks):
        part = keys[0, c * SELECT_CHUNK : min((c + 1) * SELECT_CHUNK, candidates)]
        first[0, c] = torch.bincount((part >> 24) + 128, minlength=256)
    first_round = FirstRound.of(first)
    out = select_after_first_round(scores, pos, first_round, topk, window)
    assert torch.equal(out, select_positions_triton(scores, pos, topk, window))
    assert not first_round.totals.any()  # left at zero for the next select
    # A compressed layer's form: the picks `offset` rows on, then rows of the caller's after
    # the window; the picks' -1s stay -1 (too few candidates: every one picked, the rest -1)
    first_round = FirstRound.of(first)
    extra = torch.arange(5, device=device).view(1, 5) * 7
    moved = select_after_first_round(scores, pos, first_round, topk, window, offset=1000,
                                     extra=extra)  # fmt: skip
    assert torch.equal(moved[:, :topk], out[:, :topk] + 1000)
    assert torch.equal(moved[:, topk:], torch.cat([out[:, topk:], extra], 1))
    few = torch.tensor([9], device=device)  # 2 candidates before a window of 8
    first_round = FirstRound.of(torch.zeros_like(first))  # every candidate is picked unread
    picks = select_after_first_round(scores, few, first_round, topk, window, offset=1000,
                                     extra=extra)  # fmt: skip
    assert picks[0, :2].tolist() == [1000, 1001] and (picks[0, 2:topk] == -1).all()
    assert picks[0, topk:].tolist() == list(range(9, 1, -1)) + extra[0].tolist()
    with pytest.raises(ValueError, match="extra rows"):
        select_after_first_round(scores, pos, FirstRound.of(first), topk, window,
                                 extra=extra.int())  # fmt: skip


def test_entry_select_matches_the_clamped_choice_and_its_rows(device):
    # A CSA layer's decode rows, streams with and without an entry in one launch, in the
    # decode layout (shared entries, then each stream's own): the fused select against the
    # fp8 variant's choice from the clamped position with its picks masked and moved
    from kernels.attention.compress import csa_rows_triton
    from kernels.attention.indexer_select import entry_select_fp8

    length, topk, split, dim, heads = 700, 16, 600, 32, 4
    keys = attention.quantize_keys(randn(length + 3 * 40, dim, seed=3, device=device))
    q_idx = randn(3, heads, dim, seed=4, device=device)
    weights = randn(3, heads, seed=5, device=device)
    entry_pos = torch.tensor([-1, 620, 300], device=device)
    shift = torch.arange(3, device=device) * 40
    window = torch.arange(3 * 6, device=device).view(3, 6) + 5000
    got = entry_select_fp8(q_idx, weights, keys, entry_pos, entry_pos.clamp(min=0), length,
                           topk, window, 100_000, split, shift)  # fmt: skip
    picked = attention.indexer_select_fp8(q_idx, weights, keys, entry_pos.clamp(min=0), length,
                                          topk, 0, split, shift)  # fmt: skip
    assert torch.equal(got, csa_rows_triton(picked, entry_pos, window, 100_000))
    assert (got[0, :topk] == -1).all() and (got[1:, :topk] >= 100_000).all()
    with pytest.raises(ValueError, match="at least one entry"):
        entry_select_fp8(q_idx, weights, keys, entry_pos, entry_pos, 0, topk, window, 0)


def test_chunked_select_bad_input(device):
    from kernels.attention.select_chunked import FirstRound, select_after_first_round

    scores = randn(2, 1000, device=device)
    pos = torch.tensor([999, 999], device=device)
    first = FirstRound.of(torch.zeros(2, 2, 256, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="first_round"):
        select_after_first_round(scores, pos, FirstRound.of(first.chunks[:, :1]), 16, 4)
    with pytest.raises(ValueError, match="topk <= chunk=512"):
        select_after_first_round(scores, pos, first, 600, 4)
    with pytest.raises(ValueError, match="split and shift"):
        select_after_first_round(scores, pos, first, 16, 4, split=100)


@pytest.mark.parametrize("variant", ["fp8", "triton"])
def test_a_decode_step_that_writes_its_tokens_selects_and_caches_as_write_then_choose(
    variant, device
):
    """`choose(new=...)` (the fp8 indexer writing the new tokens itself) leaves the caches and
    the picks exactly as `write_cache` then `choose` do, on two streams' shifted tails whose
    new-token rows still hold stale keys."""
    run = attention.VARIANTS[variant]
    prompt, tail, kv_dim, topk, window = 1200, 40, 24, 64, 16
    q_idx, weights, k_idx = indexer_inputs(2, 8, 32, prompt + 2 * tail, device=device)
    stale_kv = randn(prompt + 2 * tail, kv_dim, seed=4, device=device)
    pos = torch.tensor([prompt + 10, prompt + 25], device=device)
    shift = torch.tensor([0, tail], device=device)  # stream 1's tail sits after stream 0's
    new_kv, new_k = randn(2, kv_dim, seed=5, device=device), randn(2, 32, seed=6, device=device)
    layout = {"split": prompt, "shift": shift}
    results = []
    for fused in (True, False):
        kv_cache, keys = stale_kv.clone(), run.cache_keys(k_idx.clone())
        new = attention.NewTokens(kv_cache, pos + shift, new_kv, new_k)
        if fused:
            chosen = run.choose(q_idx, weights, keys, pos, prompt + tail, topk, window,
                                **layout, new=new)  # fmt: skip
        else:
            run.write_cache(kv_cache, keys, new.rows, new_kv, new_k)
            chosen = run.choose(q_idx, weights, keys, pos, prompt + tail, topk, window, **layout)
        results.append((chosen, kv_cache, keys))
    (chosen, kv_cache, keys), (expected, kv_expected, keys_expected) = results
    assert torch.equal(chosen, expected)
    assert torch.equal(kv_cache, kv_expected)
    for part, part_expected in zip(keys, keys_expected, strict=True):
        assert torch.equal(part.float(), part_expected.float())


def test_new_tokens_of_the_wrong_shape_are_refused(device):
    q_idx, weights, k_idx = indexer_inputs(2, 8, 32, 300, device=device)
    keys, pos = attention.quantize_keys(k_idx), torch.tensor([290, 299], device=device)
    kv_cache = torch.zeros(300, 24, device=device)
    bad = attention.NewTokens(kv_cache, pos, torch.zeros(2, 16, device=device), q_idx[:, 0])
    layout = {"split": 300, "shift": torch.zeros(2, dtype=torch.long, device=device)}
    with pytest.raises(ValueError, match=r"kv \(2, 24\)"):
        indexer_scores_fp8(q_idx, weights, keys, pos, block_q=1, new=bad, **layout)
    good = bad._replace(kv=torch.zeros(2, 24, device=device))
    with pytest.raises(ValueError, match="causal scores"):
        indexer_scores_fp8(q_idx, weights, keys, None, block_q=1, new=good)


def test_the_indexer_scores_its_new_token_as_if_it_had_been_written_first(device):
    q_idx, weights, k_idx = indexer_inputs(1, 8, 32, 700, device=device)
    pos = torch.tensor([640], device=device)
    new_k = randn(1, 32, seed=8, device=device)
    written = attention.quantize_keys(k_idx.clone())
    attention.write_cache(torch.zeros(700, 4, device=device), written, pos, torch.zeros(1, 4,
                          device=device), new_k)  # fmt: skip
    expected = indexer_scores_fp8(q_idx, weights, written, pos, block_q=1)
    keys = attention.quantize_keys(k_idx.clone())  # row 640 still holds a stale key
    new = attention.NewTokens(torch.zeros(700, 4, device=device), pos, torch.ones(1, 4,
                              device=device), new_k)  # fmt: skip
    scores = indexer_scores_fp8(q_idx, weights, keys, pos, block_q=1, new=new)
    assert_scores_match(scores[:, :640], expected[:, :640], 1e-6)
    own, theirs = scores[0, 640], expected[0, 640]  # the new token's own score
    assert abs(own - theirs) <= 1e-2 * abs(theirs) and theirs != 0
    assert torch.equal(new.kv_cache[pos], torch.ones(1, 4, device=device))
    assert torch.equal(keys.values.float(), written.values.float())
    with pytest.raises(ValueError, match="its own tail"):  # another query could read it
        two = attention.NewTokens(new.kv_cache, pos.repeat(2), new.kv.repeat(2, 1),
                                  new_k.repeat(2, 1))  # fmt: skip
        indexer_scores_fp8(q_idx.repeat(2, 1, 1), weights.repeat(2, 1), keys, pos.repeat(2),
                           block_q=1, new=two)  # fmt: skip


def test_one_program_select_gives_a_row_one_warp_only_when_rows_fill_the_gpu():
    # Off the GPU the plan assumes a few SMs: a decode row keeps 8 warps, a prefill chunk one.
    cpu = torch.device("cpu")
    assert default_row_programs(1, cpu) == (8, 2048)
    assert default_row_programs(4096, cpu) == (1, 512)


@pytest.mark.parametrize("case", ["sampled", "all kept", "sample misleads", "ties", "shifted"])
def test_sampled_select_picks_what_the_radix_select_picks(case, device):
    # Small enough for the interpreter: topk 16 out of up to 1,392 candidates, every 4th
    # candidate sampled, 128 kept at most; every path of the kernel against the radix select.
    # "sampled": the last two rows keep 34 and 70 scores (counted in torch); "sample
    # misleads": they would keep all, more than the cap, and fall back to the whole row.
    length, topk, window = 1400, 16, 8
    scores = randn(5, length, seed=7).to(device)
    pos = torch.tensor([3, 20, 60, 900, 1399], device=device)  # up to topk, under cap, above
    split = shift = None
    if case == "all kept":  # 23 to 63 candidates: no sample, every one kept
        pos = torch.tensor([30, 40, 50, 60, 70], device=device)
    elif case == "sample misleads":  # the sample sees only the lowest scores: too many kept
        scores[:, ::4] = -10.0
    elif case == "ties":
        scores = tied_scores(5, length).to(device)
    elif case == "shifted":
        split, shift = 700, torch.tensor([0, 5, 10, 15, 20], device=device)
    expected = select_positions_triton(scores, pos, topk, window, split, shift)
    out = select_positions_sampled(scores, pos, topk, window, split, shift, stride=4, cap=128)
    assert torch.equal(out, expected)


def test_sampled_select_bad_input(device):
    scores = randn(3, 40, device=device)
    pos = torch.arange(3, device=device)
    with pytest.raises(ValueError, match="stride >= 2"):
        select_positions_sampled(scores, pos, 4, 2, stride=1)
    with pytest.raises(ValueError, match="cap >= topk"):
        select_positions_sampled(scores, pos, 8, 2, cap=4)
    with pytest.raises(ValueError, match="fp32 scores"):
        select_positions_sampled(scores.double(), pos, 4, 2)


@pytest.mark.parametrize(
    ("seed", "topk", "stride", "cap"),
    [(0, 16, 4, 128), (1, 16, 64, 128), (2, 32, 8, 128), (3, 16, 4, 16), (4, 8, 2, 64)],
)
def test_sampled_select_matches_on_random_rows(seed, topk, stride, cap, device):
    # Sample smaller than its rank (stride 64: the floor keeps all, more than the cap), a cap
    # equal to topk, a stride of 2: the picks stay the radix select's, slot for slot.
    gen = torch.Generator().manual_seed(seed)
    scores = (torch.randn(6, 900, generator=gen) * 4).round(decimals=1).to(device)  # ties
    pos = torch.randint(0, 900, (6,), generator=gen).to(device)
    expected = select_positions_triton(scores, pos, topk, 8)
    out = select_positions_sampled(scores, pos, topk, 8, stride=stride, cap=cap)
    assert torch.equal(out, expected)
