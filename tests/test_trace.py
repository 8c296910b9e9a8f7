"""Reading Chrome traces and attributing their ops and kernels to categories."""

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import workbench
from workbench import load_trace
from workbench.analysis.rules import Rule
from workbench.analysis.trace import ChromeTrace, kernel_table, read_chrome_trace
from workbench.errors import ArtifactError, WorkbenchError

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """A real CPU trace with the workbench's scope structure, written by torch.profiler."""
    x = torch.randn(64, 64)
    w = torch.randn(4, 64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(2):
            with record_function(f"wb.decode#{step}"):
                for layer in range(2):
                    with record_function(f"wb.layer#{layer}"):
                        with record_function("dense"):
                            y = torch.nn.functional.linear(x, x)
                        with record_function("moe"):
                            torch.topk(y, 2)
                            torch._grouped_mm  # noqa: B018 (attribute, not a call)
                        torch.softmax(y, -1)  # outside any category scope
        torch.bmm(w, w)  # outside every scope: the op rules decide
    path = tmp_path_factory.mktemp("trace") / "cpu.json"
    prof.export_chrome_trace(str(path))
    return path


def test_cpu_trace_rows_are_ops_timed_by_self_time(cpu_trace):
    trace = read_chrome_trace(cpu_trace)
    table = kernel_table(trace)
    assert set(table["kind"]) == {"cpu_op"}
    # Self times add up to the top-level ops' durations: nothing is counted twice.
    linear = [e for e in trace.events if e["name"] == "aten::linear"]
    under_linear = table[table["op"].isin(["aten::linear", "aten::t", "aten::matmul", "aten::mm"])]
    assert under_linear["dur_us"].sum() <= sum(e["dur"] for e in linear) + 1e-6
    assert (table["dur_us"] >= 0).all()
    mm = table[table["name"] == "aten::mm"]
    assert len(mm) == 4 and set(mm["category"]) == {"Dense GEMM"} and set(mm["source"]) == {"range"}
    topk = table[table["name"] == "aten::topk"]
    assert set(topk["category"]) == {"MoE"}
    assert sorted(topk["step"].tolist()) == [0, 0, 1, 1]
    assert sorted(topk["layer"].tolist()) == [0, 0, 1, 1]
    assert set(topk["phase"]) == {"decode"}


def test_ops_outside_scopes_fall_back_to_op_rules_then_default(cpu_trace):
    table = kernel_table(read_chrome_trace(cpu_trace))
    bmm = table[table["name"] == "aten::bmm"].iloc[0]
    assert (bmm["category"], bmm["source"], bmm["phase"]) == ("Dense GEMM", "op", "other")
    softmax = table[table["name"] == "aten::_softmax"]
    assert set(softmax["category"]) == {"Other"} and set(softmax["source"]) == {"default"}


def test_user_rules_go_first(cpu_trace):
    claim = Rule("op", r"^aten::_softmax$", "Softmax")
    result = load_trace(cpu_trace, rules=[claim])
    assert set(result.kernels.loc[result.kernels["name"] == "aten::_softmax", "category"]) == {
        "Softmax"
    }
    assert "Softmax" in result.by_phase("decode").index


def test_gzipped_trace_reads_the_same(cpu_trace, tmp_path):
    gz = tmp_path / "cpu.json.gz"
    gz.write_bytes(gzip.compress(cpu_trace.read_bytes()))
    plain = kernel_table(read_chrome_trace(cpu_trace))
    packed = kernel_table(read_chrome_trace(gz))
    assert plain.equals(packed)


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("empty.json", b"", "is empty"),
        ("blank.json", b"  \n", "is empty"),
        ("truncated.json", b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1', "truncated"),
        ("bad.json.gz", b"\x1f\x8b\x08\x00garbage", "gzip-compressed but corrupt"),
        ("other.json", json.dumps({"hello": 1}).encode(), "no 'traceEvents' list"),
        ("nothing.json", json.dumps({"traceEvents": [{"ph": "M"}]}).encode(), "no complete"),
        ("binary.json", bytes(range(256)), "not valid JSON"),
    ],
)
def test_damaged_traces_get_a_clear_error(tmp_path, name, data, message):
    with pytest.raises(ArtifactError, match=message):
        read_chrome_trace(_write(tmp_path, name, data))


def test_truncated_gzip_gets_a_clear_error(cpu_trace, tmp_path):
    packed = gzip.compress(cpu_trace.read_bytes())
    path = _write(tmp_path, "cut.json.gz", packed[: len(packed) // 2])
    with pytest.raises(ArtifactError, match="corrupt or truncated"):
        read_chrome_trace(path)


def test_missing_trace(tmp_path):
    with pytest.raises(ArtifactError, match="does not exist"):
        read_chrome_trace(tmp_path / "nope.json")


def test_short_kernel_names_fold_templates_and_drop_parameters():
    from workbench.analysis.tables import short_kernel_name

    name = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::"
        "BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>)"
    )
    assert short_kernel_name(name) == (
        "at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<…>, "
        "std::array<…> >"
    )
    assert short_kernel_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD (Device -> Device)"
    assert short_kernel_name("_gate_up_kernel") == "_gate_up_kernel"
    assert len(short_kernel_name("k" * 500)) == 120


# ---- the rule that decided, and what a note must say ---------------------------------------


def test_each_row_names_the_rule_that_decided_it(cpu_trace):
    table = kernel_table(read_chrome_trace(cpu_trace))
    mm = table[table["name"] == "aten::mm"]
    assert set(mm["rule"]) == {"scope dense"}
    bmm = table[table["name"] == "aten::bmm"]
    assert (bmm["source"].iloc[0], bmm["rule"].iloc[0]) == ("op", "GEMM op")
    softmax = table[table["name"] == "aten::_softmax"]
    assert set(softmax["rule"]) == {"default"}
    assert table["rule"].notna().all()


def test_attribution_counts_kernels_by_deciding_rule(cpu_trace):
    result = load_trace(cpu_trace)
    table = result.attribution()
    assert table.index.names == ["category", "decided by", "rule"]
    assert table["kernels"].sum() == len(result.kernels)
    k = result.kernels
    in_dense_scope = ((k["category"] == "Dense GEMM") & (k["source"] == "range")).sum()
    assert table.loc[("Dense GEMM", "range", "scope dense"), "kernels"] == in_dense_scope > 0
    under_bmm = (k["source"] == "op").sum()  # the lone bmm and its child ops
    assert table.loc[("Dense GEMM", "op", "GEMM op"), "kernels"] == under_bmm > 0


def test_a_cpu_only_trace_says_its_rows_are_cpu_ops(cpu_trace):
    result = load_trace(cpu_trace)
    assert result.meta["device"] == "cpu"
    notes = " ".join(result.meta["notes"])
    assert "no GPU kernels" in notes and "CPU op time" in notes
    assert all(note in result.text() for note in result.meta["notes"])


def test_a_hand_written_cpu_trace_gets_the_note(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 6, "dur": 2},
    ]
    path = _write(tmp_path, "cpu.json", json.dumps({"traceEvents": events}).encode())
    result = load_trace(path)
    assert any("no GPU kernels" in n for n in result.meta["notes"])
    assert result.by_phase("all").loc["Total", "kernels"] == 2


@pytest.fixture(scope="module")
def stepless_trace(tmp_path_factory):
    """Steps as users write them: every step in a scope of the same name."""
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("prefill"):
            torch.mm(x, x)
        for _ in range(3):
            with record_function("decode"):
                torch.mm(x, x)
                for _ in range(2):  # phase-named scopes inside a step do not count as steps
                    with record_function("decode_attention"):
                        torch.relu(x)
    path = tmp_path_factory.mktemp("trace") / "stepless.json"
    prof.export_chrome_trace(str(path))
    return path


def test_repeated_step_scopes_are_numbered_in_order(stepless_trace):
    result = load_trace(stepless_trace)
    decode = result.kernels[result.kernels["phase"] == "decode"]
    assert sorted(decode["step"].unique()) == [0, 1, 2]
    assert result.decode().attrs["steps"] == 3
    assert result.prefill().loc["Total", "kernels"] > 0
    assert any("3 scopes named 'decode'" in n for n in result.meta["notes"])
    assert not any("decode_attention" in n for n in result.meta["notes"])


def test_a_phase_without_steps_is_one_step():
    from workbench.analysis.tables import per_step_table
    from workbench.analysis.trace import KERNEL_DTYPES, with_schema

    base = {c: None for c in KERNEL_DTYPES} | {"graph": False, "phase": "decode"}
    rows = [base | {"name": "k", "category": "MoE", "start_us": t, "dur_us": 1.0}
            for t in (0.0, 2.0)]  # fmt: skip
    table = per_step_table(with_schema(pd.DataFrame(rows)), "decode")
    assert table.attrs["steps"] == 1
    assert table.loc["MoE", "mean_ms"] == pytest.approx(0.002)
    assert table.loc["Gaps between kernels", "mean_ms"] == pytest.approx(0.001)


class TinySparseMoeBlock(torch.nn.Module):
    """An MoE block as HF writes one: a router Linear, top-k, and experts."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(16, 4)
        self.experts = torch.nn.Linear(16, 16)

    def forward(self, x):
        weights, ids = torch.topk(self.gate(x).softmax(-1), 2)
        return self.experts(x) * weights.sum(-1, keepdim=True) + ids.float().mean()


class TinyAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        q = self.q_proj(x)
        return torch.softmax(q @ q.T, -1) @ q


def test_module_scopes_decide_before_ops_and_names(tmp_path):
    blocks = torch.nn.Sequential(TinyAttention(), TinySparseMoeBlock())
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof, torch.no_grad():
        blocks(x)
    path = tmp_path / "modules.json"
    prof.export_chrome_trace(str(path))
    result = load_trace(path)
    k = result.kernels
    moe = k[k["module"].str.contains("TinySparseMoeBlock", na=False)]
    assert {"aten::topk", "aten::addmm"} <= set(moe["name"])
    assert set(moe["category"]) == {"MoE"} and set(moe["rule"]) == {"MoE block module"}
    projection = k[k["module"].str.endswith("TinyAttention/Linear", na=False)]
    assert len(projection) and set(projection["category"]) == {"Dense GEMM"}
    scores = k[(k["module"] == "Sequential/TinyAttention") & (k["name"] == "aten::mm")]
    assert len(scores) and set(scores["category"]) == {"Attention"}
    assert any("nn.Module scopes" in n for n in result.meta["notes"])


# ---- bad paths ------------------------------------------------------------------------------


def test_a_directory_is_not_said_to_be_missing(tmp_path):
    (tmp_path / "run" / "sub").mkdir(parents=True)
    (tmp_path / "run" / "trace.json.gz").write_bytes(b"")
    (tmp_path / "run" / "sub" / "rank0.json").write_bytes(b"")
    with pytest.raises(ArtifactError) as err:
        load_trace(tmp_path / "run")
    message = str(err.value)
    assert "is a directory" in message and "does not exist" not in message
    assert "trace.json.gz" in message and "sub/rank0.json" in message
    assert "\n" not in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="is a directory.*no .json or .json.gz files"):
        load_trace(tmp_path / "empty")


def test_a_run_directory_points_to_load():
    with pytest.raises(
        ArtifactError, match=r"is a directory.*trace\.json\.gz.*workbench\.load"
    ) as err:
        load_trace(FIXTURES / "h200-model-2layers")
    assert "run.json" not in str(err.value)  # metadata, not a trace


@pytest.mark.parametrize("bad", [None, "", 3])
def test_no_path_is_a_one_line_error(bad):
    with pytest.raises(ArtifactError, match="needs the path") as err:
        load_trace(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ArtifactError, match="needs the path"):
        workbench.load(bad)


def test_load_on_a_trace_file_points_to_load_trace():
    with pytest.raises(ArtifactError, match="load_trace"):
        workbench.load(FIXTURES / "h200-model-2layers" / "trace.json.gz")


def test_one_user_rule_need_not_be_in_a_list(cpu_trace):
    claim = Rule("op", r"^aten::_softmax$", "Softmax", name="my softmax")
    result = load_trace(cpu_trace, rules=claim)
    softmax = result.kernels[result.kernels["name"] == "aten::_softmax"]
    assert set(softmax["rule"]) == {"my softmax"}
    with pytest.raises(WorkbenchError, match="must be Rule objects"):
        load_trace(cpu_trace, rules=["aten::_softmax"])


def test_tables_saved_before_the_rule_column_get_it_from_what_rows_show():
    from workbench.analysis.trace import KERNEL_DTYPES, with_schema

    base = {c: None for c in KERNEL_DTYPES if c not in ("rule", "module")} | {"graph": False}
    rows = [
        ("moe", "MoE", "range", None),
        ("fused_moe_kernel", "MoE", "kernel", None),
        ("nvjet_sm90_tst", "Dense GEMM", "op", "aten::mm"),
        ("Memcpy DtoD (Device -> Device)", "Other", "default", None),
        ("_stock_down_kernel", "MoE", "graph-position", None),
        ("my_kernel", "Dense GEMM", "kernel", None),  # a rule since removed
    ]
    old = pd.DataFrame([base | dict(zip(("name", "category", "source", "op"), r)) for r in rows])
    table = with_schema(old)
    assert table["rule"].tolist() == [
        "scope moe",
        "MoE kernel",
        "GEMM op",
        "default",
        "eager signature position",
        "kernel (not recorded)",
    ]
    assert table["module"].isna().all()


def test_kernels_without_launch_calls_say_their_categories_rest_on_names(tmp_path):
    """A trace profiled with ProfilerActivity.CUDA only: no op, no scope, only names."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "fused_moe_kernel", "pid": 0, "tid": 7, "ts": 0,
         "dur": 5, "args": {"correlation": 11}},
        {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "pid": 0,
         "tid": 7, "ts": 6, "dur": 2, "args": {"correlation": 12}},
    ]  # fmt: skip
    path = _write(tmp_path, "gpu-only.json", json.dumps({"traceEvents": events}).encode())
    result = load_trace(path)
    assert result.meta["device"] == "cuda"
    assert any("None of the 2 GPU kernels" in n for n in result.meta["notes"])
    assert result.kernels["category"].tolist() == ["MoE", "Other"]
    assert result.by_phase("all").loc["MoE", "kernels"] == 1


def test_a_kernel_launched_early_starts_where_the_one_before_it_on_its_stream_ended(tmp_path):
    """Programmatic dependent launch: kernel b starts 3 us before a ends on stream 7 and waits;
    c runs on stream 9 meanwhile. b is cut to start at a's end, the cut kept as waited_us, so
    the stream's time is counted once; other streams and back-to-back kernels are untouched."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "a_gemm", "pid": 0, "tid": 7, "ts": 0, "dur": 10,
         "args": {"stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "b_gemm", "pid": 0, "tid": 7, "ts": 7, "dur": 8,
         "args": {"stream": 7, "correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "c_other", "pid": 0, "tid": 9, "ts": 8, "dur": 4,
         "args": {"stream": 9, "correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "d_gemm", "pid": 0, "tid": 7, "ts": 15, "dur": 2,
         "args": {"stream": 7, "correlation": 4}},
    ]  # fmt: skip
    path = _write(tmp_path, "pdl.json", json.dumps({"traceEvents": events}).encode())
    table = load_trace(path).kernels.set_index("name")
    assert table.loc["b_gemm", ["start_us", "dur_us", "waited_us"]].tolist() == [10, 5, 3]
    assert table.loc["c_other", ["start_us", "dur_us", "waited_us"]].tolist() == [8, 4, 0]
    assert table.loc["d_gemm", ["start_us", "dur_us", "waited_us"]].tolist() == [15, 2, 0]
    assert table.loc[table.index.str.endswith("gemm"), "dur_us"].sum() == 17  # stream 7's busy time
    notes = load_trace(path).meta["notes"]
    assert any("1 GPU kernels started before the one ahead" in n and "3.0 us" in n for n in notes)


def test_a_kernel_inside_the_one_before_it_keeps_no_time():
    events = [
        {"ph": "X", "cat": "kernel", "name": "outer", "pid": 0, "tid": 7, "ts": 0, "dur": 10,
         "args": {"stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "inner", "pid": 0, "tid": 7, "ts": 2, "dur": 3,
         "args": {"stream": 7}},
    ]  # fmt: skip
    table = kernel_table(ChromeTrace(events, {})).set_index("name")
    assert table.loc["inner", ["dur_us", "waited_us"]].tolist() == [0, 3]
