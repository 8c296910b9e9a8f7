"""One workload contract: `bench`, `sweep`, `ab` and `ncu` hand a kernel bit-identical inputs
for the same (kernel, variant, format, tokens, routing, seed), and the seed rule keeps each
input independent of what else a run draws."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import QUICK

import kernels.moe as moe
from workbench.capture import bench_moe, bench_rows, experiments
from workbench.capture.ncu_args import TargetArgs
from workbench.capture.ncu_builders import build_moe
from workbench.presets import get_preset
from workbench.workloads import checks, seeds
from workbench.workloads.moe import moe_problem

CASE = {"variant": "stock", "fmt": "fp8", "tokens": 5, "routing": "skewed", "seed": 3}
CEILINGS = {"copy_bytes_per_s": 1e11, "bf16_flops": 1e12}


@pytest.fixture
def seen(monkeypatch) -> list[tuple]:
    """The inputs every call of the `stock` kernel receives (it answers with the reference)."""
    calls: list[tuple] = []

    def recording(x, ids, weights, experts, **_options):
        calls.append((x.clone(), ids.clone(), weights.clone(), experts))
        return moe.moe_reference(x, ids, weights, experts)

    def one_call(launches, _device, log) -> list[list[float]]:
        log.start()  # the rounds begin: as the real timer does, start reading the GPU
        for launch in launches:
            launch.fn()
        return [[0.9, 1.0, 1.1]] * len(launches)

    monkeypatch.setitem(moe.VARIANTS, "stock", recording)
    monkeypatch.setattr(bench_rows, "time_calls", one_call)
    return calls


def _bench(out) -> None:
    bench_moe.bench_moe(tokens=[CASE["tokens"]], routings=[CASE["routing"]], variants=["stock"],
                        formats=[CASE["fmt"]], peers=False, preset="tiny", device="cpu",
                        seed=CASE["seed"], ceilings=CEILINGS, progress=False,
                        out=out)  # fmt: skip


def _worker(kind: str) -> None:
    """The config a sweep or an A/B builds for the case, run by the worker function."""
    fixed = {
        "fmt": CASE["fmt"],
        "routing": CASE["routing"],
        "seed": CASE["seed"],
        "preset": "tiny",
        "device": "cpu",
        "repeats": dict(QUICK, min_n=1, max_n=1),
    }
    settings = {"1": {"num_stages": 1}} if kind == "sweep" else {"a": {"variant": "stock"}}
    (config,) = experiments._configs(settings, [CASE["tokens"]], fixed)
    assert experiments.measure_moe(config)["status"] == "ok"


def _ncu() -> None:
    args = TargetArgs(
        "moe",
        "stock",
        (CASE["tokens"],),
        {"fmt": CASE["fmt"]},
        routing=CASE["routing"],
        seed=CASE["seed"],
        preset="tiny",
        device="cpu",
    )
    (workload,) = build_moe(args)
    workload.check()  # runs the launch and checks it against the reference


def test_bench_sweep_ab_and_ncu_give_a_kernel_bit_identical_inputs(seen, tmp_path):
    _bench(tmp_path)
    _worker("sweep")
    _worker("ab")
    _ncu()
    assert len(seen) >= 4
    first = seen[0]
    for other in seen[1:]:
        for a, b in zip(first[:3], other[:3]):
            assert a.dtype == b.dtype and torch.equal(a, b)
        for name in ("gate_up", "down", "gate_up_scale", "down_scale"):
            mine, theirs = getattr(first[3], name), getattr(other[3], name)
            assert torch.equal(
                mine.view(torch.uint8) if mine.element_size() == 1 else mine,
                theirs.view(torch.uint8) if theirs.element_size() == 1 else theirs,
            )


def test_inputs_depend_on_their_own_key_only():
    s = get_preset("tiny").rank_shapes()
    cpu = torch.device("cpu")
    alone = moe_problem(s, 7, "uniform", 0, cpu, torch.float32)
    moe_problem(s, 3, "skewed", 0, cpu, torch.float32)  # drawing something else first
    again = moe_problem(s, 7, "uniform", 0, cpu, torch.float32)
    assert torch.equal(alone.x, again.x) and torch.equal(alone.ids, again.ids)
    other_seed = moe_problem(s, 7, "uniform", 1, cpu, torch.float32)
    assert not torch.equal(alone.x, other_seed.x)
    # bf16 and fp32 runs of one problem see the same values up to the cast
    bf16 = moe_problem(s, 7, "uniform", 0, cpu, torch.bfloat16)
    assert torch.equal(bf16.x, alone.x.to(torch.bfloat16))


def test_the_seed_rule_is_stable_across_processes():
    # a hash of the key's text, not Python's salted hash(): fixed for ever
    assert seeds.derive(0, "moe", "x", 6) == seeds.derive(0, "moe", "x", 6)
    assert seeds.derive(0, "moe", "x", 6) != seeds.derive(0, "moe", "x", 7)
    assert 0 <= seeds.derive(123, "anything") < 2**63


def test_one_tolerance_table_and_one_relative_error():
    assert checks.passes(0.01, "moe", "fp8") and not checks.passes(float("nan"), "moe", "fp8")
    assert checks.tolerance("dense", "w8a8") == 5e-2
    with pytest.raises(Exception, match="no tolerance for moe/fp4"):
        checks.tolerance("moe", "fp4")
    ref = torch.ones(4)
    assert checks.relative_error(ref * 1.01, ref) == pytest.approx(0.01)
    assert math.isnan(checks.relative_error(torch.full((4,), float("inf")), ref))


def test_the_roofline_floor_is_bytes_at_decode_and_flops_at_prefill():
    from workbench.capture.bench_rows import roofline_ms

    ceilings = {"copy_bytes_per_s": 4e12, "bf16_flops": 8e14, "fp8_flops": 1.6e15}
    assert roofline_ms(4e9, 1e9, ceilings) == pytest.approx(1.0)  # 4 GB at 4 TB/s
    assert roofline_ms(4e6, 8e14, ceilings) == pytest.approx(1000.0)  # FLOPs at the bf16 peak
    assert roofline_ms(4e6, 8e14, ceilings, "fp8_flops") == pytest.approx(500.0)
    assert roofline_ms(4e6, 8e14, {**ceilings, "fp8_flops": None}, "fp8_flops") == 1000.0


def test_an_ab_holds_a_w8a8_variant_to_w8a8s_bound():
    # W8A8 quantises the activations too: 0.047 from the bf16 reference on the H200, over the
    # 2e-2 of FP8 weights alone, so the A/B worker (like the bench and ncu) checks it as W8A8
    assert checks.moe_check_key("w8a8", "fp8") == "w8a8"
    assert checks.moe_check_key("flat", "fp8") == "fp8"
    fixed = {"fmt": "fp8", "routing": "uniform", "seed": 0, "preset": "tiny", "device": "cpu",
             "repeats": dict(QUICK, min_n=1, max_n=1),
             "hidden": 128, "expert_intermediate": 128}  # W8A8: whole 128-wide blocks  # fmt: skip
    (config,) = experiments._configs({"b": {"variant": "w8a8"}}, [5], fixed)
    row = experiments.measure_moe(config)
    assert row["status"] == "ok", row
    assert row["rel_error"] <= checks.tolerance("moe", "w8a8")
