"""`profile(moe_format=...)` on the CPU (preset tiny), the phases a run times, and its bar."""

import json
import subprocess
import sys

import pytest
import torch

import workbench
from kernels.moe import MoeWeights, moe_reference
from workbench.analysis.phases import TIMED_PHASES, phases_line
from workbench.analysis.profile import profile_label
from workbench.capture.experiments import measure_profile
from workbench.capture.profile_progress import Progress
from workbench.capture.profile_run import resolve
from workbench.cli import main
from workbench.presets import get_preset
from workbench.workloads.model import SyntheticModel
from workbench.workloads.model_backends import EXPERT_CHUNK, quantize_experts
from workbench.workloads.profile_params import parse_setting, split_settings

SMALL = {"prompt_tokens": 64, "decode_tokens": 1, "progress": False}


def run_json(run) -> dict:
    return json.loads((run.path / "run.json").read_text())


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_quantised_experts_run_and_are_recorded(tmp_path, fmt):
    run = workbench.profile(**SMALL, out=tmp_path, moe_format=fmt)
    assert run_json(run)["params"]["moe_format"] == fmt
    assert run.meta["params"]["moe_format"] == fmt
    assert f"-stock-{fmt}-bf16-" in run.path.name
    assert f"stock {fmt} / bf16" in run.label
    assert profile_label(run).startswith(f"stock MoE ({fmt} experts), eager")
    assert run.prefill().loc["MoE", "time_ms"] > 0


def test_bf16_experts_keep_the_labels_and_run_id_they_had(tmp_path):
    run = workbench.profile(**SMALL, out=tmp_path)
    assert run.meta["params"]["moe_format"] == "bf16"
    assert "-stock-bf16-" in run.path.name and "experts" not in profile_label(run)
    assert ": stock / bf16 /" in run.label


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_the_model_quantises_each_weight_set_once_into_the_gate_up_slot(fmt):
    """The kernels' call is unchanged: MoeWeights in the gate_up slot, None for w_down, and it
    computes what the reference does on the same weights quantised in one piece."""
    preset = get_preset("tiny")
    masters = SyntheticModel(preset, layers=1)
    model = SyntheticModel(preset, layers=1, moe_format=fmt)
    w, bf16 = model.weights[0], masters.weights[0]
    assert isinstance(w.experts_gate_up, MoeWeights) and w.experts_down is None
    assert w.experts_gate_up.fmt == fmt and w.experts_gate_up.block == 128
    whole = MoeWeights.quantize(bf16.experts_gate_up, bf16.experts_down, fmt, 128)
    x = torch.randn(5, model.shapes.hidden, dtype=model.dtype)
    ids = torch.randint(0, model.shapes.experts, (5, model.shapes.top_k), dtype=torch.int32)
    route = torch.full(ids.shape, 1.0 / ids.shape[1])
    out = model.moe_fn(x, ids, route, w.experts_gate_up, w.experts_down)
    assert torch.equal(out, moe_reference(x, ids, route, whole))


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "int4"])
def test_quantising_a_few_experts_at_a_time_changes_no_number(fmt):
    experts = 2 * EXPERT_CHUNK + 1  # a last chunk that is not full
    gate_up, down = torch.randn(experts, 64, 160), torch.randn(experts, 160, 32)
    chunked = quantize_experts(gate_up, down, fmt)
    whole = MoeWeights.quantize(gate_up, down, fmt)
    for name in ("gate_up", "down", "gate_up_scale", "down_scale"):
        a, b = getattr(chunked, name), getattr(whole, name)
        assert (a is None and b is None) or torch.equal(a.float(), b.float()), name


def test_an_unknown_format_is_refused_by_the_model():
    with pytest.raises(workbench.WorkbenchError, match="moe_format 'fp4'.*bf16, fp8, int4"):
        SyntheticModel(get_preset("tiny"), layers=1, moe_format="fp4")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"moe_format": "fp4"}, r"moe_format='fp4' .*bf16, fp8, int4"),
        ({"moe": "deepgemm", "moe_format": "fp8"}, "not to the peer moe='deepgemm'.*drop"),
    ],
)
def test_a_bad_format_is_refused_before_any_work(tmp_path, kwargs, message):
    with pytest.raises(workbench.WorkbenchError, match=message):
        workbench.profile(**SMALL, out=tmp_path, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_phases_are_timed_into_run_json_within_the_wall_time(tmp_path):
    run = workbench.profile(**SMALL, out=tmp_path, keep_trace=True)
    meta = run_json(run)
    phases = meta["phases"]
    assert {"build", "inputs", "profiled", "export", "parse", "tables", "write"} <= set(phases)
    assert set(phases) <= set(TIMED_PHASES)
    assert "warm-up" not in phases  # the CPU has no warm-up run and no CUDA graphs
    assert all(isinstance(s, float) and s > 0 for s in phases.values()), phases
    assert sum(phases.values()) <= meta["wall_s"] + 1e-3  # each rounded; wall to the ms
    assert meta["profiled_s"] == pytest.approx(phases["profiled"], abs=1e-3)
    assert run.meta == meta  # captured == loaded: the write's own time is in both
    line = phases_line(meta)
    assert line.startswith("phases: build ") and f"(wall {meta['wall_s']:.1f} s)" in line
    assert line.index("profiled") < line.index("export") < line.index("parse") < line.index("write")


def test_a_first_profile_in_a_process_times_the_import_too(tmp_path):
    code = (
        "import json, workbench\n"
        f"r = workbench.profile(64, 1, out={str(tmp_path)!r}, progress=False)\n"
        "print(json.dumps(r.meta))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    meta = json.loads(done.stdout.strip().splitlines()[-1])
    assert meta["phases"]["import"] > 0
    assert sum(meta["phases"].values()) <= meta["wall_s"] + 1e-3
    assert phases_line(meta).startswith("phases: import ")


def test_the_bar_names_each_phase(tmp_path, capsys):
    workbench.profile(64, 1, out=tmp_path, progress=True)
    err = capsys.readouterr().err
    for phase in ("building", "preparing inputs", "prefill chunk 1/1", "exporting trace",
                  "parsing"):  # fmt: skip
        assert f"profile tiny: {phase}" in err, phase
    workbench.profile(64, 1, out=tmp_path, progress=False)
    assert "profile tiny" not in capsys.readouterr().err


def test_the_bar_counts_prefill_chunks_then_decode_steps():
    params, _ = split_settings({"prefill_chunk": 32})
    spec = resolve(64, 3, **params, shape_overrides={})
    bar = Progress(spec, enabled=False)
    layers = bar.layers
    seen = [bar.position()]
    for _ in range(2):  # prefill: a tick per layer
        for _ in range(layers):
            bar.tick(1)
        seen.append(bar.position())
    for _ in range(3):  # decode: a tick per step, of all layers
        bar.tick(layers)
        seen.append(bar.position())
    assert seen == ["prefill chunk 1/2", "prefill chunk 2/2", "decode step 1/3",
                    "decode step 2/3", "decode step 3/3", "decode step 3/3"]  # fmt: skip
    assert bar.shown == "decode step 3/3"
    bar.close()


def test_the_command_line_takes_the_format_and_prints_the_phases(tmp_path, capsys):
    assert parse_setting("moe_format=fp8") == ("moe_format", "fp8")
    out = tmp_path / "raw"
    code = main(["profile", "--prompt-tokens", "64", "--decode-tokens", "1", "--param",
                 "moe_format=fp8", "--out", str(out), "--no-progress"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    (run_dir,) = out.iterdir()
    assert json.loads((run_dir / "run.json").read_text())["params"]["moe_format"] == "fp8"
    assert "\nphases: build " in printed and "write " in printed
    assert printed.index("phases:") > printed.index("Prefill")  # after the tables
    assert main(["profile", "--param", "moe_format=fp4", "--out", str(out)]) == 2
    assert "moe_format='fp4'" in capsys.readouterr().err


def test_a_profile_ab_arm_takes_the_format(tmp_path):
    """An A/B arm's settings reach profile() (its worker entry point, run in this process);
    a bad format is refused before any worker starts."""
    row = measure_profile({"settings": {"moe_format": "int4"}, "tokens": 64,
                           "phases": ["prefill"]})  # fmt: skip
    assert row["status"] == "ok" and row["by_phase"]["prefill"]["ms"] > 0
    with pytest.raises(workbench.WorkbenchError, match="moe_format='fp4'"):
        workbench.ab({"moe_format": "fp8"}, {"moe_format": "fp4"}, [64], kernel="profile",
                     out=tmp_path, progress=False)  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_the_gpu_default_is_the_served_configuration_and_the_cpu_keeps_references():
    from workbench.capture.profile_settings import device_defaults

    unset = {"moe": "stock", "dense": None, "attention": None, "moe_format": None}
    served = device_defaults(unset, on_gpu=True)
    assert (served["dense"], served["attention"], served["moe_format"]) == (
        "w8a16",
        "fp8",
        "fp8",
    )
    cpu = device_defaults(unset, on_gpu=False)
    assert (cpu["dense"], cpu["attention"], cpu["moe_format"]) == ("bf16", "torch", "bf16")
    assert device_defaults(unset | {"dense": "hybrid"}, on_gpu=True)["dense"] == "hybrid"
    assert device_defaults(unset | {"moe": "humming"}, on_gpu=True)["moe_format"] == "bf16"
