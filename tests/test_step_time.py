"""Where a profile's step time goes (`workbench.analysis.step_time`), on kernel tables made by
hand: spans, the union of launches that overlap, categories a step lacks, idle time."""

import pandas as pd
import pytest

from workbench.analysis.step_time import breakdown, busy_ms, step_spans_ms


def _kernels(rows: list[tuple[int, str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["step", "category", "start_us", "dur_us"])


def test_overlapping_launches_count_once_and_gaps_are_idle():
    # step 0: 0-100 dense, 90-150 MoE (a launch overlapping the one before, as PDL's does),
    # 200-250 dense: 250 us span, 200 busy, 50 idle. Step 1: one launch, no gap.
    kernels = _kernels([(0, "Dense GEMM", 0, 100), (0, "MoE", 90, 60), (0, "Dense GEMM", 200, 50),
                        (1, "Dense GEMM", 1000, 80)])  # fmt: skip
    assert step_spans_ms(kernels).tolist() == pytest.approx([0.25, 0.08])
    assert busy_ms(kernels).tolist() == pytest.approx([0.20, 0.08])
    # a launch wholly inside an earlier one adds nothing
    inside = _kernels([(0, "Dense GEMM", 0, 100), (0, "MoE", 10, 20), (0, "MoE", 120, 10)])
    assert busy_ms(inside).tolist() == pytest.approx([0.11])


def test_the_breakdown_takes_each_category_s_median_step_and_counts_a_missing_one_as_zero():
    kernels = _kernels([(0, "Dense GEMM", 0, 100), (0, "MoE", 150, 50),
                        (1, "Dense GEMM", 1000, 120), (1, "MoE", 1120, 30),
                        (2, "Dense GEMM", 2000, 110)])  # fmt: skip
    parts = breakdown(kernels)
    assert parts["category_ms"] == pytest.approx({"Dense GEMM": 0.110, "MoE": 0.030})
    assert parts["idle_ms"] == pytest.approx(0.0)  # idle 0.05, 0, 0: the median step's
