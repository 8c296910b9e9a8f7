"""Presets are data with checked invariants; routing draws are seeded and shaped as asked."""

from dataclasses import replace

import numpy as np
import pytest

from workbench.errors import WorkbenchError
from workbench.presets import PRESETS, draw_routing, get_preset, with_overrides


def test_dsv4_rank_shapes_halve_the_sharded_dimensions():
    s = get_preset("dsv4-flash-tp2").rank_shapes()
    assert (s.hidden, s.experts, s.top_k, s.expert_intermediate) == (5120, 384, 6, 1152)
    assert (s.q_heads, s.head_dim, s.o_groups, s.vocab) == (32, 512, 4, 64_640)
    assert (s.index_topk, s.window, s.q_lora_rank) == (512, 128, 1280)


def test_every_preset_validates():
    for preset in PRESETS.values():
        preset.validate()


def test_unknown_preset_lists_the_known_ones():
    known = "known presets: dsv4-flash-tp2, dsv4-flash-hf-tp2, dsv4-flash-v4-tp2, tiny"
    with pytest.raises(WorkbenchError, match=known):
        get_preset("dsv5")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"top_k": 17}, "top_k=17 is larger than the number of experts"),
        ({"layers": 0}, "layers=0 must be at least 1"),
        ({"o_groups": 3}, "does not divide"),
        ({"no_such_field": 1}, "unknown preset fields"),
    ],
)
def test_impossible_shapes_are_rejected(overrides, message):
    with pytest.raises(WorkbenchError, match=message):
        with_overrides(get_preset("tiny"), **overrides).validate()


def test_tp_that_does_not_divide_is_rejected():
    with pytest.raises(WorkbenchError, match="tp=3 does not divide the query heads"):
        get_preset("dsv4-flash-tp2").rank_shapes(tp=3)


@pytest.mark.parametrize("routing", ["uniform", "skewed"])
def test_routing_is_seeded_distinct_and_normalised(routing):
    ids, weights = draw_routing(2000, 64, 6, routing, seed=3)
    again, _ = draw_routing(2000, 64, 6, routing, seed=3)
    assert np.array_equal(ids, again)
    assert ids.shape == weights.shape == (2000, 6)
    assert ids.min() >= 0 and ids.max() < 64
    assert all(len(set(row)) == 6 for row in ids), "a token picked one expert twice"
    assert np.allclose(weights.sum(axis=1), 1.0, atol=1e-5)


def test_skewed_routing_concentrates_load_and_uniform_does_not():
    def top_share(routing: str) -> float:
        ids, _ = draw_routing(20_000, 64, 2, routing, seed=0)
        counts = np.sort(np.bincount(ids.ravel(), minlength=64))[::-1]
        return counts[:8].sum() / counts.sum()

    assert top_share("uniform") < 0.16  # 8 of 64 experts: 12.5% expected
    assert top_share("skewed") > 0.35


def test_routing_rejects_top_k_above_experts_and_unknown_kinds():
    with pytest.raises(WorkbenchError, match="top_k=9 is larger"):
        draw_routing(4, 8, 9, "uniform", 0)
    with pytest.raises(WorkbenchError, match="unknown routing 'zipf'"):
        draw_routing(4, 8, 2, "zipf", 0)


def test_the_published_configuration_preset_differs_where_the_docs_say():
    # docs/seed-study.md: DeepseekV4Config's shapes, the attention sizes of the design's preset
    design, published = get_preset("dsv4-flash-tp2"), get_preset("dsv4-flash-hf-tp2")
    changed = {"hidden", "layers", "experts", "expert_intermediate", "q_lora_rank"}
    for field in ("q_heads", "head_dim", "kv_heads", "o_groups", "o_group_rank", "index_heads",
                  "index_dim", "index_topk", "window", "top_k", "simulated_tp"):  # fmt: skip
        assert getattr(published, field) == getattr(design, field), field
    assert all(getattr(published, f) != getattr(design, f) for f in changed)
    experts = published.layers * published.experts * 3 * published.hidden
    assert round(experts * published.expert_intermediate / 1e9) == 277  # billion parameters


def test_the_v4_attention_preset_is_the_published_shapes_with_the_layer_kinds():
    published, v4 = get_preset("dsv4-flash-hf-tp2"), get_preset("dsv4-flash-v4-tp2")
    assert v4 == replace(published, name=v4.name, description=v4.description,
                         attention_layers="WWC" + "HC" * 20)  # fmt: skip
    v4.validate()
