"""Attribution on real H200 traces: the committed fixtures (the two-layer runs are
`workbench.profile(2048, 4, layers=2, keep_trace=True)`, the Mixtral trace is made by
tests/fixtures/make_hf_mixtral_trace.py, the Qwen2-MoE traces by
tests/fixtures/make_hf_moe_traces.py) and the raw/ profiles plans/profiles.toml captures."""

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
    assert mixtral.attribution().loc[("MoE", "op", "MoE op"), "kernels"] == 80


def test_model_trace_re_attributes_to_its_saved_kernel_table(model_run):
    again = workbench.load_trace(model_run.path / "trace.json.gz")
    # The fixture predates the correlation and rule columns: its rules are filled in from
    # what each row shows, and everything but the correlation must be identical.
    assert model_run.kernels["correlation"].isna().all()
    assert set(model_run.kernels["rule"]) == {"scope moe", "scope dense", "scope attention",
                                              "scope other", "default"}  # fmt: skip
    assert again.kernels["correlation"].notna().all()
    # It also predates `waited_us`: cuBLAS's split-K reduces started under PDL before their
    # GEMMs ended, and now start where those ended; every other time is as saved.
    waited = (again.kernels["waited_us"] > 0).to_numpy()
    assert waited.any() and again.kernels.loc[waited, "name"].str.contains("splitKreduce").all()
    later = ["correlation", "waited_us", "start_us", "dur_us"]
    assert again.kernels.drop(columns=later).equals(model_run.kernels.drop(columns=later))
    times = ["start_us", "dur_us"]
    assert again.kernels.loc[~waited, times].equals(model_run.kernels.loc[~waited, times])


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


# ---- third-party traces: HF Qwen2-MoE with user scopes, and with module scopes ------------
QWEN_SCOPES = FIXTURES / "hf-qwen2moe-scopes-h200.json.gz"
QWEN_MODULES = FIXTURES / "hf-qwen2moe-modules-h200.json.gz"
EVERY_TRACE = sorted([*FIXTURES.glob("*.json.gz"), *FIXTURES.glob("*/trace.json.gz")])


@pytest.fixture(scope="module")
def qwen_scopes():
    return workbench.load_trace(QWEN_SCOPES)


@pytest.fixture(scope="module")
def qwen_modules():
    return workbench.load_trace(QWEN_MODULES)


@pytest.mark.parametrize("path", EVERY_TRACE, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_trace_gives_every_table(path):
    result = workbench.load_trace(path)
    for phase in result.phases:
        table = result.decode() if phase == "decode" else result.by_phase(phase)
        assert len(table) > 0
    if "prefill" in result.phases:
        assert result.prefill().loc["Total", "kernels"] > 0
    assert len(result.top_kernels()) > 0
    assert result.attribution()["kernels"].sum() == len(result.kernels)
    assert result.kernels["rule"].notna().all()


def test_fixture_traces_are_all_covered():
    names = {str(p.relative_to(FIXTURES)) for p in EVERY_TRACE}
    assert {"hf-qwen2moe-scopes-h200.json.gz", "hf-qwen2moe-modules-h200.json.gz",
            "h200-graphs-2layers/trace.json.gz"} <= names  # fmt: skip


@pytest.mark.parametrize("which", ["qwen_scopes", "qwen_modules"])
def test_same_name_decode_scopes_are_eight_steps(which, request):
    result = request.getfixturevalue(which)
    assert result.phases == ["prefill", "decode"]
    decode_rows = result.kernels[result.kernels["phase"] == "decode"]
    assert sorted(decode_rows["step"].unique()) == list(range(8))
    decode = result.decode()
    assert decode.attrs["steps"] == 8
    assert decode.loc["Total", "mean_ms"] > 0 and decode.loc["MoE", "mean_ms"] > 0
    # Every step runs the same model: the same kernels each step.
    assert decode_rows.groupby("step").size().nunique() == 1
    prefill = result.prefill()
    assert prefill.loc["MoE", "time_ms"] > 0 and prefill.loc["Attention", "time_ms"] > 0
    top = result.top_kernels(10)
    assert len(top) == 10 and top["share_pct"].is_monotonic_decreasing
    assert any("8 scopes named 'decode'" in n for n in result.meta["notes"])


def test_a_triton_kernel_launched_outside_any_op_is_claimed_by_its_name(qwen_scopes):
    k = qwen_scopes.kernels
    mm = k[k["name"] == "mm_kernel"]
    assert len(mm) == 8 and mm["op"].isna().all()  # one per decode step, under no aten op
    assert set(mm["category"]) == {"Dense GEMM"} and set(mm["rule"]) == {"Triton matmul"}
    assert sorted(mm["step"]) == list(range(8))
    assert qwen_scopes.attribution().loc[("Dense GEMM", "kernel", "Triton matmul"), "kernels"] == 8


def test_module_scopes_put_the_whole_moe_block_in_moe(qwen_modules):
    k = qwen_modules.kernels
    in_block = k[k["module"].str.contains("SparseMoeBlock", na=False)]
    assert len(in_block) > 0 and set(in_block["category"]) == {"MoE"}
    # The router, its top-k and the token indexing are there, not in Other.
    router = in_block[in_block["module"].str.contains("TopKRouter")]
    assert {"aten::topk", "aten::linear"} & set(router["op"])
    other = k[k["category"] == "Other"]
    assert not other["op"].isin(["aten::topk", "aten::sort", "aten::histc", "aten::index",
                                 "aten::_grouped_mm"]).any()  # fmt: skip
    assert not other["module"].str.contains("Moe(?:Block|Experts|TopKRouter)", na=False).any()
    # MoE's share is at least the expert GEMMs' share, in each phase.
    for phase in ("prefill", "decode"):
        rows = k[k["phase"] == phase]
        experts = rows.loc[rows["op"] == "aten::_grouped_mm", "dur_us"].sum()
        moe = rows.loc[rows["category"] == "MoE", "dur_us"].sum()
        assert experts > 0 and moe >= experts
        assert moe / rows["dur_us"].sum() > 0.4  # the block is the model's largest part
    assert (
        qwen_modules.prefill().loc["MoE", "share_pct"]
        > qwen_modules.prefill().loc["Attention", "share_pct"]
    )


def test_module_scopes_split_attention_into_projections_and_the_rest(qwen_modules):
    k = qwen_modules.kernels
    attention = k[k["module"].str.contains("Qwen2MoeAttention", na=False)]
    projections = attention[attention["module"].str.endswith("/Linear")]
    assert len(projections) > 0 and set(projections["category"]) == {"Dense GEMM"}
    assert set(projections["rule"]) == {"attention projection"}
    rest = attention[~attention["module"].str.endswith("/Linear")]
    assert set(rest["category"]) == {"Attention"}
    assert rest["op"].str.contains("attention", na=False).any()  # the SDPA kernels
    assert any("nn.Module scopes" in n for n in qwen_modules.meta["notes"])


def test_graph_replays_read_without_signature_count_workbench_kernels_by_name():
    """The workbench's own MoE kernels, replayed from a CUDA graph, have no scope: their names
    claim them. Before the name rules this decode MoE read 0.000 ms against the run's 0.740."""
    run = workbench.load(FIXTURES / "h200-graphs-2layers")
    raw = workbench.load_trace(FIXTURES / "h200-graphs-2layers" / "trace.json.gz")
    saved = run.decode().loc["MoE", "mean_ms"]
    by_names = raw.decode().loc["MoE", "mean_ms"]
    assert saved == pytest.approx(0.740, abs=0.001)
    # What only the signature knows: torch's own topk/sort/softmax/copies of the MoE layer.
    assert 0.9 * saved < by_names <= saved
    k = raw.kernels
    named = k[k["graph"] & k["name"].str.match(r"^_(stock|counts|offsets|permute|combine)")]
    assert len(named) > 0 and set(named["category"]) == {"MoE"}
    assert set(named["rule"]) <= {"workbench MoE GEMM", "workbench MoE routing"}
    assert any("workbench.load(" in note for note in raw.meta["notes"])
