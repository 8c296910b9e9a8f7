"""Triton routing pieces (histogram, scans, permutation, combine) against their torch references."""

import pytest
import torch

from kernels.moe.flat import FlatLayout
from kernels.moe.routing import (
    MoeShape,
    combine_reference,
    expert_offsets_reference,
    sort_slots,
)
from kernels.moe.routing_kernels import (
    COUNT_BLOCK,
    SLOT_BLOCK,
    SMALL_SLOTS,
    combine,
    expert_counts,
    expert_offsets_parallel,
    expert_offsets_serial,
    permute,
    small_layout,
)
from kernels.moe.w8a8_wgmma import row_table


def random_ids(tokens, top_k, experts, seed, device, skew=False):
    """(T, K) int32 expert ids; skewed draws put most slots on experts 0 and 1."""
    gen = torch.Generator().manual_seed(seed)
    if skew:
        probs = torch.full((experts,), 0.1 / max(experts - 2, 1))
        probs[:2] = 0.45
        ids = torch.multinomial(probs, tokens * top_k, replacement=True, generator=gen)
    else:
        ids = torch.randint(0, experts, (tokens * top_k,), generator=gen)
    return ids.view(tokens, top_k).to(torch.int32).to(device)


ROUTINGS = [
    # (tokens, top_k, experts, skew): one slot; E not a power of two; several permutation
    # blocks; several histogram programs, skewed
    (1, 1, 1, False),
    (5, 2, 13, False),
    (37, 3, 384, False),
    (700, 2, 8, True),
    (1100, 4, 384, True),
]
assert SLOT_BLOCK < 700 * 2 and 2 * COUNT_BLOCK < 1100 * 4  # the blocks the cases must span


@pytest.mark.parametrize(("tokens", "top_k", "experts", "skew"), ROUTINGS)
def test_expert_counts_match_bincount(device, tokens, top_k, experts, skew):
    ids = random_ids(tokens, top_k, experts, tokens, device, skew)
    want = torch.bincount(ids.flatten().long().cpu(), minlength=experts).to(torch.int32)
    assert torch.equal(expert_counts(ids, experts).cpu(), want)


def test_counts_span_several_programs(device):
    ids = torch.full((3 * COUNT_BLOCK + 5, 1), 2, dtype=torch.int32, device=device)
    assert expert_counts(ids, 4).tolist() == [0, 0, 3 * COUNT_BLOCK + 5, 0]
    ids = random_ids(COUNT_BLOCK + 7, 2, 384, 5, device)  # 384 experts in 512 bins
    want = torch.bincount(ids.flatten().long().cpu(), minlength=384).to(torch.int32)
    assert torch.equal(expert_counts(ids, 384).cpu(), want)


@pytest.mark.parametrize("tile", [1, 16, 64])
@pytest.mark.parametrize("experts", [1, 7, 384])
def test_serial_and_parallel_scans_agree(device, experts, tile):
    gen = torch.Generator().manual_seed(experts + tile)
    counts = torch.randint(0, 100, (experts,), generator=gen, dtype=torch.int32)
    counts[::3] = 0  # experts without slots own no rows and no tiles
    counts = counts.to(device)
    serial = expert_offsets_serial(counts, tile)
    parallel = expert_offsets_parallel(counts, tile)
    assert torch.equal(serial, parallel)
    assert torch.equal(parallel.cpu(), expert_offsets_reference(counts.cpu(), tile))
    assert serial.shape == (experts + 1,) and serial[0] == 0


def test_scans_reject_a_zero_tile(device):
    counts = torch.ones(4, dtype=torch.int32, device=device)
    for scan in (expert_offsets_serial, expert_offsets_parallel):
        with pytest.raises(ValueError, match="tile=0 must be >= 1"):
            scan(counts, 0)


@pytest.mark.parametrize(("tokens", "top_k", "experts", "skew"), ROUTINGS)
def test_permute_groups_slots_by_expert(device, tokens, top_k, experts, skew):
    ids = random_ids(tokens, top_k, experts, tokens + 1, device, skew)
    offsets = expert_offsets_parallel(expert_counts(ids, experts))
    order = permute(ids, offsets).cpu()
    reference, counts = sort_slots(ids.cpu(), experts)
    # Each expert's range holds exactly its slots; the order inside a range is unspecified.
    assert sorted(order.tolist()) == list(range(tokens * top_k))
    for expert, (lo, hi) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        assert hi - lo == counts[expert]
        assert torch.equal(order[lo:hi].sort().values, reference[lo:hi].sort().values)


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "skew", "tile"),
    [(1, 1, 1, False, 1), (6, 6, 384, False, 16), (5, 2, 13, True, 4), (42, 6, 256, True, 64),
     (32, 8, 384, False, 16)],  # the last: SMALL_SLOTS slots exactly
)  # fmt: skip
def test_small_layout_is_the_layout_of_the_separate_kernels(
    device, tokens, top_k, experts, skew, tile
):
    ids = random_ids(tokens, top_k, experts, tokens + experts, device, skew)
    counts, offsets, tile_offsets, order = small_layout(ids, experts, tile)
    assert torch.equal(counts, expert_counts(ids, experts))
    assert torch.equal(offsets, expert_offsets_parallel(counts))
    assert torch.equal(tile_offsets, expert_offsets_parallel(counts, tile))
    # each expert's slots in ascending order: a stable sort of the slots by expert
    want = torch.sort(ids.flatten().long().cpu(), stable=True).indices.to(torch.int32)
    assert torch.equal(order.cpu(), want)


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "skew", "tile"),
    [(1, 1, 1, False, 8), (6, 6, 384, False, 8), (5, 2, 13, True, 4), (42, 6, 16, True, 8)],
)  # fmt: skip
def test_small_layout_writes_the_row_table_as_its_own_launch_does(
    device, tokens, top_k, experts, skew, tile
):
    """The Gluon INT4 decode kernels' table of row tiles, from the layout's launch, equals
    `row_table`'s, a launch later: each sorted row's routing weight, and each row tile's
    (expert, first row, rows owned) (the skewed routings give experts several tiles)."""
    ids = random_ids(tokens, top_k, experts, tokens + experts, device, skew)
    weights = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)).to(device)
    shape = MoeShape(tokens=tokens, hidden=128, experts=experts, inter=128, top_k=top_k)
    layout, (row_weights, tile_info) = FlatLayout.with_row_table(ids, weights, shape, tile)
    assert torch.equal(layout.sorted_slots, FlatLayout.of(ids, weights, shape, tile).sorted_slots)
    want_weights, want_info = row_table(layout, shape, tile)
    tiles = int(layout.tile_offsets[-1])
    assert torch.equal(row_weights, want_weights)
    assert torch.equal(tile_info[:tiles, :3], want_info[:tiles, :3])


def test_small_layout_refuses_more_slots_than_it_compares(device):
    ids = torch.zeros(SMALL_SLOTS + 1, 1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=f"up to {SMALL_SLOTS} slots; got {SMALL_SLOTS + 1}"):
        small_layout(ids, 4, 1)


def test_permute_into_padded_rows(device):
    ids = torch.tensor([[2, 0], [2, 1], [2, 0]], dtype=torch.int32, device=device)
    tile_offsets = expert_offsets_parallel(expert_counts(ids, 4), 4)  # blocks of 4 rows
    padded = permute(ids, tile_offsets * 4, size=16, fill=6).cpu()
    assert sorted(padded[0:4].tolist()) == [1, 5, 6, 6]  # expert 0: slots 1, 5, then fill
    assert padded[4:8].tolist() == [3, 6, 6, 6]  # expert 1
    assert sorted(padded[8:12].tolist()) == [0, 2, 4, 6]  # expert 2; expert 3 has no block
    assert padded[12:].tolist() == [6] * 4


# 6 and 9 splits: more than down's split-K partials at decode (three at T=1)
@pytest.mark.parametrize("splits", [None, 1, 3, 6, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_combine_matches_reference(device, splits, dtype):
    tokens, top_k, hidden = 7, 3, 1100  # hidden spans two column blocks, the second ragged
    shape = (tokens * top_k, hidden) if splits is None else (splits, tokens * top_k, hidden)
    y = torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(device)
    out = combine(y, tokens, top_k, dtype)
    want = combine_reference(y.cpu(), tokens, top_k, torch.float32)
    assert out.dtype == dtype and out.shape == (tokens, hidden)
    # fp32 sums in another order differ by reassociation, which grows with the terms (a
    # token's slot rows of every split); bf16 output may differ by one bf16 step (the
    # interpreter truncates where torch rounds).
    terms = (splits or 1) * top_k
    tolerance = 1e-6 * terms if dtype == torch.float32 else 2**-7
    assert torch.allclose(out.float().cpu(), want, rtol=tolerance, atol=tolerance)
    if dtype == torch.float32:  # in the kernel's order (split, then slot k): exactly
        rows = y.cpu().reshape(-1, tokens, top_k, hidden)
        in_order = torch.zeros(tokens, hidden)
        for split in rows:
            for k in range(top_k):
                in_order += split[:, k]
        assert torch.equal(out.cpu(), in_order)
