"""The DeepGEMM indexer peer without DeepGEMM: its key ranges, masks, block table and fused
FP8 page layout, the q-scale folding (the SM90 kernels' arithmetic emulated in torch against
`indexer_scores_fp8`), and both callables through a stand-in deep_gemm that checks what
DeepGEMM 2.8's host code asserts and computes what its SM90 kernels are documented to
(sm90_fp8_mqa_logits.cuh: row q holds keys [start, end) from column 0, nothing after;
sm90_fp8_paged_mqa_logits.cuh: the pages a query reads, whole), writing NaN where they
write nothing, so a missing -inf fill or a wrong layout shows here. On the GPU box
the `gpu` test runs the real kernels on an H200."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from kernels.attention.formats import QuantizedKeys
from kernels.attention.reference import indexer_scores, indexer_scores_fp8
from workbench.peers import deepgemm_indexer as dgi
from workbench.workloads.checks import relative_error

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU says")


def _inputs(queries: int, heads: int, dim: int, length: int, device: str = "cpu"):
    gen = torch.Generator().manual_seed(queries * 7 + length)
    index_q = torch.randn(queries, heads, dim, generator=gen).to(device, torch.bfloat16)
    index_w = (torch.randn(queries, heads, generator=gen) * heads**-0.5).to(device)
    keys = torch.randn(length, dim, generator=gen).to(device, torch.bfloat16)
    return index_q, index_w, keys


def _assert_scores_match(out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> None:
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert not torch.isnan(out).any()
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out)), "different keys masked"
    assert (out[~finite] == float("-inf")).all()
    assert relative_error(out[finite], ref[finite]) < tolerance


def _unpack_pages(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pages, block, d) FP8 values and (pages, block) fp32 scales, read from the fused cache
    the way DeepGEMM's host code derives them (attention.hpp: from_blob at the page base and
    at base + block * d, page stride `stride(0)` bytes)."""
    pages, block, _, width = cache.shape
    dim, stride = width - dgi.SCALE_BYTES, cache.stride(0)
    values = cache.as_strided((pages, block, dim), (stride, dim, 1)).view(torch.float8_e4m3fn)
    raw = cache.as_strided((pages, block * 4), (stride, 1), cache.storage_offset() + block * dim)
    return values, raw.contiguous().view(torch.float32)


def _head_sum(q8: torch.Tensor, weights: torch.Tensor, k8: torch.Tensor, ks: torch.Tensor):
    """What the SM90 kernels compute for each (query, key): ks[j] * sum_h w[q, h] *
    relu(q8[q, h] . k8[j]), FP8 products in fp32."""
    dots = torch.relu(torch.einsum("qhd,ld->qhl", q8.float(), k8.float()))
    return (dots * weights[:, :, None]).sum(1) * ks[None, :]


class DeepGemmStandIn(types.ModuleType):
    """deep_gemm 2.8's indexer API on the CPU: its SM90 asserts, its outputs' contents."""

    __version__ = "2.8.1"
    NUM_SMS = 132

    def __init__(self) -> None:
        super().__init__("deep_gemm")
        self.calls: list[str] = []

    def get_num_sms(self) -> int:
        return self.NUM_SMS

    def get_paged_mqa_logits_metadata(self, context_lens, block_kv, num_sms, indices=None):
        assert context_lens.dim() == 2 and context_lens.dtype == torch.int32
        assert context_lens.is_contiguous() and block_kv in (32, 64) and indices is None
        self.calls.append("metadata")
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    @staticmethod
    def _check_q(q_fp, q_sf, weights, rows, heads, dim):
        assert q_sf is None  # SM90 FP8: no q scales
        assert q_fp.dtype == torch.float8_e4m3fn and q_fp.is_contiguous()
        assert heads in (32, 64) and dim in (32, 64, 128)
        assert weights.shape == (rows, heads) and weights.dtype == torch.float32
        assert weights.stride(1) == 1 and weights.stride(0) * 4 % 16 == 0

    def fp8_fp4_mqa_logits(self, q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                           max_seqlen_k, schedule_meta=None):  # fmt: skip
        (q_fp, q_sf), (kv_fp, kv_sf) = q, kv
        seq_len, heads, dim = q_fp.shape
        self._check_q(q_fp, q_sf, weights, seq_len, heads, dim)
        assert kv_fp.dtype == torch.float8_e4m3fn and kv_fp.is_contiguous()
        assert kv_fp.shape[1] == dim and kv_sf.shape == kv_fp.shape[:1]
        assert kv_sf.dtype == torch.float32 and kv_sf.is_contiguous()
        for ranges in (cu_seq_len_k_start, cu_seq_len_k_end):
            assert ranges.shape == (seq_len,) and ranges.dtype == torch.int32
            assert ranges.is_contiguous()
        assert max_seqlen_k > 0 and schedule_meta is None
        self.calls.append("mqa_logits")
        full = _head_sum(q_fp, weights, kv_fp, kv_sf)
        stride = -(-max_seqlen_k // 256) * 256  # rows padded to whole 1024-byte lines
        out = torch.full((seq_len, stride), float("nan"))[:, :max_seqlen_k]
        for row, (start, end) in enumerate(zip(cu_seq_len_k_start.tolist(),
                                               cu_seq_len_k_end.tolist())):  # fmt: skip
            out[row, : end - start] = full[row, start:end]  # compressed: from column 0
        return out

    def fp8_fp4_paged_mqa_logits(self, q, kv_cache, weights, context_lens, block_table,
                                 schedule_meta, max_context_len, indices=None):  # fmt: skip
        q_fp, q_sf = q
        batch, next_n, heads, dim = q_fp.shape
        self._check_q(q_fp, q_sf, weights, batch * next_n, heads, dim)
        pages, block, kv_heads, width = kv_cache.shape
        assert kv_cache.dtype == torch.uint8 and block in (32, 64) and kv_heads == 1
        assert width == dim + 4 and kv_cache.stride(1) == width and kv_cache.stride(3) == 1
        assert kv_cache.stride(0) % 4 == 0
        assert block_table.dtype == torch.int32 and block_table.shape[0] == batch
        assert block_table.stride(1) == 1
        assert context_lens.shape == (batch, next_n) and context_lens.dtype == torch.int32
        assert schedule_meta.shape == (self.NUM_SMS + 1, 2) and indices is None
        assert next_n == 1  # what the adapter uses (SM90 takes 1, 2 or 4)
        self.calls.append("paged_mqa_logits")
        values, scales = _unpack_pages(kv_cache)
        out = torch.full((batch, -(-max_context_len // 256) * 256), float("nan"))
        for row in range(batch):
            read = -(-int(context_lens[row, 0]) // block)
            table = block_table[row, :read].long()
            keys = values[table].reshape(-1, dim)  # the padding of the last page too
            tile = _head_sum(q_fp[row], weights[row : row + 1], keys, scales[table].reshape(-1))
            out[row, : tile.shape[1]] = tile[0]  # whole tiles, past the context length too
        return out[:, :max_context_len]


@pytest.fixture
def standin(monkeypatch) -> DeepGemmStandIn:
    module = DeepGemmStandIn()
    monkeypatch.setitem(sys.modules, "deep_gemm", module)
    return module


@cpu_only
def test_unavailable_on_a_cpu_with_how_to_install():
    ok, why = dgi.available()
    assert not ok
    assert ("DeepGEMM is not installed" in why and "fetch_peer_wheels.py" in why) or (
        why.startswith("no CUDA GPU")
    )


def test_unavailable_without_deep_gemm_names_the_wheel(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm raises ImportError
    ok, why = dgi.available()
    assert not ok
    assert why.startswith("DeepGEMM is not installed")
    assert "vllm/third_party/deep_gemm" in why and "fetch_peer_wheels.py" in why


def test_available_only_on_sm90_with_the_2_8_names(monkeypatch, standin):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    assert dgi.available() == (True, "DeepGEMM 2.8.1")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (10, 0))
    ok, why = dgi.available()
    assert not ok and "SM90's operand formats" in why and "sm_100" in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.delattr(DeepGemmStandIn, "fp8_fp4_paged_mqa_logits")
    ok, why = dgi.available()
    assert not ok and "predates fp8_fp4_mqa_logits" in why and "fetch_peer_wheels.py" in why


def test_key_ranges_are_causal_int32_from_key_zero():
    start, end = dgi.key_ranges(torch.tensor([-1, 0, 3, 9, 20]), 10)
    assert start.dtype == end.dtype == torch.int32
    assert start.tolist() == [0] * 5
    assert end.tolist() == [0, 1, 4, 10, 10]  # nothing, key 0, keys 0..3, all, all (clamped)


def test_outside_marks_the_keys_past_each_end():
    mask = dgi.outside(torch.tensor([0, 2, 5], dtype=torch.int32), 5)
    assert mask.tolist() == [
        [True] * 5,
        [False, False, True, True, True],
        [False] * 5,
    ]


def test_block_table_gives_every_query_the_pages_in_order():
    table = dgi.block_table(3, 4, torch.device("cpu"))
    assert table.dtype == torch.int32 and table.is_contiguous() and table.shape == (3, 4)
    assert table.tolist() == [[0, 1, 2, 3]] * 3


@pytest.mark.parametrize(("length", "block"), [(150, 64), (128, 64), (70, 32), (1, 64)])
def test_paged_cache_holds_each_page_values_then_scales(length, block):
    quantized = dgi.quantize_operands(*_inputs(1, 32, 128, length)).keys
    cache = dgi.paged_cache(quantized, block)
    pages = -(-length // block)
    assert cache.dtype == torch.uint8 and cache.shape == (pages, block, 1, 128 + 4)
    assert cache.stride(1) == 132 and cache.stride(3) == 1
    assert cache.stride(0) % 16 == 0 and block * 128 % 16 == 0  # TMA: 16-byte aligned rows
    values, scales = _unpack_pages(cache)
    flat_values = values.reshape(-1, 128).view(torch.uint8)
    assert torch.equal(flat_values[:length], quantized.values.view(torch.uint8))
    assert torch.equal(scales.reshape(-1)[:length], quantized.scales)
    assert not flat_values[length:].any() and not scales.reshape(-1)[length:].any()  # padding


def test_folded_q_scales_reproduce_the_fp8_reference():
    """The SM90 kernels' arithmetic on the converted operands (FP8 q without scales, weights
    times the q scales, the key scale after the head sum) is `indexer_scores_fp8`."""
    index_q, index_w, keys = _inputs(6, 64, 128, 90)
    ops = dgi.quantize_operands(index_q, index_w, keys)
    assert ops.q.shape == (6, 64, 128) and ops.q.dtype == torch.float8_e4m3fn
    assert ops.weights.shape == (6, 64) and ops.weights.dtype == torch.float32
    assert isinstance(ops.keys, QuantizedKeys) and ops.keys.scales.shape == (90,)
    ratio = ops.weights / index_w
    assert torch.equal(ratio, torch.exp2(torch.log2(ratio).round()))  # powers of two
    ref = indexer_scores_fp8(index_q, index_w, ops.keys)
    assert relative_error(_head_sum(ops.q, ops.weights, *ops.keys), ref) < 1e-6
    assert dgi.quantize_operands(index_q, index_w, ops.keys).keys is ops.keys  # kept as given


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((3, 16, 128), (3, 16), (50, 128)), "h in \\(32, 64\\)"),
        (((3, 32, 96), (3, 32), (50, 96)), "d in \\(32, 64, 128\\)"),
        (((3, 32, 64), (3, 16), (50, 64)), "index_w \\(Q, h\\)"),
        (((3, 32, 64), (3, 32), (50, 32)), "keys must be \\(L, 64\\)"),
    ],
)
def test_shapes_deepgemm_cannot_take_are_refused(shapes, match):
    q, w, k = (torch.randn(*shape) for shape in shapes)
    with pytest.raises(ValueError, match=match):
        dgi.quantize_operands(q.bfloat16(), w, k.bfloat16())


@pytest.mark.parametrize(
    ("heads", "pos"),
    [
        (64, torch.arange(150 - 5, 150)),  # a prefill piece ending at the last key
        (32, torch.tensor([0, 3, 63, 64, 100, 149])),  # early queries see a few keys
        (64, torch.tensor([-1, 200])),  # none, and all (clamped)
    ],
)
def test_prefill_through_the_stand_in_matches_the_reference(standin, heads, pos):
    index_q, index_w, keys = _inputs(pos.numel(), heads, 64, 150)
    logits = dgi.prepare_prefill(index_q, index_w, keys, pos)
    assert standin.calls == ["mqa_logits"]  # compiled in prepare, once
    out = logits()
    assert standin.calls == ["mqa_logits"] * 2
    quantized = dgi.quantize_operands(index_q, index_w, keys).keys
    ref = indexer_scores_fp8(index_q, index_w, quantized, pos.clamp(max=149))
    _assert_scores_match(out, ref, 1e-5)


@pytest.mark.parametrize(
    ("length", "pos"),
    [
        (150, torch.tensor([149])),  # one decode query at the last key, last page partial
        (128, torch.tensor([127])),  # whole pages
        (150, torch.tensor([0, 63, 64, 149])),  # four streams' positions
    ],
)
def test_decode_through_the_stand_in_matches_the_reference(standin, length, pos):
    index_q, index_w, keys = _inputs(pos.numel(), 64, 128, length)
    logits = dgi.prepare_decode(index_q, index_w, keys, pos)
    assert standin.calls == ["metadata", "paged_mqa_logits"]  # schedule and compile, once
    out = logits()
    assert standin.calls[1:] == ["paged_mqa_logits"] * 2
    quantized = dgi.quantize_operands(index_q, index_w, keys).keys
    _assert_scores_match(out, indexer_scores_fp8(index_q, index_w, quantized, pos), 1e-5)


def test_pos_must_name_one_position_per_query(standin):
    index_q, index_w, keys = _inputs(3, 32, 64, 40)
    with pytest.raises(ValueError, match="pos must be \\(Q,\\) = \\(3,\\)"):
        dgi.prepare_prefill(index_q, index_w, keys, torch.arange(2))
    with pytest.raises(ValueError, match="pos must be"):
        dgi.prepare_decode(index_q, index_w, keys, torch.arange(3)[:, None])


def test_peer_note_says_what_the_timed_call_holds():
    assert "outside the timed call" in dgi.PEER_NOTE and "-inf" in dgi.PEER_NOTE


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("prepare", "queries", "length", "pos"),
    [
        ("prefill", 37, 1000, None),  # odd Q (DeepGEMM tiles 2 queries), L off every block
        ("prefill", 4, 700, [0, 255, 256, 699]),
        ("decode", 1, 4133, None),  # one query at the last key, last page partial
        ("decode", 3, 4133, [5, 64, 4000]),
    ],
)
def test_deepgemm_computes_the_fp8_indexer(prepare, queries, length, pos):
    """The real kernels on an H200 against `indexer_scores_fp8` on the same FP8 operands (the
    bound the workbench's own FP8 indexer meets; only summation order differs) and against the
    unquantised fp32 scores at FP8's 5e-2, with -inf exactly past each query's position."""
    ok, why = dgi.available()
    if not ok:
        pytest.skip(why)
    index_q, index_w, keys = _inputs(queries, 64, 128, length, "cuda")
    pos = torch.arange(length - queries, length) if pos is None else torch.tensor(pos)
    pos = pos.cuda()
    call = {"prefill": dgi.prepare_prefill, "decode": dgi.prepare_decode}[prepare]
    out = call(index_q, index_w, keys, pos)()
    torch.cuda.synchronize()
    assert out.shape == (queries, length) and out.dtype == torch.float32
    quantized = dgi.quantize_operands(index_q, index_w, keys).keys
    _assert_scores_match(out, indexer_scores_fp8(index_q, index_w, quantized, pos), 1e-2)
    fp32 = indexer_scores(index_q.float(), index_w, keys.float(), pos)
    _assert_scores_match(out, fp32, 5e-2)
