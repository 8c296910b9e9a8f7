"""Statistics of timings against answers known in closed form."""

import math
from collections import Counter

import numpy as np
import pytest

from workbench.analysis import stats


def test_median_interval_uses_the_binomial_order_statistics():
    assert stats.median_ci_ranks(20) == (5, 14)  # 1-based ranks 6 and 15, coverage 95.86%
    assert stats.median_ci_ranks(100) == (39, 60)  # ranks 40 and 61
    assert stats.median_ci_ranks(6) == (0, 5)  # the range already covers 96.9%
    assert stats.median_ci_ranks(5) == (0, 4)  # too few for 95%: the range
    lo, hi = stats.median_ci_ranks(20)
    coverage = sum(math.comb(20, k) for k in range(lo + 1, hi + 1)) / 2**20
    assert coverage >= 0.95


def test_summary_of_a_known_sample():
    s = stats.summarise(np.random.default_rng(0).permutation(np.arange(1.0, 21.0)))
    assert s == {"median": 10.5, "q1": 5.75, "q3": 15.25, "iqr": 9.5, "ci_low": 6.0,
                 "ci_high": 15.0, "n": 20}  # fmt: skip


def test_a_constant_sample_has_a_zero_width_interval():
    s = stats.summarise([2.5] * 12)
    assert s["median"] == s["ci_low"] == s["ci_high"] == 2.5 and s["iqr"] == 0.0


def test_ratio_of_a_sample_to_its_double_is_two_and_significant():
    a = np.random.default_rng(1).lognormal(0.0, 0.05, 40)
    r = stats.ratio(a, 2 * a)
    assert r["ratio"] == pytest.approx(2.0)
    assert r["ci_low"] < 2.0 < r["ci_high"] and r["significant"]
    assert stats.ratio(a, 2 * a) == r  # seeded: reproducible
    same = stats.ratio(a, a)
    assert same["ratio"] == 1.0 and not same["significant"]


def test_ratio_of_overlapping_noise_is_not_significant():
    rng = np.random.default_rng(2)
    r = stats.ratio(rng.normal(10, 1, 15), rng.normal(10, 1, 15))
    assert r["ci_low"] < 1.0 < r["ci_high"] and not r["significant"]


def test_paired_ratio_sees_a_steady_change_through_a_trend():
    # Prefill chunks grow with the context; b is 4% slower on every chunk. Unpaired medians
    # see the trend as noise; pairing sees the change.
    a = np.linspace(480.0, 1040.0, 11)
    b = a * 1.04
    assert not stats.ratio(a, b)["significant"]
    paired = stats.paired_ratio(a, b)
    assert paired["ratio"] == pytest.approx(1.04)
    assert paired["ci_low"] == pytest.approx(1.04) and paired["ci_high"] == pytest.approx(1.04)
    assert paired["significant"]
    with pytest.raises(ValueError, match="equal, non-zero counts; got 11 and 3"):
        stats.paired_ratio(a, b[:3])
    one = stats.paired_ratio([100.0], [100.5])  # one prefill chunk a side: no interval
    assert one["ratio"] == pytest.approx(1.005) and not one["significant"]
    assert math.isnan(one["ci_low"]) and math.isnan(one["ci_high"])


def test_adaptive_rounds_keep_every_measure_until_all_are_done_and_say_why_each_stopped():
    """A quiet measure stays in the rounds while a noisy one needs more, so both have their
    samples from the same stretch of time; each says whether its own interval converged."""
    noise = iter(np.random.default_rng(3).uniform(1, 3, 1000))
    (quiet, noisy) = stats.adaptive_rounds(
        [lambda: 1.0, lambda: next(noise)], min_n=10, max_n=30, rel_width=1e-3
    )
    assert (len(quiet[0]), quiet[1]) == (30, "converged")
    assert (len(noisy[0]), noisy[1]) == (30, "max_n")
    (alone,) = stats.adaptive_rounds([lambda: 1.0], min_n=10, max_n=30, rel_width=1e-3)
    assert (len(alone[0]), alone[1]) == (10, "converged")
    (endless,) = stats.adaptive_rounds(
        [lambda: next(noise)], min_n=5, max_n=10**6, rel_width=1e-3, budget_s=0.05
    )
    assert endless[1] == "budget" and 5 <= len(endless[0]) < 10**6


def test_williams_orders_balance_places_and_neighbours():
    """Over one cycle of orders each contender takes each place, and follows each other one,
    equally often (a rotation by one would keep every contender behind the same neighbour)."""
    assert stats.williams_orders(0) == [] and stats.williams_orders(1) == [[0]]
    for k in range(2, 9):
        orders = stats.williams_orders(k)
        assert len(orders) == (2 * k if k % 2 else k)
        assert all(sorted(order) == list(range(k)) for order in orders)
        places = Counter((x, place) for order in orders for place, x in enumerate(order))
        neighbours = Counter(pair for order in orders for pair in zip(order, order[1:]))
        assert len(places) == k * k and len(set(places.values())) == 1
        assert len(neighbours) == k * (k - 1) and len(set(neighbours.values())) == 1


def test_adaptive_rounds_take_the_measures_in_turns_in_balanced_orders():
    """One sample of each per round, the rounds' orders a Williams design: over the run each
    goes first, and follows each other one, equally often; one that raises leaves with its
    exception and the others go on."""
    calls: list[str] = []

    def recorded(name: str):
        return lambda: calls.append(name) or 1.0

    names = "abcd"
    results = stats.adaptive_rounds([recorded(n) for n in names], min_n=40, max_n=40)
    assert all(result == ([1.0] * 40, "converged") for result in results)
    rounds = ["".join(calls[i : i + 4]) for i in range(0, len(calls), 4)]
    assert all(sorted(r) == list(names) for r in rounds)  # each once a round
    assert Counter(r[0] for r in rounds) == {n: 10 for n in names}
    neighbours = Counter((r[j], r[j + 1]) for r in rounds for j in range(3))
    assert len(neighbours) == 12 and set(neighbours.values()) == {10}
    calls.clear()  # convergence ends the rounds only at the end of a cycle of orders
    (quiet, *_) = stats.adaptive_rounds([recorded(n) for n in "abc"], min_n=2, max_n=50)
    assert len(quiet[0]) == 6 and quiet[1] == "converged"

    def broken() -> float:
        calls.append("broken")
        raise RuntimeError("no kernel for this shape")

    calls.clear()
    results = stats.adaptive_rounds([recorded("a"), broken, recorded("b")], min_n=3, max_n=3)
    assert calls.count("broken") == 1 and calls.count("a") == calls.count("b") == 3
    assert results[0] == ([1.0] * 3, "converged") and results[2] == ([1.0] * 3, "converged")
    assert isinstance(results[1], RuntimeError)
    assert stats.adaptive_rounds([]) == []


def test_runs_ratio_is_paired_ratio_for_one_run_and_refuses_unmatched_runs():
    from workbench.analysis.stats import paired_ratio, runs_ratio

    a, b = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95], [1.1, 1.2, 1.0, 1.1, 1.15, 1.05]
    assert runs_ratio([a], [b]) == paired_ratio(a, b)
    with pytest.raises(ValueError, match="as many runs"):
        runs_ratio([a, a], [b])
    with pytest.raises(ValueError, match="equal, non-zero step counts"):
        runs_ratio([a, a], [b, b[:3]])
    short = runs_ratio([a[:3], a[:3]], [b[:3], b[:3]])  # too few steps to resample
    assert short["ratio"] == pytest.approx(sum(b[:3]) / sum(a[:3])) and not short["significant"]


def test_runs_median_ratio_widens_when_the_processes_disagree():
    rng = np.random.default_rng(1)
    noise = [rng.normal(1.0, 0.005, 60) for _ in range(6)]
    # each arm's runs within 0.5% of each other: a steady 3% is significant
    steady = stats.runs_median_ratio(noise[:3], [1.03 * n for n in noise[3:]])
    assert steady["ratio"] == pytest.approx(1.03, abs=0.005) and steady["significant"]
    # the same 3% where b's processes read 0.97, 1.03 and 1.09: not significant any more
    apart = stats.runs_median_ratio(noise[:3], [f * n for f, n in zip((0.97, 1.03, 1.09),
                                                                      noise[3:])])  # fmt: skip
    assert apart["ratio"] == pytest.approx(1.03, abs=0.005) and not apart["significant"]
    assert apart["ci_high"] - apart["ci_low"] > 4 * (steady["ci_high"] - steady["ci_low"])
    # two runs an arm cannot tell how far processes differ: no interval, never significant
    two = stats.runs_median_ratio(noise[:2], [1.03 * n for n in noise[3:5]])
    assert two["ratio"] == pytest.approx(1.03, abs=0.005) and math.isnan(two["ci_low"])
    assert not two["significant"]
    # one run an arm: the plain ratio of medians
    assert stats.runs_median_ratio([noise[0]], [noise[1]]) == stats.ratio(noise[0], noise[1])
    with pytest.raises(ValueError, match="a run has no samples"):
        stats.runs_median_ratio([noise[0], []], [noise[1]])


def test_paired_median_ratio_cancels_drift_the_rounds_shared():
    """Two rows timed in the same rounds share the GPU's drift: resampling whole rounds keeps
    it out of the interval, where resampling each row apart counts it as noise."""
    from workbench.analysis.stats import paired_median_ratio, ratio

    drift = np.random.default_rng(5).uniform(1.0, 1.3, 60)  # the GPU's state, round by round
    a = 2.0 * drift
    b = 2.4 * drift * np.random.default_rng(6).normal(1.0, 0.002, 60)
    paired, apart = paired_median_ratio(a, b), ratio(a, b)
    assert paired["ratio"] == pytest.approx(np.median(b) / np.median(a))
    assert paired["ci_low"] <= paired["ratio"] <= paired["ci_high"]
    assert paired["ci_high"] - paired["ci_low"] < 0.2 * (apart["ci_high"] - apart["ci_low"])
    assert paired["significant"]
    few = paired_median_ratio(a[:3], b[:3])
    assert math.isnan(few["ci_low"]) and not few["significant"]
    with pytest.raises(ValueError, match="equal, non-zero counts"):
        paired_median_ratio(a, b[:10])
