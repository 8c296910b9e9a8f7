"""The attention benchmark harness at small shapes (under the Triton interpreter on the CPU, or
compiled on the GPU with WORKBENCH_GPU_TESTS=1): every variant
and kernel checked against the fp32 reference before it is timed, floors from the bytes and
FLOPs, and a wrong kernel reported as such. (No timing is asserted here.)"""

import pytest

import kernels.attention as attention
from workbench.artifacts import read_meta
from workbench.capture import bench_attention as bench
from workbench.workloads.attention import Scenario
from workbench.workloads.checks import tolerance

SMALL = {"q_heads": 4, "head_dim": 32, "index_heads": 2, "index_dim": 16, "index_topk": 16,
         "window": 8}  # fmt: skip
CEILINGS = {"copy_bytes_per_s": 1e11, "bf16_flops": 1e12}
SCENARIOS = (Scenario("decode", 1, 40), Scenario("prefill", 12, 60))


@pytest.fixture(autouse=True)
def fixed_timer(monkeypatch):
    """Run each timed call once and call it 1 ms (interpreted kernels are slow to repeat)."""

    def timer(fn, device, tokens):
        fn()
        return 1.0, 0.1

    monkeypatch.setattr(bench, "time_call", timer)


def _run(tmp_path, device, **kwargs):
    args = {"scenarios": SCENARIOS, "device": device.type, "ceilings": CEILINGS,
            "out": tmp_path, "progress": False, **SMALL, **kwargs}  # fmt: skip
    return bench.bench_attention(**args)


def test_every_variant_and_kernel_gets_a_checked_timed_row(tmp_path, device):
    table = _run(tmp_path, device)
    assert list(table.columns) == bench.COLUMNS
    assert len(table) == 2 * 2 * 3 and set(table["status"]) == {"ok"}
    assert (table["rel_error"] < tolerance("attention", "bf16")).all()
    assert table["ratio_to_floor"].equals(table["ms"] / table["floor_ms"])
    rows = table.set_index(["scenario", "variant", "kernel"])
    # Decode reads the indexer's keys and scores and the selected rows: bytes, not FLOPs.
    indexer = rows.loc[("decode", "triton", "indexer")]
    element = 2 if device.type == "cuda" else 4  # served in bf16; fp32 for the CPU stand-in
    keys_and_scores = 40 * 16 * element + (2 * 16) * element + 4 * (2 + 40)
    assert indexer["floor_ms"] == pytest.approx(keys_and_scores / 1e11 * 1e3)
    both = rows.loc[("prefill", "triton")]
    assert both.loc["attention", "floor_ms"] >= both.loc["sparse_attention", "floor_ms"]
    meta = read_meta(table.attrs["path"])
    assert meta["kind"] == "bench-attention" and meta["shapes"]["index_topk"] == 16


def test_a_wrong_selection_is_reported_wrong(tmp_path, device, monkeypatch):
    # The worst-scoring candidates instead of the best: the attention over them is right, the
    # selection is not, and the whole pipeline must be reported wrong.
    good = attention.VARIANTS["triton"]
    bottom = attention.AttentionVariant(
        lambda *a: -good.indexer_scores(*a), good.select_positions, good.attend
    )
    monkeypatch.setitem(attention.VARIANTS, "triton", bottom)
    table = _run(tmp_path, device, scenarios=SCENARIOS[1:], variants=("triton",))
    status = table.set_index("kernel")["status"]
    assert status.to_dict() == {"indexer": "wrong", "sparse_attention": "ok", "attention": "wrong"}


def test_a_wrong_attention_is_reported_wrong_and_not_timed(tmp_path, device, monkeypatch):
    good = attention.VARIANTS["triton"]
    bad = attention.AttentionVariant(
        good.indexer_scores, good.select_positions, lambda *a, **k: 0.5 * good.attend(*a, **k)
    )
    monkeypatch.setitem(attention.VARIANTS, "triton", bad)
    table = _run(tmp_path, device, scenarios=SCENARIOS[:1], variants=("triton",))
    status = table.set_index("kernel")["status"]
    assert status.to_dict() == {"indexer": "ok", "sparse_attention": "wrong", "attention": "wrong"}
    assert table.loc[table["status"] == "wrong", "ms"].isna().all()
