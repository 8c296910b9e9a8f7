"""A benchmark run's rows compared round by round (analysis.bench_samples), and the dense
targets giving each speedup its interval when the run kept its samples."""

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.bench_samples import row_samples, rows_ratio
from workbench.analysis.targets import DENSE_LAYER, dense_verdicts


def _samples(rows: dict[int, list[float]], groups: dict[int, int] | None = None) -> pd.DataFrame:
    """A samples table as the benches write it; every row in group 0 unless `groups` says."""
    groups = groups or {}
    lines = [(row, groups.get(row, 0), k, ms) for row, values in rows.items()
             for k, ms in enumerate(values)]  # fmt: skip
    return pd.DataFrame(lines, columns=["row", "group", "round", "ms"])


def test_rows_ratio_pairs_rounds_and_says_when_it_cannot():
    drift = np.linspace(1.0, 1.2, 20)
    samples = _samples({0: list(2.0 * drift), 1: list(3.0 * drift), 2: [1.0] * 20}, {2: 1})
    assert row_samples(samples, 1).tolist() == list(3.0 * drift)
    paired = rows_ratio(samples, 0, 1)
    # every round's pair in the same ratio: the interval is that ratio, drift or not
    assert [paired[k] for k in ("ratio", "ci_low", "ci_high")] == pytest.approx([1.5] * 3)
    assert rows_ratio(samples, 0, 2) is None  # another group's rounds, though as many
    assert rows_ratio(samples, 0, 5) is None  # a row the run did not time
    assert rows_ratio(None, 0, 1) is None  # a run from before samples were kept


def test_the_dense_speedups_carry_their_interval_when_the_run_kept_samples():
    rows = pd.DataFrame(
        {
            "kernel": [DENSE_LAYER] * 4,
            "variant": ["bf16", "w8a16", "bf16", "w8a16"],
            "m": [1, 1, 4, 4],
            "ms": [0.070, 0.054, 0.072, 0.055],
        }
    )
    noise = np.random.default_rng(1).normal(1.0, 0.01, (4, 30))
    samples = _samples({i: list(rows["ms"][i] * noise[i]) for i in range(4)})
    decode = dense_verdicts(rows, samples)[0]
    assert "M=1 1.30x (95%: " in decode.measured and "M=4 1.31x (95%: " in decode.measured
    assert "95%" not in dense_verdicts(rows)[0].measured  # no samples: the median alone


def test_the_w8a8_speedups_and_peer_shares_carry_their_intervals():
    """Dense W8A8 over bf16 and over the fastest FP8 peer, and MoE W8A8 over bf16 flat at
    prefill: each ratio with its interval over the rounds, the row order of the run whatever
    the index the caller's table has."""
    from workbench.analysis.targets import MOE_PREFILL_T, moe_verdicts

    noise = np.random.default_rng(2).normal(1.0, 0.01, (6, 30))
    dense = pd.DataFrame(
        {
            "kernel": [DENSE_LAYER, DENSE_LAYER, "deepgemm"] * 2,
            "variant": ["bf16", "w8a8", "deepgemm"] * 2,
            "m": [4096] * 3 + [16384] * 3,
            "ms": [1.2, 0.9, 0.75, 4.8, 3.6, 3.0],
        },
        index=range(10, 16),  # positions, not labels, match the samples
    )
    samples = _samples({i: list(dense["ms"].iloc[i] * noise[i]) for i in range(6)})
    prefill = dense_verdicts(dense, samples)[3]
    assert "M=4,096 1.33x (95%: " in prefill.measured
    assert "fastest FP8 peer's speed: M=4,096 0.83x (95%: " in prefill.measured

    moe = pd.DataFrame(
        {
            "kernel": ["moe", "moe"],
            "variant": ["flat", "w8a8"],
            "weight_dtype": ["bf16", "fp8"],
            "tokens": [MOE_PREFILL_T] * 2,
            "routing": ["uniform"] * 2,
            "ms": [15.0, 10.0],
        }
    )
    moe_samples = _samples({i: list(moe["ms"][i] * noise[i]) for i in range(2)})
    w8a8 = moe_verdicts(moe, moe_samples)[4]
    assert w8a8.measured.startswith("1.50x (95%: ") and "our bf16 flat's speed" in w8a8.measured
    assert moe_verdicts(moe)[4].measured.startswith("1.50x our bf16 flat's speed")
