"""The dense benchmark harness end to end at small shapes under the Triton interpreter: every
backend checked before it is timed, floors and ratios from the ceilings, the A/B table from
the per-layer rows, failures as statuses, and the CLI's `bench dense`. (The H200 numbers come
from running it there; no timing is asserted here.)"""

from dataclasses import replace

import pandas as pd
import pytest
import torch

import kernels.dense as dense
from kernels.moe.formats import dequantize_int4, quantize_int4
from workbench.artifacts import read_meta, read_table
from workbench.capture import bench_dense as bench
from workbench.capture import bench_rows
from workbench.cli import main
from workbench.peers import PEERS, Peer
from workbench.presets import get_preset
from workbench.workloads.checks import tolerance
from workbench.workloads.dense import layer_projections
from workbench.workloads.model import DENSE_WEIGHTS, LayerWeights, Shard

SMALL = {
    "hidden": 64,
    "q_lora_rank": 32,
    "q_heads": 2,
    "head_dim": 32,
    "o_groups": 1,
    "o_group_rank": 32,
    # W8A8 quantises one token's activations; over fewer outputs its error is a coin toss
    "index_heads": 8,
    "index_dim": 64,
    "shared_intermediate": 48,
}
# Ceilings are parameters here (the CPU has no copy engine or cuBLAS to measure).
CEILINGS = {"copy_bytes_per_s": 1e11, "bf16_flops": 1e12}


@pytest.fixture
def fixed_timer(monkeypatch):
    """Interpreted kernels take tens of ms a call: run each timed layer once, call it 2 ms.
    Every dense row asks for CUDA graph replays at any M: its GEMMs have no host-side logic."""

    def timer(launches, device, log):
        log.start()  # the rounds begin: as the real timer does, start reading the GPU
        for launch in launches:
            assert launch.graph is True, f"M={launch.tokens} was not timed as a graph replay"
            launch.fn()
        return [[1.9, 2.0, 2.1]] * len(launches)

    monkeypatch.setattr(bench_rows, "time_calls", timer)


def _run(tmp_path, **kwargs):
    args = {"ms": (1, 3), "variants": bench.BACKENDS, "hybrid_m": 1, "device": "cpu",
            "ceilings": CEILINGS, "out": tmp_path, "progress": False, "ab_prompt": 4,
            "ab_chunk": 4, "peers": (), **SMALL, **kwargs}  # fmt: skip
    return bench.bench_dense(**args)


def test_every_backend_gets_a_checked_timed_row_and_the_ab_table(tmp_path, fixed_timer):
    table = _run(tmp_path)
    assert list(table.columns) == bench.COLUMNS
    layer = table[table["kernel"] == "dense-layer"]
    assert sorted(set(layer["m"])) == [1, 3, 4]  # the sweep and the A/B chunk size
    assert len(layer) == 3 * 4 and set(layer["status"]) == {"ok"}
    for variant in ("bf16", "w8a16", "w8a8", "hybrid"):
        bound = tolerance("dense", variant)
        assert (layer.loc[layer["variant"] == variant, "rel_error"] < bound).all()
    fp8 = layer[layer["variant"] != "bf16"]
    assert (fp8["error_vs_bf16"] > fp8["rel_error"]).all()  # quantisation costs accuracy
    assert layer["ratio_to_floor"].equals(layer["ms"] / layer["floor_ms"])
    floors = layer.groupby("variant")["floor_ms"].first()
    assert floors["w8a16"] < 0.6 * floors["bf16"]  # one byte a weight (plus scales), not two
    assert (layer.loc[layer["variant"] == "bf16", "speedup_vs_bf16"] == 1).all()
    layers = get_preset("dsv4-flash-tp2").layers
    assert (layer["tokens_per_s"] == layer["m"] / (2.0 * layers / 1e3)).all()

    ab = table[table["kernel"] == "dense-ab"].set_index(["variant", "scenario"])
    assert len(ab) == 4 * 4 and set(ab["status"]) == {"ok"}
    assert ab.loc[("w8a8", "decode-1"), "ms"] == 2.0 * layers  # per step: every layer once
    prefill = ab.loc[("w8a8", "prefill-4-4")]  # four 4-token prompts in 4-token chunks
    assert prefill["m"] == 16 and prefill["ms"] == 4 * 2.0 * layers
    assert prefill["tokens_per_s"] == pytest.approx(16 / (prefill["ms"] / 1e3))

    meta = read_meta(table.attrs["path"])
    assert meta["kind"] == "bench-dense" and meta["ceilings"] == CEILINGS
    assert meta["params"]["hybrid_m"] == 1 and meta["params"]["block"] == 128
    assert [p["name"] for p in meta["projections"]][:2] == ["qkv_a", "q_up"]
    assert read_table(table.attrs["path"], meta, "bench")["status"].notna().all()
    # each timed row's samples, a line a round, under its position in the table
    samples = read_table(table.attrs["path"], meta, "samples")
    assert sorted(set(samples["row"])) == sorted(layer.index)
    assert (samples.groupby("row")["round"].apply(list) == [[0, 1, 2]] * len(layer)).all()
    assert samples.groupby("row")["ms"].median().tolist() == layer["ms"].tolist()
    # on the CPU no GPU state is read: the table is there, empty, and the record says why
    assert read_table(table.attrs["path"], meta, "gpu_state").empty
    assert meta["gpu_state"] == {"sampled": False, "why": "not sampled: cpu is not a CUDA device"}
    assert table.attrs["gpu_state"] == "not sampled: cpu is not a CUDA device"


def test_the_output_projections_groups_run_as_one_call_for_the_backends_that_have_one(
    tmp_path, monkeypatch, fixed_timer
):
    grouped_calls = []
    w8a16_group = dense.GROUP_VARIANTS["w8a16"]

    def counted(x, group, **options):
        grouped_calls.append(x.shape)
        return w8a16_group(x, group, **options)

    monkeypatch.setitem(dense.GROUP_VARIANTS, "w8a16", counted)
    table = _run(tmp_path, ms=(2,), variants=("bf16", "w8a16", "w8a8"), ab=False, o_groups=2)
    assert set(table["status"]) == {"ok"}
    # checked once against each reference, then timed once: x viewed (M, groups, K)
    assert grouped_calls and all(shape[:2] == (2, 2) for shape in grouped_calls)


def test_a_wrong_kernel_is_reported_wrong_and_not_timed(tmp_path, monkeypatch, fixed_timer):
    good = dense.VARIANTS["w8a16"]
    monkeypatch.setitem(dense.VARIANTS, "w8a16", lambda x, w: 2 * good(x, w))
    table = _run(tmp_path, ms=(1,), variants=("bf16", "w8a16"), ab_prompt=1)
    bad = table[table["variant"] == "w8a16"]
    assert set(bad["status"]) == {"wrong", "wrong (m=1)", "wrong (m=4)"}  # decode-4 needs m=4
    assert bad["ms"].isna().all() and (bad["rel_error"] > 0.5).all()
    assert set(table.loc[table["variant"] == "bf16", "status"]) == {"ok"}


def test_a_failing_backend_is_a_status_and_the_sweep_goes_on(tmp_path, monkeypatch, fixed_timer):
    def broken(x, w):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setitem(dense.VARIANTS, "w8a8", broken)
    table = _run(tmp_path, ms=(2,), variants=("w8a8", "w8a16"), ab=False)
    assert table.loc[0, "status"].startswith("error: RuntimeError: no kernel")
    assert table.loc[1, "status"] == "ok" and table["speedup_vs_bf16"].isna().all()


def test_layer_projections_are_the_models_dense_weights():
    preset = get_preset("tiny")
    weights = LayerWeights(preset.rank_shapes(1), Shard(tp=2), "cpu", torch.float32, 0, 0)
    projections = {p.name: p for p in layer_projections(preset.rank_shapes())}
    assert set(projections) == {*DENSE_WEIGHTS, "o_a"}
    for name in DENSE_WEIGHTS:
        p = projections[name]
        assert tuple(getattr(weights, name).shape) == (p.n, p.k), name
    assert len(weights.o_a) == projections["o_a"].count
    assert tuple(weights.o_a[0].shape) == (projections["o_a"].n, projections["o_a"].k)


def test_ab_chunks_batch_the_streams_prompts_into_4096_token_steps():
    assert bench.ab_chunks(46_000, 1, 4096) == [4096] * 11 + [944]
    assert bench.ab_chunks(46_000, 4, 4096) == [4096] * 44 + [3776]


def test_cli_bench_dense_and_attention_pass_their_options(tmp_path, monkeypatch, capsys):
    from workbench.capture import bench_attention

    seen = {}

    def fake(name):
        def run(**kwargs):
            seen[name] = kwargs
            table = pd.DataFrame({"kernel": [name], "ms": [1.0]})
            table.attrs["path"] = str(tmp_path / name)
            table.attrs["gpu_state"] = "SM clock 1,980 MHz median"
            return table

        return run

    monkeypatch.setattr(bench, "bench_dense", fake("dense"))
    monkeypatch.setattr(bench_attention, "bench_attention", fake("attention"))
    argv = ["bench", "dense", "--tokens", "1", "4", "--variants", "bf16", "w8a16", "--block",
            "128", "--hybrid-m", "64", "--no-ab", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    assert "the GPU while the rows were timed: SM clock 1,980 MHz median" in capsys.readouterr().out
    assert seen["dense"] == {"ms": [1, 4], "variants": ["bf16", "w8a16"], "ab": False,
                             "block": 128, "hybrid_m": 64, "out": str(tmp_path),
                             "peers": None, "progress": True}  # fmt: skip
    assert main(["bench", "dense", "--peers", "cublas_fp8", "humming"]) == 0
    assert seen["dense"]["peers"] == ["cublas_fp8", "humming"]
    assert main(["bench", "dense", "--no-peers"]) == 0
    assert seen["dense"]["peers"] == []
    assert main(["bench", "attention", "--variants", "triton"]) == 0
    assert seen["attention"] == {"variants": ["triton"], "peers": ["deepgemm"], "out": "raw",
                                 "progress": True}  # fmt: skip
    assert main(["bench", "attention", "--no-peers", "--no-progress"]) == 0
    assert seen["attention"]["peers"] == [] and seen["attention"]["progress"] is False
    assert "written to" in capsys.readouterr().out


def test_unknown_backend_is_a_clear_error(tmp_path):
    from workbench.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match="unknown dense variants"):
        _run(tmp_path, variants=("bf16", "marlin"))


def _fake_peer(name: str, scale: float = 1.0, ok: bool = True) -> Peer:
    """A peer registered by the test: a torch matmul on the dequantised 128-block FP8 weights
    (times `scale`, to make a wrong one), W8A16-like."""

    def prepare(weights):
        w = weights.dequantize()
        return lambda x: scale * (x @ w.T.to(x.dtype))

    why = "a torch matmul" if ok else "fake is not installed: pip install fake"
    return Peer(name, ("dense",), "w8a16-block128", "w8a16", lambda: (ok, why), prepare)


def test_peers_get_checked_timed_rows_with_our_columns(tmp_path, monkeypatch, fixed_timer):
    for peer in (_fake_peer("fake"), _fake_peer("absent", ok=False), _fake_peer("off", 2.0)):
        monkeypatch.setitem(PEERS, peer.name, peer)
    table = _run(tmp_path, ms=(1, 4), variants=("bf16", "w8a16"), ab=False,
                 peers=("fake", "absent", "off"))  # fmt: skip
    assert list(table.columns) == bench.COLUMNS
    rows = {k: t.set_index("m") for k, t in table.groupby("kernel")}
    assert set(rows) == {"dense-layer", "fake", "absent", "off"}

    fake = rows["fake"]  # checked against the 128-block weights it holds, then timed
    assert list(fake.index) == [1, 4] and set(fake["status"]) == {"ok"}
    assert (fake["variant"] == "w8a16-block128").all() and (fake["ms"] == 2.0).all()
    assert (fake["rel_error"] < 1e-5).all() and (fake["error_vs_bf16"] > 1e-3).all()
    assert fake[["floor_ms", "ratio_to_floor", "tflops", "tokens_per_s"]].notna().all().all()
    assert (fake["speedup_vs_bf16"] == 1.0).all()  # against our bf16 row, both 2 ms
    bf16 = rows["dense-layer"][rows["dense-layer"]["variant"] == "bf16"]
    assert (fake["floor_ms"] < bf16["floor_ms"]).all()  # one byte a weight, not two

    absent = rows["absent"]
    assert set(absent["status"]) == {"missing-peer"} and absent["ms"].isna().all()
    assert set(absent["note"]) == {"fake is not installed: pip install fake"}

    off = rows["off"]
    assert set(off["status"]) == {"wrong"} and off["ms"].isna().all()
    assert (off["rel_error"] > 0.5).all()

    meta = read_meta(table.attrs["path"])
    assert meta["params"]["block"] == 128 and meta["params"]["peer_block"] == 128
    assert meta["params"]["peers"] == ["fake", "absent", "off"]
    why = "fake is not installed: pip install fake"
    assert meta["peers"]["absent"] == {"available": False, "variant": "w8a16-block128", "why": why}
    assert meta["peers"]["fake"]["available"] is True


def _int4_peer(name: str, holds: bool = True) -> Peer:
    """A peer that requantises what it is handed to INT4 (group 16, the small layer's K are
    not of 128) and multiplies by that, saying so through `holds` unless told not to."""

    def held(weights):
        packed, scales = quantize_int4(weights.dequantize(), 16)
        return dequantize_int4(packed, scales, weights.in_features, 16)

    def prepare(weights):
        w = held(weights)
        return lambda x: x @ w.T.to(x.dtype)

    return Peer(name, ("dense",), "w4a16-group16", "w4a16", lambda: (True, "int4"), prepare,
                holds=held if holds else None,
                weight_bytes=lambda w: w.values.numel() // 2)  # fmt: skip


def test_a_peer_that_holds_other_numbers_is_checked_against_them(
    tmp_path, monkeypatch, fixed_timer
):
    """Checked against the FP8 it was handed, an INT4 peer is INT4's rounding away (wrong);
    against what it says it holds, it passes, and its floor reads its own bytes."""
    for peer in (_fake_peer("fake"), _int4_peer("int4"), _int4_peer("untold", holds=False)):
        monkeypatch.setitem(PEERS, peer.name, peer)
    table = _run(tmp_path, ms=(1, 4), variants=("bf16",), ab=False,
                 peers=("fake", "int4", "untold"))  # fmt: skip
    rows = {k: t.set_index("m") for k, t in table.groupby("kernel")}
    int4, untold, fake = rows["int4"], rows["untold"], rows["fake"]
    assert set(int4["status"]) == {"ok"} and (int4["ms"] == 2.0).all()
    assert (int4["rel_error"] < 1e-5).all()  # the reference on exactly the INT4 it holds
    assert (int4["error_vs_bf16"] > 2e-2).all()  # what INT4 costs, still measured
    assert set(untold["status"]) == {"wrong"} and untold["ms"].isna().all()
    assert (untold["rel_error"] > tolerance("dense", "w4a16")).all()
    assert (int4["floor_ms"] < fake["floor_ms"]).all()  # half a byte a weight, not one


def test_a_peer_whose_conversion_fails_is_an_error_row(tmp_path, monkeypatch, fixed_timer):
    def broken(weights):
        raise RuntimeError("NVRTC: cannot find cuda_runtime.h")

    monkeypatch.setitem(PEERS, "fake", replace(_fake_peer("fake"), prepare=broken))
    table = _run(tmp_path, ms=(1,), variants=("w8a16",), ab=False, peers=("fake",))
    row = table[table["kernel"] == "fake"].iloc[0]
    assert row["status"] == "error: RuntimeError: NVRTC: cannot find cuda_runtime.h"
    assert pd.isna(row["ms"]) and "cuda_runtime.h" in row["note"]


def test_every_dense_peer_runs_by_default_and_absent_ones_say_why(tmp_path, fixed_timer):
    """On a CPU no real peer can run: each is a missing-peer row per size, with its reason."""
    table = _run(tmp_path, ms=(1,), variants=("bf16",), ab=False, peers=None)
    missing = table[table["kernel"] != "dense-layer"].set_index("kernel")
    assert list(missing.index) == ["cublas_fp8", "humming", "humming_w4a16", "deepgemm", "marlin"]
    assert set(missing["status"]) == {"missing-peer"} and missing["note"].str.len().min() > 20
    assert missing.loc["cublas_fp8", "note"].startswith("no CUDA GPU")


def test_unknown_peer_is_a_clear_error(tmp_path):
    from workbench.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match="unknown peers"):
        _run(tmp_path, peers=("marlin2",))
