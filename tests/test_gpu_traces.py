"""Attribution on real H200 traces (committed fixtures; see tests/fixtures/*.py and
scripts/h200_profile_capture.sh for how they were captured)."""

from pathlib import Path

import pytest

import workbench

FIXTURES = Path(__file__).parent / "fixtures"
RAW = Path(__file__).parents[1] / "raw"


@pytest.fixture(scope="module")
def mixtral():
    return workbench.load_trace(FIXTURES / "hf-mixtral-h200.json.gz")


@pytest.fixture(scope="module")
def model_run():
    return workbench.load(FIXTURES / "h200-model-2layers")


def test_mixtral_grouped_gemms_are_moe_through_their_launching_op(mixtral):
    k = mixtral.kernels
    grouped = k[k["op"] == "aten::_grouped_mm"]
    # 40 _grouped_mm calls (4 layers x 2 projections x 5 forward passes), 2 kernels each.
    assert len(grouped) == 80
    assert set(grouped["category"]) == {"MoE"} and set(grouped["source"]) == {"op"}
    # The kernel names alone would not say MoE: CUTLASS names its grouped GEMMs generically.
    assert not grouped["name"].str.contains("moe", case=False).any()


def test_mixtral_attention_and_dense_gemms(mixtral):
    k = mixtral.kernels
    attention = k[k["category"] == "Attention"]
    assert len(attention) > 0
    assert set(attention["op"]) <= {
        "aten::_cudnn_attention_forward",
        "aten::_flash_attention_forward",
        "aten::_efficient_attention_forward",
    }
    dense = k[k["category"] == "Dense GEMM"]
    assert set(dense["op"]) <= {"aten::mm", "aten::bmm", "aten::addmm"}
    assert (k.loc[k["op"] == "aten::mm", "category"] == "Dense GEMM").all()


def test_mixtral_phases_come_from_the_users_ranges(mixtral):
    assert mixtral.phases == ["prefill", "decode"]
    decode = mixtral.decode()
    assert decode.attrs["steps"] == 4
    assert decode.loc["MoE", "mean_ms"] > 0 and decode.loc["Attention", "mean_ms"] > 0
    assert mixtral.attribution().loc["MoE", "op"] == 80


def test_model_trace_re_attributes_to_its_saved_kernel_table(model_run):
    again = workbench.load_trace(model_run.path / "trace.json.gz")
    # The fixture predates the correlation column; everything else must be identical.
    assert model_run.kernels["correlation"].isna().all()
    assert again.kernels["correlation"].notna().all()
    assert again.kernels.drop(columns="correlation").equals(
        model_run.kernels.drop(columns="correlation")
    )


def test_model_kernels_carry_scope_categories_and_launch_facts(model_run):
    k = model_run.kernels
    triton = k[k["name"].isin(["_gate_up_kernel", "_down_kernel"])]
    assert len(triton) > 0 and set(triton["category"]) == {"MoE"}
    assert set(triton["source"]) == {"range"}
    assert triton["registers"].notna().all() and triton["grid"].notna().all()
    assert set(k["layer"].dropna()) == {0, 1}
    assert (k.loc[k["layer"].notna(), "source"] == "range").all()


def _committed(graphs: bool) -> workbench.ProfileResult:
    runs = [
        workbench.load(p) for p in sorted(RAW.glob("profile-dsv4-flash-tp2-stock-bf16-33863t-*"))
    ]
    (run,) = [r for r in runs if r.meta["params"]["cuda_graphs"] is graphs]
    return run


@pytest.mark.parametrize("graphs", [True, False])
def test_committed_h200_profiles_load_with_every_category(graphs):
    run = _committed(graphs)
    assert run.meta["environment"]["gpu"]["name"] == "NVIDIA H200"
    prefill, decode = run.prefill(), run.decode()
    assert decode.attrs["steps"] == 64
    for category in ("MoE", "Dense GEMM", "Sparse attention", "Other"):
        assert prefill.loc[category, "time_ms"] > 0 and decode.loc[category, "mean_ms"] > 0
    assert prefill.loc["Total", "kernels"] == len(run.kernels[run.kernels["phase"] == "prefill"])


def test_graph_and_eager_decode_compute_the_same_and_differ_in_gaps():
    graphs, eager = _committed(True), _committed(False)
    from workbench.artifacts import read_table

    assert read_table(graphs.path, graphs.meta, "tokens").equals(
        read_table(eager.path, eager.meta, "tokens")
    )
    matching = graphs.meta["graph_matching"]
    assert matching["matched_by_position"] == matching["graph_kernels"] > 400_000
    table = graphs.compare(eager, labels=["graphs", "eager"]).decode()
    gaps = table.loc["Gaps between kernels"]
    assert gaps["eager"] > 10 * gaps["graphs"]
    # Kernel time per step is the same work either way (within 3%).
    assert abs(table.loc["Total", "graphs"] / table.loc["Total", "eager"] - 1) < 0.03
    assert "CUDA graphs" in graphs.decode_caption() and "eager" in eager.decode_caption()
