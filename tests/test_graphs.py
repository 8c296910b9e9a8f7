"""Graph-replayed kernels: attribution by position, the fallback to names, and idle time."""

import pandas as pd
import pytest

from workbench.analysis.graphs import GRAPH_POSITION, attribute_graph_replays, signature_of
from workbench.analysis.tables import idle_between_kernels_us
from workbench.analysis.trace import KERNEL_DTYPES, with_schema


def _table(rows: list[dict]) -> pd.DataFrame:
    base = {c: None for c in KERNEL_DTYPES} | {"graph": False, "phase": "decode"}
    return with_schema(pd.DataFrame([base | r for r in rows]))


SIGNATURE = signature_of(
    _table(
        [
            {"name": "gemm", "category": "Dense GEMM", "layer": 0, "start_us": 0, "dur_us": 1},
            {"name": "moe_k", "category": "MoE", "layer": 0, "start_us": 2, "dur_us": 1},
            {"name": "gemm", "category": "Dense GEMM", "layer": 1, "start_us": 4, "dur_us": 1},
        ]
    ).assign(source="range")
)


def _replay(correlation: int, names: list[str], t0: float) -> list[dict]:
    return [
        {
            "name": n,
            "category": "Other",
            "source": "default",
            "graph": True,
            "step": correlation,
            "correlation": correlation,
            "start_us": t0 + i,
            "dur_us": 0.5,
        }
        for i, n in enumerate(names)
    ]


def test_replays_that_match_take_category_and_layer_by_position():
    kernels = _table(
        _replay(7, ["gemm", "moe_k", "gemm"], 0) + _replay(8, ["gemm", "moe_k", "gemm"], 10)
    )
    out, summary = attribute_graph_replays(kernels, SIGNATURE)
    assert out["category"].tolist() == ["Dense GEMM", "MoE", "Dense GEMM"] * 2
    assert out["layer"].tolist() == [0, 0, 1] * 2
    assert set(out["source"]) == {GRAPH_POSITION}
    assert summary == {
        "graph_kernels": 6,
        "matched_by_position": 6,
        "replays": 2,
        "replays_fully_matched": 2,
        "signature_kernels": 3,
    }


def test_a_graph_that_differs_falls_back_to_names_with_a_warning():
    kernels = _table(_replay(7, ["gemm", "other_k", "gemm"], 0))
    with pytest.warns(UserWarning, match="2 of 3 graph-replayed kernels matched"):
        out, summary = attribute_graph_replays(kernels, SIGNATURE)
    assert out["source"].tolist() == [GRAPH_POSITION, "default", GRAPH_POSITION]
    assert out["category"].tolist() == ["Dense GEMM", "Other", "Dense GEMM"]
    assert summary["replays_fully_matched"] == 0


def test_eager_kernels_are_left_alone():
    kernels = _table(
        [{"name": "gemm", "category": "MoE", "source": "range", "start_us": 0, "dur_us": 1}]
    )
    out, summary = attribute_graph_replays(kernels, SIGNATURE)
    assert out.equals(kernels) and summary["graph_kernels"] == 0


def test_idle_time_merges_overlapping_kernels():
    rows = pd.DataFrame({"start_us": [0.0, 5.0, 6.0, 20.0], "dur_us": [10.0, 2.0, 6.0, 1.0]})
    assert idle_between_kernels_us(rows) == 8.0  # busy [0, 12) and [20, 21)
    assert idle_between_kernels_us(rows.iloc[:0]) == 0.0
