"""`profile()` end to end on the CPU (preset tiny), its artifacts, and its bad inputs."""

import subprocess
import sys
from copy import deepcopy

import pytest
from helpers import assert_stored_answers_are_computed

import workbench
from workbench.capture.memory import estimate_bytes, out_of_memory_error, tokens_that_fit
from workbench.presets import get_preset

CORE = ["MoE", "Dense GEMM", "Sparse attention", "All-reduce", "Other", "Total"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("raw")
    return workbench.profile(700, 3, prefill_chunk=256, out=out, progress=False)


def test_tables_have_every_category_and_add_up(run):
    prefill, decode = run.prefill(), run.decode()
    assert list(prefill.index) == CORE and list(decode.index) == [*CORE, "Gaps between kernels"]
    assert decode.loc["Gaps between kernels", "mean_ms"] >= 0
    categories = prefill.drop(index="Total")
    assert categories["time_ms"].sum() == pytest.approx(prefill.loc["Total", "time_ms"])
    for category in ("MoE", "Dense GEMM", "Sparse attention", "Other"):
        assert prefill.loc[category, "time_ms"] > 0, category
        assert decode.loc[category, "mean_ms"] > 0, category
    assert prefill.loc["All-reduce", "time_ms"] == 0  # one rank: no collective
    assert decode.attrs["steps"] == 3
    assert decode.loc["Total", "mean_ms"] == pytest.approx(
        decode.drop(index=["Total", "Gaps between kernels"])["mean_ms"].sum()
    )


def test_kernel_rows_carry_phase_step_and_layer(run):
    k = run.kernels
    prefill = k[k["phase"] == "prefill"]
    assert sorted(prefill["step"].dropna().unique()) == [0, 1, 2]  # 700 tokens in chunks of 256
    assert sorted(k.loc[k["phase"] == "decode", "step"].dropna().unique()) == [0, 1, 2]
    assert sorted(k["layer"].dropna().unique()) == [0, 1]
    # Every op of a prefill chunk or decode step runs inside a category scope.
    assert set(k.loc[k["phase"].isin(["prefill", "decode"]), "source"]) == {"range"}


def test_the_output_says_plainly_that_this_was_a_cpu_run(run):
    assert run.meta["device"] == "cpu"
    assert "CPU run" in run.text() and "not GPU kernel times" in run.text()
    assert run.meta["params"]["preset"] == "tiny"
    assert run.meta["environment"]["torch"]


def test_load_round_trips_without_torch(run):
    code = (
        "import sys, workbench\n"
        f"r = workbench.load({str(run.path)!r})\n"
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules, 'imported torch'\n"
        "print(r.prefill().to_json())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = workbench.load(run.path)
    assert out.stdout.strip() == run.prefill().to_json()
    assert loaded.decode().equals(run.decode())
    assert loaded.kernels.equals(run.kernels)


def test_a_capture_stores_what_show_reads(run):
    """prefill.csv and decode.csv are the answers, and run.json the caption's facts."""
    assert run.meta["summary"]["tables"] == {"prefill": "prefill", "decode": "decode"}
    assert "prefill_mean" not in run.meta["tables"]
    assert_stored_answers_are_computed(run.path)


def test_compare_puts_runs_side_by_side(run):
    other = workbench.load(run.path)
    table = run.compare(other, labels=["a", "b"]).prefill()
    assert list(table.columns) == ["a", "b"]
    assert table["a"].equals(table["b"])


def on_card(run, uuid: str | None):
    """A copy of `run` whose metadata says it ran on the card `uuid` (None: not recorded)."""
    loaded = workbench.load(run.path)
    loaded.meta = deepcopy(loaded.meta)
    gpu = loaded.meta.setdefault("environment", {}).setdefault("gpu", {})
    gpu.pop("uuid", None)
    if uuid:
        gpu["uuid"] = uuid
    return loaded


def test_a_comparison_across_cards_says_so(run):
    """Two H200s can differ by more than the change compared: the comparison names the cards
    when the runs recorded two, and says nothing when they share one or do not say."""
    a = on_card(run, "GPU-3dfce461-e036-83c3-cb09-1235c1ef9565")
    b = on_card(run, "GPU-a1b2c3d4-0000-0000-0000-000000000000")
    note = a.compare(b, labels=["a", "b"]).card_note()
    assert note.startswith("These runs ran on 2 cards (a on 3dfce461, b on a1b2c3d4)")
    assert "workbench ab" in note
    assert a.compare(on_card(run, a.meta["environment"]["gpu"]["uuid"])).card_note() == ""
    assert a.compare(on_card(run, None)).card_note() == ""


def test_a_comparison_page_across_cards_opens_with_the_caution(run, tmp_path):
    a = on_card(run, "GPU-3dfce461-e036-83c3-cb09-1235c1ef9565")
    b = on_card(run, "GPU-a1b2c3d4-0000-0000-0000-000000000000")
    page = a.compare(b).to_html(tmp_path / "compared.html").read_text()
    heading = '<h2 id="kernel-time-by-category">'
    assert heading in page and page.index("These runs ran on 2 cards") < page.index(heading)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_tokens": 0}, "prompt_tokens=0 is below 1"),
        ({"decode_tokens": 0}, "decode_tokens=0 is below 1"),
        ({"top_k": 99}, "top_k=99 is larger than the number of experts"),
        ({"preset": "nope"}, "known presets"),
        ({"moe": "fastest"}, "known moe variants: stock, "),
        ({"dense": "fp4"}, "known dense variants"),
        ({"routing": "zipf"}, "unknown routing"),
        ({"device": "cuda"}, "no CUDA GPU is visible"),
        ({"prefill_chunk": -5}, "prefill_chunk=-5 is below 1"),
        ({"cuda_graphs": True}, "cuda_graphs=True needs a GPU"),
        ({"dense": "humming"}, "dense='humming' cannot run here: .*humming"),
        ({"moe": "deepgemm"}, "moe='deepgemm' cannot run here: "),
        ({"moe": "cublas_fp8"}, "the peer cublas_fp8 has no moe adapter; moe peers: humming"),
        ({"dense": "fp4"}, "or a peer: cublas_fp8, humming, humming_w4a16, deepgemm"),
        ({"moe_format": "fp4"}, "moe_format"),
        ({"moe": "flat_w8a8", "moe_format": "bf16"}, "multiplies FP8 experts .*moe_format=fp8"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(tmp_path, kwargs, message):
    args = {"prompt_tokens": 64, "decode_tokens": 1, "out": tmp_path, "progress": False, **kwargs}
    with pytest.raises(workbench.WorkbenchError, match=message):
        workbench.profile(**args)
    assert list(tmp_path.iterdir()) == []


def test_out_of_memory_error_says_how_many_tokens_fit():
    preset = get_preset("dsv4-flash-tp2")
    free = 140 * 2**30
    fit = tokens_that_fit(preset, free, 4096)
    assert estimate_bytes(preset, fit, 4096) <= free < estimate_bytes(preset, fit + 1, 4096)
    assert fit > 33863  # the default profile fits one H200
    message = str(out_of_memory_error(preset, 10 * fit, 4096, free))
    assert f"fits about {fit} prompt tokens" in message and "Use fewer tokens" in message


def test_kept_trace_re_attributes_to_the_same_table(tmp_path):
    run = workbench.profile(
        200, 2, prefill_chunk=128, out=tmp_path, progress=False, keep_trace=True
    )
    assert run.meta["files"] == ["trace.json.gz"]
    again = workbench.load_trace(run.path / "trace.json.gz")
    assert again.kernels.equals(run.kernels)


def test_peers_take_over_a_category_of_the_model():
    """A dense peer's conversion sees every projection once and its linear runs every GEMM; a
    MoE peer gets each weight set's experts as FP8 in 128x128 blocks and runs the experts.
    (Stand-in peers: the real ones need the GPU, where plans/peers.toml profiles them.)"""
    import torch

    from kernels.moe import moe_reference
    from workbench.workloads.model import DENSE_WEIGHTS, SyntheticModel
    from workbench.workloads.model_backends import use_dense_peer, use_moe_peer

    model = SyntheticModel(get_preset("tiny"), layers=1)
    w = model.weights[0]
    qkv_a, gate_up, down = w.qkv_a, w.experts_gate_up, w.experts_down
    seen, handed = [], []
    use_dense_peer(
        model, "fake", lambda weight: seen.append(weight) or (lambda x: 2 * x @ weight.T)
    )
    use_moe_peer(
        model,
        "fakemoe",
        lambda experts: (
            handed.append(experts) or (lambda x, ids, route: moe_reference(x, ids, route, experts))
        ),
    )
    assert len(seen) == len(model.weights) * (len(DENSE_WEIGHTS) + len(w.o_a))  # and groups
    assert model.kernels_run["dense"] == "fake" and model.kernels_run["moe"] == "fakemoe"
    x = torch.randn(3, qkv_a.shape[1])
    assert torch.equal(model.linear(x, w.qkv_a), 2 * x @ qkv_a.T)
    (experts,) = handed
    assert experts.fmt == "fp8" and experts.block == 128
    ids = torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32)[:, : model.shapes.top_k]
    route = torch.full(ids.shape, 1.0 / ids.shape[1])
    out = model.moe_fn(x, ids, route, w.experts_gate_up, w.experts_down)
    assert torch.equal(out, moe_reference(x, ids, route, experts))
    masters = moe_reference(x, ids, route, gate_up, down)
    assert (out - masters).norm() / masters.norm() < 0.1  # E4M3 of the tiny model's masters


def test_the_page_says_where_the_profiles_own_time_went(run, tmp_path):
    from workbench.analysis.phases import TIMED_PHASES, phases_table

    table = phases_table(run.meta)
    assert list(table.index) == [p for p in TIMED_PHASES if p in run.meta["phases"]]  # as run
    assert table["share_pct"].sum() == pytest.approx(
        100 * sum(run.meta["phases"].values()) / run.meta["wall_s"]
    )
    text = run.to_html(tmp_path / "p.html").read_text()
    assert "Where the profile&#x27;s own time went" in text or "Where the profile's own" in text
    assert f"wall {run.meta['wall_s']:.1f} s" in text
    assert phases_table({"params": {}}) is None  # a run from before phases were timed
