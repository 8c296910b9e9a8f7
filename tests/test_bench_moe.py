"""The MoE benchmark harness end to end at small shapes under the Triton interpreter: every row
checked before it is timed, floors and ratios from the ceilings, failures as statuses. (The
H200 numbers come from running it there; no timing is asserted here.)"""

import math
from types import SimpleNamespace

import pytest
import torch

import kernels.moe.launch as moe_launch
import kernels.moe.routing as moe_routing
from kernels.moe import VARIANTS, moe_reference
from kernels.moe.formats import MoeWeights
from workbench.artifacts import read_meta, read_table
from workbench.capture import bench_moe as bench
from workbench.capture import bench_rows
from workbench.peers import PEERS, Peer, peer_names
from workbench.presets import get_preset
from workbench.workloads import moe as moe_workload
from workbench.workloads.checks import tolerance

SMALL = {"experts": 8, "top_k": 2, "hidden": 64, "expert_intermediate": 32}
# Ceilings are parameters here (the CPU has no copy engine or cuBLAS to measure).
CEILINGS = {"copy_bytes_per_s": 1e11, "bf16_flops": 1e12}


def _run(tmp_path, **kwargs):
    args = {"tokens": (1, 5), "routings": ("uniform",), "variants": ("stock", "flat"),
            "formats": ("bf16", "fp8"), "device": "cpu", "ceilings": CEILINGS, "out": tmp_path,
            "progress": False, **SMALL, **kwargs}  # fmt: skip
    return bench.bench_moe(**args)


def test_every_variant_format_and_peer_gets_a_checked_timed_row(tmp_path):
    table = _run(tmp_path)
    assert list(table.columns) == bench.COLUMNS
    registered = peer_names("moe")
    assert len(table) == 2 * (2 * 2 + 3 + len(registered))  # tokens x (ours + torch + peers)
    moe = table[table["kernel"] == "moe"]
    assert set(moe["status"]) == {"ok"}
    assert (moe["rel_error"] < tolerance("moe", "bf16")).all()
    assert (moe["ms"] > 0).all() and (moe["floor_ms"] > 0).all()
    assert moe["ratio_to_floor"].equals(moe["ms"] / moe["floor_ms"])
    torch_rows = table[table["kernel"].isin(bench.BASELINES)]
    assert set(torch_rows["status"]) == {"ok"}
    assert list(torch_rows["variant"].unique()) == list(bench.BASELINE_VARIANTS.values())
    absent = table[table["kernel"].isin(registered)]  # no GPU here: every peer says why
    assert set(absent["status"]) == {"missing-peer"} and absent["ms"].isna().all()
    assert absent["note"].str.len().gt(20).all() and set(absent["routing"]) == {"uniform"}
    meta = read_meta(table.attrs["path"])
    assert meta["kind"] == "bench-moe" and meta["ceilings"] == CEILINGS
    assert meta["params"]["peers"] == [*bench.BASELINES, *registered]
    assert set(meta["peers"]) == set(registered)
    assert read_table(table.attrs["path"], meta, "bench")["status"].notna().all()
    assert meta["timing"]["contenders"].startswith("in turns")


def test_a_moe_peer_is_checked_on_its_128_block_experts_then_timed(tmp_path, monkeypatch):
    """A peer registered by the test (the reference on the FP8 experts it is handed): it gets
    DeepSeek's 128x128-block FP8, is checked against the reference on exactly those, and a
    W8A8 peer's floor is priced at the FP8 tensor-core rate."""
    handed = []

    def prepare_moe(weights):
        handed.append(weights)
        return lambda x, ids, route: moe_reference(x, ids, route, weights)

    for name, scheme in (("fake16", "w8a16"), ("fake8", "w8a8")):
        peer = Peer(name, ("moe",), "", scheme, lambda: (True, "here"), None, prepare_moe, "v")
        monkeypatch.setitem(PEERS, name, peer)
    ceilings = CEILINGS | {"fp8_flops": 2e12}
    table = _run(tmp_path, variants=("stock",), formats=("bf16",), peers=("fake16", "fake8"),
                 ceilings=ceilings)  # fmt: skip
    assert [w.fmt for w in handed] == ["fp8", "fp8"] and {w.block for w in handed} == {128}
    fake = table[table["kernel"].str.startswith("fake")].set_index(["kernel", "tokens"])
    assert set(fake["status"]) == {"ok"} and (fake["rel_error"] < 1e-6).all()
    assert (fake["variant"] == "v").all() and (fake["weight_dtype"] == "fp8").all()
    assert (fake.loc["fake8", "floor_ms"] <= fake.loc["fake16", "floor_ms"]).all()


def test_a_wrong_kernel_is_reported_wrong_and_not_timed(tmp_path, monkeypatch):
    good = VARIANTS["stock"]
    monkeypatch.setitem(VARIANTS, "stock", lambda *a, **k: 2 * good(*a, **k))
    table = _run(tmp_path, variants=("stock",), formats=("bf16",), peers=False)
    assert set(table["status"]) == {"wrong"}
    assert table["ms"].isna().all() and (table["rel_error"] > 0.5).all()


def test_a_failing_configuration_is_a_status_and_the_sweep_goes_on(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setitem(VARIANTS, "flat", broken)
    table = _run(tmp_path, formats=("bf16",), peers=False)
    flat = table[table["variant"] == "flat"]
    assert flat["status"].str.startswith("error: RuntimeError").all()
    assert set(table.loc[table["variant"] == "stock", "status"]) == {"ok"}


def test_a_row_that_fails_while_timed_is_a_status_and_the_others_at_its_size_are_timed(
    tmp_path, monkeypatch
):
    """The rows at one T are timed together: one running out of memory there becomes `oom`,
    and the others keep their times."""
    batches = []

    def timer(launches, device, log):
        log.start()  # the rounds begin: as the real timer does, start reading the GPU
        batches.append(len(launches))
        size = len(batches)  # each T's samples apart, so a mix-up shows
        return [
            torch.OutOfMemoryError("CUDA out of memory"),
            *[[0.9 * size, 1.0 * size, 1.1 * size]] * (len(launches) - 1),
        ]

    monkeypatch.setattr(bench_rows, "time_calls", timer)
    table = _run(tmp_path, formats=("bf16",), peers=False)
    assert batches == [2, 2]  # stock and flat, at each T
    assert list(table["status"]) == ["oom", "ok", "oom", "ok"]
    assert table["ms"].isna().tolist() == [True, False, True, False]
    # the timed rows' samples under their positions, each T's rows a group of their own
    samples = read_table(table.attrs["path"], read_meta(table.attrs["path"]), "samples")
    assert samples.groupby("row")["group"].first().to_dict() == {1: 0, 3: 1}
    assert samples.groupby("row")["ms"].median().to_dict() == {1: 1.0, 3: 2.0}
    assert table["ms"].dropna().tolist() == [1.0, 2.0]


def test_floor_counts_the_bytes_of_the_touched_experts():
    s = get_preset("dsv4-flash-tp2").rank_shapes()
    one = 3 * 5120 * 1152
    assert moe_workload.weight_bytes("bf16", 1, s) == 2 * one
    assert moe_workload.weight_bytes("fp8", 1, s) == pytest.approx(one + 4 * one / 128**2)
    assert moe_workload.weight_bytes("int4", 2, s) == pytest.approx(one + 2 * 2 * one / 128)
    assert moe_workload.flops(6, s) == 2 * 6 * 6 * one


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "int4"])
def test_floor_bytes_are_the_stored_tensors_bytes(fmt):
    """The floor counts what the quantised weights occupy: values and scales at the dtypes
    `MoeWeights.quantize` stores them in (INT4's scales are bf16, FP8's fp32)."""
    shapes = SimpleNamespace(hidden=512, expert_intermediate=256)
    gate_up = torch.randn(1, 2 * shapes.expert_intermediate, shapes.hidden)
    down = torch.randn(1, shapes.hidden, shapes.expert_intermediate)
    weights = MoeWeights.quantize(gate_up.bfloat16(), down.bfloat16(), fmt)
    tensors = [weights.gate_up, weights.down, weights.gate_up_scale, weights.down_scale]
    stored = sum(t.numel() * t.element_size() for t in tensors if t is not None)
    assert moe_workload.weight_bytes(fmt, 1, shapes) == stored


def _small_problem(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 64, generator=gen)
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(9)]).int()
    w = torch.softmax(torch.randn(9, 2, generator=gen), -1)
    gu, down = torch.randn(8, 64, 64, generator=gen) / 8, torch.randn(8, 64, 32, generator=gen) / 6
    return x.to(dtype), ids, w, gu.to(dtype), down.to(dtype)


def test_peers_agree_with_the_reference():
    x, ids, w, gu, down = _small_problem()
    ref = moe_reference(x, ids, w, gu, down)
    out = bench.cublas_loop_peer(x, ids, w, gu, down)
    assert (out - ref).norm() / ref.norm() < 1e-5
    assert math.isfinite(float(out.sum()))


def test_the_bare_grouped_mm_peer_times_only_its_gemms():
    """Its timed part is the two grouped GEMMs over the slots in expert order (one row per
    token and pick, hidden wide); completed by the untimed scatter it is the layer."""
    x, ids, w, gu, down = _small_problem(torch.bfloat16)
    gemms, finish = bench.grouped_mm_bare(x, ids, w, gu, down)
    slots = gemms()
    assert slots.shape == (9 * 2, 64) and slots.dtype == torch.bfloat16
    ref = moe_reference(x.float(), ids, w, gu.float(), down.float())
    out = finish(slots)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).norm() / ref.norm() < tolerance("moe", "bf16")


def test_a_bench_row_times_the_part_it_is_given(tmp_path, monkeypatch):
    timed = []

    def timer(launches, device, log):
        log.start()  # the rounds begin: as the real timer does, start reading the GPU
        timed.extend(launch.fn() for launch in launches)
        return [[0.9, 1.0, 1.1]] * len(launches)

    monkeypatch.setattr(bench_rows, "time_calls", timer)
    table = _run(tmp_path, tokens=(3,), variants=("flat",), formats=("bf16",),
                 peers=["torch_grouped_mm", "torch_grouped_mm_bare"])  # fmt: skip
    assert list(table["kernel"]) == ["moe", "torch_grouped_mm", "torch_grouped_mm_bare"]
    assert [t.shape for t in timed] == [(3, 64), (3, 64), (3 * 2, 64)]  # the bare: per slot


def test_a_bench_row_checks_the_routing_and_times_its_call_without_the_readback(
    tmp_path, monkeypatch
):
    """The row's check runs the call with the ids' range check (a host sync on a GPU); its
    timed samples skip it (`trusted_routing`), so the timer does not wait on the host."""
    seen = []
    real = moe_launch.validate_moe_inputs

    def spy(*args):
        seen.append(moe_routing._TRUSTED_ROUTING.get())
        return real(*args)

    def timer(launches, device, log):
        log.start()
        seen.append("timed")
        for launch in launches:
            launch.fn()
        return [[1.0]] * len(launches)

    monkeypatch.setattr(moe_launch, "validate_moe_inputs", spy)
    monkeypatch.setattr(bench_rows, "time_calls", timer)
    _run(tmp_path, tokens=(3,), variants=("flat",), formats=("bf16",), peers=False)
    timed = seen.index("timed")
    assert timed > 0 and not any(seen[:timed])  # checked
    assert seen[timed + 1 :] == [True]  # timed trusted


def test_the_w8a8_variant_gets_fp8_rows_only_floored_at_the_fp8_rate(tmp_path):
    # W8A8 takes whole 128-wide blocks of H and I; the bf16 format has no row for it.
    shape = SMALL | {"hidden": 128, "expert_intermediate": 128}
    ceilings = CEILINGS | {"fp8_flops": 2e12}
    table = _run(tmp_path, tokens=(5,), variants=("flat", "w8a8"), peers=False,
                 ceilings=ceilings, **shape)  # fmt: skip
    rows = table.set_index(["variant", "weight_dtype"])
    assert sorted(rows.index) == [("flat", "bf16"), ("flat", "fp8"), ("w8a8", "fp8")]
    assert set(table["status"]) == {"ok"}
    w8a8, flat = rows.loc[("w8a8", "fp8")], rows.loc[("flat", "fp8")]
    assert w8a8["rel_error"] < tolerance("moe", "w8a8")
    assert w8a8["floor_ms"] <= flat["floor_ms"]  # the FP8 tensor-core rate, twice bf16's here
