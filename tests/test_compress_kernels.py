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
from kernels.attention.key_cache import quantize_keys


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


def step_case(kind: str, ratio: int, device, scratch: bool = False, streams: int = 3,
              d: int = 48, dk: int = 16):  # fmt: skip
    """Caches and one decode step's inputs for `streams` streams: stream s at slot
    (s * 2 + 1) % ratio of its open group, the last stream completing it. Each stream's entry
    goes to a row of its own, or with `scratch` (as the model runs) the streams that do not
    complete their group all write the scratch row, the last."""
    gen = torch.Generator().manual_seed(ratio)
    raw, entries = 20, 6
    kv_cache = torch.randn(raw + entries + 1, d, generator=gen)
    width = d + (dk if kind == "C" else 0)
    pending = (torch.randn(streams, ratio, width, generator=gen),
               torch.randn(streams, ratio, width, generator=gen))  # fmt: skip
    slot = torch.tensor([(s * 2 + 1) % ratio for s in range(streams - 1)] + [ratio - 1])
    entry_rows = torch.arange(streams) + 2
    if scratch:
        entry_rows = torch.where(slot == ratio - 1, entry_rows, entries)
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


def run_both(kv_cache, keys, pending, step):
    """(kv_cache, keys, pending) after the torch definition, then after the kernel, each
    from its own copy of the inputs."""
    copy = lambda t: t if t is None else t.clone()  # noqa: E731
    want = (copy(kv_cache), copy(keys), tuple(map(copy, pending)))
    compress_step(*want, **step)
    got = (copy(kv_cache), copy(keys), tuple(map(copy, pending)))
    compress_step_triton(*got, **step)
    return want, got


@pytest.mark.parametrize(("kind", "ratio"), [("H", 16), ("C", 4), ("H", 128), ("C", 3)])
def test_a_decode_step_matches_the_definition_for_every_slot(kind, ratio, device):
    # every stream's pooled group is written to a row of its own and compared, whatever its
    # slot: the kernel takes the slot's row from registers, the rest from the open group
    kv_cache, keys, pending, step = step_case(kind, ratio, device)
    want, got = run_both(kv_cache, keys, pending, step)
    assert relative_error(got[0], want[0]) < 1e-6
    assert torch.equal(got[2][0], want[2][0]) and torch.equal(got[2][1], want[2][1])
    if keys is not None:
        assert relative_error(got[1], want[1]) < 1e-6
    touched = torch.cat([step["raw_rows"], step["entry_rows"] + step["entry_offset"]])
    untouched = torch.ones(kv_cache.shape[0], dtype=torch.bool, device=device)
    untouched[touched] = False
    assert torch.equal(got[0][untouched], kv_cache[untouched])


def test_streams_that_do_not_complete_their_group_write_only_the_scratch_row(device):
    kv_cache, keys, pending, step = step_case("C", 4, device, scratch=True)
    want, got = run_both(kv_cache, keys, pending, step)
    # the scratch row (the last) takes whichever unfinished stream writes last
    assert relative_error(got[0][:-1], want[0][:-1]) < 1e-6
    assert relative_error(got[1][:-1], want[1][:-1]) < 1e-6
    open_rows = (torch.arange(3, device=device) + 2)[step["slot"] != 3]  # their own rows
    assert len(open_rows) and torch.equal(got[1][open_rows], keys[open_rows])


def test_a_decode_step_quantises_the_pooled_key_as_the_fp8_cache_holds_keys(device):
    kv_cache, bf16_keys, pending, step = step_case("C", 4, device)
    for name in ("kv", "index_k", "gates"):
        step[name] = step[name].bfloat16()
    kv_cache, pending = kv_cache.bfloat16(), tuple(p.bfloat16() for p in pending)
    # the kernel's own bf16 entries, quantised by quantize_keys, are what it stores as FP8
    _, (_, bf16_entries, _) = run_both(kv_cache, bf16_keys.bfloat16(), pending, step)
    keys = empty_keys(bf16_keys.shape[0], bf16_keys.shape[1], device)
    compress_step_triton(kv_cache.clone(), keys, tuple(p.clone() for p in pending), **step)
    rows = step["entry_rows"]
    want = quantize_keys(bf16_entries[rows])
    assert torch.equal(keys.values[rows].view(torch.uint8), want.values.view(torch.uint8))
    assert torch.equal(keys.scales[rows], want.scales)
    # and the torch definition takes FP8 keys too, within bf16's rounding of the entry
    fp8_keys = empty_keys(bf16_keys.shape[0], bf16_keys.shape[1], device)
    compress_step(kv_cache.clone(), fp8_keys, tuple(p.clone() for p in pending), **step)
    assert relative_error(fp8_keys.dequantize()[rows], want.dequantize()) < 2e-2


def test_a_decode_step_refuses_mismatched_buffers(device):
    kv_cache, keys, pending, step = step_case("C", 4, device)
    with pytest.raises(ValueError, match="pending"):
        compress_step_triton(kv_cache, keys, (pending[0][:, :, :-1], pending[1]), **step)
    with pytest.raises(ValueError, match="no key cache"):
        compress_step_triton(kv_cache, None, pending, **step)
    with pytest.raises(ValueError, match="one dtype"):
        compress_step_triton(kv_cache, keys, pending, **{**step, "kv": step["kv"].double()})
    with pytest.raises(ValueError, match="cache of width"):
        compress_step_triton(kv_cache[:, :-1], keys, pending, **step)
    with pytest.raises(ValueError, match="raw_rows, slot and entry_rows"):
        compress_step_triton(kv_cache, keys, pending, **{**step, "slot": step["slot"][:2]})


def test_csa_rows_move_picks_past_the_raw_rows_and_drop_them_before_the_first_entry(device):
    picked = torch.tensor([[3, 0, -1], [2, -1, -1], [1, 0, 4]], device=device)
    entry_pos = torch.tensor([4, -1, 4], device=device)
    window = torch.tensor([[9, 8], [7, -1], [6, 5]], device=device)
    want = [[103, 100, -1, 9, 8], [-1, -1, -1, 7, -1], [101, 100, 104, 6, 5]]
    assert csa_rows(picked, entry_pos, window, 100).tolist() == want
    assert csa_rows_triton(picked, entry_pos, window, 100).tolist() == want
    with pytest.raises(ValueError, match="one Q"):
        csa_rows_triton(picked, entry_pos[:2], window, 100)
    with pytest.raises(ValueError, match="contiguous"):
        csa_rows_triton(picked.t().contiguous().t(), entry_pos, window, 100)
    # int32 picks give int64 rows, as torch's where would; no window at all is fine
    assert csa_rows_triton(picked.int(), entry_pos, window, 100).dtype == torch.int64
    assert csa_rows_triton(picked, entry_pos, window[:, :0], 100).tolist() == [r[:3] for r in want]
