"""The compressor's kernels (`kernels.attention.compress`) against its torch definition: a
prefill chunk's groups pooled, and a decode step's raw row, open group, entry and key written
in one launch, bf16 and FP8 keys alike."""

import pytest
import torch
from helpers import relative_error

from kernels.attention.compress import (
    compress_step,
    compress_step_triton,
    csa_rows,
    csa_rows_triton,
    pool_groups,
    pool_groups_triton,
)
from kernels.attention.formats import empty_keys
from kernels.attention.indexer_fp8 import quantize_keys


@pytest.mark.parametrize(("ratio", "width"), [(4, 40), (128, 24), (3, 20), (16, 640)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pooled_groups_match_the_definition(ratio, width, dtype, device):
    gen = torch.Generator().manual_seed(ratio + width)
    rows = 5 * ratio
    values = torch.randn(rows, width, generator=gen).to(device, dtype)
    gates = (3 * torch.randn(rows, width + 7, generator=gen)).to(device, dtype)[:, :width]
    got = pool_groups_triton(values, gates, ratio)
    want = pool_groups(values, gates, ratio)
    assert got.dtype == dtype and got.shape == (5, width)
    assert relative_error(got.float(), want.float()) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_pooling_refuses_a_partial_group(device):
    values = torch.zeros(10, 8, device=device)
    with pytest.raises(ValueError, match="whole groups of 4 rows"):
        pool_groups_triton(values, values, 4)


def step_case(kind: str, ratio: int, device, streams: int = 3, d: int = 48, dk: int = 16):
    """Caches and one decode step's inputs for `streams` streams: stream s at slot
    (s * 2 + 1) % ratio of its open group, the last stream completing it."""
    gen = torch.Generator().manual_seed(ratio)
    raw, entries = 20, 6
    kv_cache = torch.randn(raw + entries + 1, d, generator=gen)
    width = d + (dk if kind == "C" else 0)
    pending = (torch.randn(streams, ratio, width, generator=gen),
               torch.randn(streams, ratio, width, generator=gen))  # fmt: skip
    slot = torch.tensor([(s * 2 + 1) % ratio for s in range(streams - 1)] + [ratio - 1])
    entry_rows = torch.where(slot == ratio - 1, torch.arange(streams) + 2, entries)
    step = {
        "raw_rows": torch.arange(streams) * 3 + 1,
        "slot": slot,
        "entry_rows": entry_rows,
        "entry_offset": raw,
        "kv": torch.randn(streams, d, generator=gen),
        "index_k": torch.randn(streams, dk, generator=gen) if kind == "C" else None,
        "gates": torch.randn(streams, d + dk, generator=gen),
    }
    keys = torch.randn(entries + 1, dk, generator=gen) if kind == "C" else None
    to = lambda t: t.to(device) if torch.is_tensor(t) else t  # noqa: E731
    return to(kv_cache), to(keys), tuple(map(to, pending)), {k: to(v) for k, v in step.items()}


@pytest.mark.parametrize(("kind", "ratio"), [("H", 16), ("C", 4), ("H", 128), ("C", 3)])
def test_a_decode_step_matches_the_definition(kind, ratio, device):
    kv_cache, keys, pending, step = step_case(kind, ratio, device)
    want_keys = None if keys is None else keys.clone()
    want = (kv_cache.clone(), want_keys, tuple(p.clone() for p in pending))
    compress_step(want[0], want[1], want[2], **step)
    compress_step_triton(kv_cache, keys, pending, **step)
    # the scratch row (the last) takes whichever unfinished stream writes last
    assert relative_error(kv_cache[:-1], want[0][:-1]) < 1e-6
    assert torch.equal(pending[0], want[2][0]) and torch.equal(pending[1], want[2][1])
    if keys is not None:
        assert relative_error(keys[:-1], want[1][:-1]) < 1e-6


def test_a_decode_step_quantises_the_pooled_key_as_the_fp8_cache_holds_keys(device):
    kv_cache, bf16_keys, pending, step = step_case("C", 4, device)
    for name in ("kv", "index_k", "gates"):
        step[name] = step[name].bfloat16()
    kv_cache, pending = kv_cache.bfloat16(), tuple(p.bfloat16() for p in pending)
    want_keys = bf16_keys.bfloat16()
    want_cache = kv_cache.clone()
    compress_step(want_cache, want_keys, tuple(p.clone() for p in pending), **step)
    keys = empty_keys(bf16_keys.shape[0], bf16_keys.shape[1], device)
    compress_step_triton(kv_cache, keys, pending, **step)
    assert relative_error(kv_cache[:-1].float(), want_cache[:-1].float()) < 1e-2
    rows = step["entry_rows"][-1:]  # the one stream that completed its group
    want = quantize_keys(want_keys[rows])
    assert relative_error(keys.dequantize()[rows], want.dequantize()) < 2e-2
    assert torch.equal(keys.scales[rows], want.scales)


def test_a_decode_step_refuses_mismatched_buffers(device):
    kv_cache, keys, pending, step = step_case("C", 4, device)
    with pytest.raises(ValueError, match="pending"):
        compress_step_triton(kv_cache, keys, (pending[0][:, :, :-1], pending[1]), **step)
    with pytest.raises(ValueError, match="no key cache"):
        compress_step_triton(kv_cache, None, pending, **step)


def test_csa_rows_move_picks_past_the_raw_rows_and_drop_them_before_the_first_entry(device):
    picked = torch.tensor([[3, 0, -1], [2, -1, -1], [1, 0, 4]], device=device)
    entry_pos = torch.tensor([4, -1, 4], device=device)
    window = torch.tensor([[9, 8], [7, -1], [6, 5]], device=device)
    want = [[103, 100, -1, 9, 8], [-1, -1, -1, 7, -1], [101, 100, 104, 6, 5]]
    assert csa_rows(picked, entry_pos, window, 100).tolist() == want
    assert csa_rows_triton(picked, entry_pos, window, 100).tolist() == want
    with pytest.raises(ValueError, match="one Q"):
        csa_rows_triton(picked, entry_pos[:2], window, 100)
