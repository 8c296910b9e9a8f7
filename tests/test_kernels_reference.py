"""Torch references checked against naive float64 loops written independently of them."""

import pytest
import torch
import torch.nn.functional as F
from helpers import relative_error

from kernels import attention, dense
from kernels.attention import indexer_scores, select_positions, sparse_attention
from kernels.moe import moe_reference, router_topk, shared_expert
from kernels.norm import rms_norm


def naive_moe(x, topk_ids, topk_weights, w_gate_up, w_down):
    """Token-by-token, slot-by-slot MoE in float64, h left unrounded."""
    inter = w_gate_up.shape[1] // 2
    x, w_gate_up, w_down = x.double(), w_gate_up.double(), w_down.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[t, k])
            g = w_gate_up[e, :inter] @ x[t]
            u = w_gate_up[e, inter:] @ x[t]
            out[t] += float(topk_weights[t, k]) * (w_down[e] @ (F.silu(g) * u))
    return out


def make_moe(tokens, hidden, inter, experts, top_k, dtype, seed, topk_ids=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype)
    w_down = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
    ids, weights = router_topk(torch.randn(tokens, experts, generator=gen), top_k)
    if topk_ids is not None:
        ids = topk_ids
    return x, ids, weights, w_gate_up, w_down


def test_rms_norm_matches_float64_and_keeps_dtype():
    x = torch.randn(5, 72).to(torch.bfloat16)
    weight = torch.randn(72)
    x64 = x.double()
    expected = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    out = rms_norm(x, weight)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, expected) < 1e-2


def test_dense_linear_is_x_times_weight_transposed():
    x, weight = torch.randn(7, 72), torch.randn(40, 72)
    assert dense.VARIANTS["bf16"] is dense.linear
    assert relative_error(dense.linear(x, weight), x.double() @ weight.double().T) < 1e-6


def test_router_topk_picks_largest_logits_and_normalises():
    logits = torch.randn(9, 8)
    ids, weights = router_topk(logits, 3)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    expected_ids = logits.argsort(dim=-1, descending=True)[:, :3]
    assert torch.equal(ids.long(), expected_ids)
    expected = torch.softmax(logits.gather(1, expected_ids), dim=-1)
    assert torch.allclose(weights, expected)


@pytest.mark.parametrize(
    ("tokens", "hidden", "inter", "ids"),
    [
        (1, 64, 32, None),
        (37, 72, 40, None),
        (6, 64, 32, torch.tensor([[0, 5]] * 3 + [[5, 0]] * 3)),  # six of eight experts empty
        (5, 72, 40, torch.full((5, 2), 3)),  # everything on one expert
    ],
)
def test_moe_reference_matches_naive_loops(tokens, hidden, inter, ids):
    problem = make_moe(tokens, hidden, inter, 8, 2, torch.float32, seed=tokens, topk_ids=ids)
    out = moe_reference(*problem)
    assert out.dtype == torch.float32
    assert relative_error(out, naive_moe(*problem)) < 1e-5


def test_moe_reference_bf16_rounds_only_like_a_kernel():
    problem = make_moe(37, 72, 40, 8, 2, torch.bfloat16, seed=1)
    out = moe_reference(*problem)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, naive_moe(*problem)) < 1e-2


def test_shared_expert_matches_naive_and_uses_given_linear():
    x, _, _, w_gate_up, w_down = make_moe(5, 72, 40, 1, 1, torch.float32, seed=2)
    expected = naive_moe(
        x, torch.zeros(5, 1, dtype=torch.int32), torch.ones(5, 1), w_gate_up, w_down
    )
    assert relative_error(shared_expert(x, w_gate_up[0], w_down[0]), expected) < 1e-5

    calls = []

    def counting_linear(a, b):
        calls.append(b.shape)
        return a @ b.T

    shared_expert(x, w_gate_up[0], w_down[0], linear=counting_linear)
    assert calls == [w_gate_up[0].shape, w_down[0].shape]


def test_indexer_scores_matches_naive_loops_across_query_blocks():
    gen = torch.Generator().manual_seed(3)
    q_idx, weights = torch.randn(10, 3, 16, generator=gen), torch.randn(10, 3, generator=gen)
    k_idx = torch.randn(13, 16, generator=gen)
    expected = torch.zeros(10, 13, dtype=torch.float64)
    for q in range(10):
        for j in range(13):
            for h in range(3):
                dot = float(q_idx[q, h].double() @ k_idx[j].double())
                expected[q, j] += float(weights[q, h]) * max(dot, 0.0)
    out = indexer_scores(q_idx, weights, k_idx, query_block=4)
    assert out.dtype == torch.float32
    assert relative_error(out, expected) < 1e-5


def naive_select(scores, query_pos, topk, window):
    rows = []
    for q, p in enumerate(query_pos.tolist()):
        length = scores.shape[1]
        earlier = [j for j in range(length) if j <= p - window]
        best = sorted(earlier, key=lambda j: -float(scores[q, j]))[:topk]
        recent = [j if 0 <= j < length else -1 for j in range(p, p - window, -1)]
        rows.append(best + [-1] * (topk - len(best)) + recent)
    return torch.tensor(rows, dtype=torch.int64)


@pytest.mark.parametrize(
    ("length", "positions", "topk", "window"),
    [
        (20, [19, 12, 7], 4, 3),  # enough earlier positions
        (20, [19, 5, 0], 30, 2),  # topk larger than L
        (20, [0, 1, 2, 3], 2, 4),  # window reaching before the start: no sparse part at all
        (9, [8, 4], 3, 0),  # no window
    ],
)
def test_select_positions_matches_brute_force(length, positions, topk, window):
    scores = torch.rand(len(positions), length, generator=torch.Generator().manual_seed(length))
    query_pos = torch.tensor(positions)
    out = select_positions(scores, query_pos, topk, window)
    assert out.dtype == torch.int64
    assert torch.equal(out, naive_select(scores, query_pos, topk, window))
    assert (out <= query_pos[:, None]).all(), "a future position was selected"


def naive_attention(q, kv, index, scale):
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        rows = [int(j) for j in index[i] if j >= 0]
        if not rows:
            continue
        keys = kv[rows].double()
        for h in range(q.shape[1]):
            probs = torch.softmax(scale * (keys @ q[i, h].double()), dim=0)
            out[i, h] = probs @ keys
    return out


@pytest.mark.parametrize("scale", [None, 0.3])
def test_sparse_attention_matches_naive_and_zeroes_empty_queries(scale):
    gen = torch.Generator().manual_seed(4)
    q, kv = torch.randn(6, 3, 16, generator=gen), torch.randn(20, 16, generator=gen)
    index = torch.randint(0, 20, (6, 7), generator=gen)
    index[1, 3:] = -1  # partly used
    index[4] = -1  # nothing to attend to
    out = sparse_attention(q, kv, index, scale, query_block=4)
    expected = naive_attention(q, kv, index, 16**-0.5 if scale is None else scale)
    assert relative_error(out, expected) < 1e-5
    assert torch.equal(out[4], torch.zeros(3, 16))


def test_attention_variant_calls_reference():
    gen = torch.Generator().manual_seed(5)
    q, kv = torch.randn(3, 2, 16, generator=gen), torch.randn(9, 16, generator=gen)
    index = torch.randint(-1, 9, (3, 5), generator=gen)
    variant = attention.VARIANTS["torch"]
    assert torch.equal(variant(q, kv, index), sparse_attention(q, kv, index))


def test_causal_indexer_scores_skip_keys_no_query_of_a_block_sees():
    """On the CPU a causal block reads keys only up to its latest query: the scores equal the
    full product masked to the past, -inf after each query's position."""
    from kernels.attention.reference import indexer_scores

    gen = torch.Generator().manual_seed(7)
    q, k = torch.randn(40, 2, 8, generator=gen), torch.randn(100, 8, generator=gen)
    weights = torch.rand(40, 2, generator=gen)
    pos = torch.arange(30, 70)
    full = (weights[:, :, None] * torch.relu(torch.einsum("qhd,ld->qhl", q, k))).sum(1)
    full = full.masked_fill(torch.arange(100)[None, :] > pos[:, None], float("-inf"))
    got = indexer_scores(q, weights, k, pos, query_block=16)
    assert torch.equal(torch.isinf(got), torch.isinf(full))
    assert torch.allclose(got[~torch.isinf(got)], full[~torch.isinf(full)], rtol=1e-5, atol=1e-5)
