"""Each kernel's share of a timed call (`workbench.capture.kernel_times`): the sums per name
per call, and nothing off a GPU, where a call launches no kernel."""

import pytest
import torch

from workbench.analysis.tables import TOTAL, short_kernel_name
from workbench.capture.kernel_times import NAME_CHARS, kernel_ms, per_call


def test_launches_sum_by_name_per_call_longest_first_with_their_total():
    long = "sm90_xmma_gemm_" + "x" * 200  # cuBLAS's names run to hundreds of characters
    launches = [("_gate_up", 100.0), ("_down", 40.0), ("_gate_up", 110.0), (long, 30.0),
                (long + "y", 30.0)]  # fmt: skip
    parts = per_call(launches, calls=2)
    shown = short_kernel_name(long, NAME_CHARS)
    assert list(parts) == ["_gate_up", shown, "_down", TOTAL]
    assert parts["_gate_up"] == pytest.approx(0.105)  # ms per call: (100 + 110) us / 2
    assert parts[shown] == pytest.approx(0.030)  # one name, kept short
    assert parts[TOTAL] == pytest.approx(0.155)
    assert per_call([], calls=2) == {}


def test_off_a_gpu_a_call_has_no_kernels_to_share():
    calls = []
    assert kernel_ms(lambda: calls.append(1), torch.device("cpu")) == {}
    assert calls == []  # not even run
