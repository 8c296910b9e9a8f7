"""Reading Chrome traces and attributing their ops and kernels to categories."""

import gzip
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from workbench import load_trace
from workbench.analysis.rules import Rule
from workbench.analysis.trace import kernel_table, read_chrome_trace
from workbench.errors import ArtifactError


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
