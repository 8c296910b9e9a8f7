"""The Triton indexer and top-k sparse attention under the interpreter against the torch
references: odd sizes, one query, causal masks, more top-k than positions, the window at the
start of the sequence, split (decode) and unsplit (prefill) forms, and bad input."""

import pytest
import torch
from helpers import relative_error

import kernels.attention as attention
from kernels.attention import (
    indexer_scores,
    indexer_scores_triton,
    select_positions,
    sparse_attention,
    sparse_attention_triton,
)


def randn(*shape, seed=0, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def indexer_inputs(queries, heads, dim, length, dtype=torch.float32, device="cpu"):
    return (
        randn(queries, heads, dim, seed=1, dtype=dtype, device=device),
        randn(queries, heads, seed=2, device=device) * heads**-0.5,
        randn(length, dim, seed=3, dtype=dtype, device=device),
    )


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


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_attention_matches_the_reference(splits, dtype, device):
    q, kv, index = sparse_inputs(5, 20, 40, 70, 75, dtype, device)  # 20 heads: two head blocks
    index[2] = -1  # a query with no valid slot: zeros, not NaN
    out = sparse_attention_triton(q, kv, index, splits=splits)
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
    assert torch.equal(index, ref_index)


def test_variants_share_one_interface(device):
    assert set(attention.VARIANTS) == {"torch", "triton"}
    triton_variant = attention.VARIANTS["triton"]
    assert triton_variant.indexer_scores is indexer_scores_triton
    assert triton_variant.select_positions is select_positions
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
