"""The attention benchmark harness at small shapes (under the Triton interpreter on the CPU, or
compiled on the GPU with WORKBENCH_GPU_TESTS=1): every variant
and kernel checked against the fp32 reference before it is timed, floors from the bytes and
FLOPs, and a wrong kernel reported as such. (No timing is asserted here.)"""

from dataclasses import replace

import pandas as pd
import pytest

import kernels.attention as attention
from workbench.artifacts import read_meta
from workbench.capture import bench_attention as bench
from workbench.capture import bench_rows
from workbench.workloads.attention import Scenario
from workbench.workloads.checks import tolerance

SMALL = {"q_heads": 4, "head_dim": 32, "index_heads": 2, "index_dim": 16, "index_topk": 16,
         "window": 8}  # fmt: skip
CEILINGS = {"copy_bytes_per_s": 1e11, "bf16_flops": 1e12}
SCENARIOS = (Scenario("decode", 1, 40), Scenario("prefill", 12, 60))


@pytest.fixture(autouse=True)
def fixed_timer(monkeypatch):
    """Run each timed call once and call it 1 ms (interpreted kernels are slow to repeat)."""

    def timer(launches, device, log):
        log.start()  # the rounds begin: as the real timer does, start reading the GPU
        for launch in launches:
            launch.fn()
        return [(1.0, 0.1)] * len(launches)

    monkeypatch.setattr(bench_rows, "time_calls", timer)


def _run(tmp_path, device, **kwargs):
    args = {"scenarios": SCENARIOS, "device": device.type, "ceilings": CEILINGS,
            "out": tmp_path, "progress": False, "peers": (), **SMALL, **kwargs}  # fmt: skip
    return bench.bench_attention(**args)


def test_every_variant_and_kernel_gets_a_checked_timed_row(tmp_path, device):
    table = _run(tmp_path, device)
    assert list(table.columns) == bench.COLUMNS
    assert len(table) == 2 * 3 * 5 and set(table["status"]) == {"ok"}
    assert (table["rel_error"] < tolerance("attention", "bf16")).all()
    assert table["ratio_to_floor"].equals(table["ms"] / table["floor_ms"])
    rows = table.set_index(["scenario", "variant", "kernel"]).sort_index()
    # Decode reads the indexer's keys and scores and the selected rows: bytes, not FLOPs.
    indexer = rows.loc[("decode", "triton", "indexer")]
    element = 2 if device.type == "cuda" else 4  # served in bf16; fp32 for the CPU stand-in
    keys_and_scores = 40 * 16 * element + (2 * 16) * element + 4 * (2 + 40)
    assert indexer["floor_ms"] == pytest.approx(keys_and_scores / 1e11 * 1e3)
    both = rows.loc[("prefill", "triton")]
    assert both.loc["attention", "floor_ms"] >= both.loc["sparse_attention", "floor_ms"]
    meta = read_meta(table.attrs["path"])
    assert meta["kind"] == "bench-attention" and meta["shapes"]["index_topk"] == 16


def test_deepgemm_indexer_is_a_row_and_a_missing_peer_without_it(tmp_path, device):
    from workbench.peers import deepgemm_indexer

    table = _run(tmp_path, device, variants=("fp8",), kernels=("indexer",), peers=("deepgemm",))
    peer = table.set_index(["scenario", "variant"]).loc[("decode", "deepgemm")]
    assert peer["kernel"] == "indexer"
    if deepgemm_indexer.available()[0]:  # on an H200 with it: DeepGEMM refuses 2 heads
        assert peer["status"].startswith("error") and peer["note"] == deepgemm_indexer.PEER_NOTE
    else:
        assert peer["status"] == "missing-peer"
        assert "deep_gemm" in peer["note"].lower() and pd.isna(peer["ms"])
    assert read_meta(table.attrs["path"])["params"]["peers"] == ["deepgemm"]


def test_fp8_rows_are_checked_against_their_own_format_and_report_its_error(tmp_path, device):
    table = _run(tmp_path, device, variants=("triton", "fp8")).set_index(
        ["scenario", "variant", "kernel"]
    )
    fp8 = table.loc[("prefill", "fp8", "indexer")]
    bf16 = table.loc[("prefill", "triton", "indexer")]
    # Right against the fp32 scores of its quantised inputs; FP8's own rounding reported beside.
    assert fp8["rel_error"] < 1e-2 < fp8["quant_error"] < 0.1
    assert bf16["quant_error"] == bf16["rel_error"]  # no format of its own
    # FP8 keys: one byte and a 4-byte scale per key; the queries in the serving dtype.
    decode = table.loc[("decode", "fp8", "indexer")]
    element = 2 if device.type == "cuda" else 4
    queries_and_scores = 2 * 16 * element + 4 * (2 + 40)
    assert decode["floor_ms"] == pytest.approx((40 * (16 + 4) + queries_and_scores) / 1e8)
    pipeline = table.loc[("prefill", "fp8", "attention")]
    assert 0.5 < pipeline["overlap"] <= 1 and pipeline["status"] == "ok"
    assert table.loc[("prefill", "fp8", "select"), "floor_ms"] > 0


def test_a_wrong_selection_is_reported_wrong(tmp_path, device, monkeypatch):
    # The worst-scoring candidates instead of the best: the attention over them is right, the
    # selection is not, and the whole pipeline must be reported wrong.
    good = attention.VARIANTS["triton"]
    bottom = replace(good, indexer_scores=lambda *a, **k: -good.indexer_scores(*a, **k))
    monkeypatch.setitem(attention.VARIANTS, "triton", bottom)
    table = _run(tmp_path, device, scenarios=SCENARIOS[1:], variants=("triton",))
    status = table.set_index("kernel")["status"]
    assert status.to_dict() == {
        "indexer": "wrong", "select": "ok", "indexer_select": "wrong", "sparse_attention": "ok",
        "attention": "wrong",
    }  # fmt: skip


def test_a_wrong_select_is_reported_wrong(tmp_path, device, monkeypatch):
    good = attention.VARIANTS["triton"]
    # The window shifted by one position: every other column as it should be.
    shifted = replace(
        good, select_positions=lambda *a, **k: good.select_positions(*a, **k).roll(1, 1)
    )
    monkeypatch.setitem(attention.VARIANTS, "triton", shifted)
    table = _run(tmp_path, device, scenarios=SCENARIOS[1:], variants=("triton",))
    assert table.set_index("kernel").loc["select", "status"] == "wrong"


def test_a_wrong_attention_is_reported_wrong_and_not_timed(tmp_path, device, monkeypatch):
    good = attention.VARIANTS["triton"]
    bad = replace(good, attend=lambda *a, **k: 0.5 * good.attend(*a, **k))
    monkeypatch.setitem(attention.VARIANTS, "triton", bad)
    table = _run(tmp_path, device, scenarios=SCENARIOS[:1], variants=("triton",))
    status = table.set_index("kernel")["status"]
    assert status.to_dict() == {
        "indexer": "ok", "select": "ok", "indexer_select": "ok", "sparse_attention": "wrong",
        "attention": "wrong",
    }  # fmt: skip
    assert table.loc[table["status"] == "wrong", "ms"].isna().all()
