"""Statistics of repeated timings: medians with distribution-free intervals, ratios, and when to
stop repeating.

Kernel timings are skewed (clock ramps, preemption, a cold cache add a long right tail), so
everything here is about the median and makes no normality assumption. Pure numpy: no torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
MIN_PAIRS = 5  # fewest pairs (steps, rounds) a paired interval is given for
MIN_RUNS = 3  # fewest runs an arm that `runs_median_ratio` gives an interval for


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """0-based order-statistic indices (lo, hi) of a distribution-free interval for the median.

    The count of samples below the true median is binomial(n, 1/2) whatever the distribution,
    so [x_(l), x_(n-l+1)] (1-based) covers the median with probability 1 - 2 P(B <= l-1). `l`
    is the largest rank keeping that at or above `confidence` (n=20: ranks 6 and 15, 95.9%).
    Below n=6 no pair of ranks reaches 95%; the interval is then the sample range (min, max),
    whose coverage is only 1 - 2^(1-n).
    """
    if n < 1:
        raise ValueError("no samples")
    alpha = (1.0 - confidence) / 2
    cumulative, rank = 0.0, 0  # rank = l - 1 = the number of samples allowed below the interval
    for k in range(n):
        cumulative += math.comb(n, k) / 2.0**n
        if cumulative > alpha:
            break
        rank = k + 1
    lo = max(rank - 1, 0)
    return lo, n - 1 - lo


def summarise(samples: Sequence[float]) -> dict:
    """Median, quartiles, IQR and the 95% order-statistic interval of the median (see above)."""
    x = np.sort(np.asarray(samples, dtype=float))
    if x.size == 0:
        raise ValueError("no samples")
    q1, median, q3 = np.quantile(x, [0.25, 0.5, 0.75])
    lo, hi = median_ci_ranks(x.size)
    return {
        "median": float(median),
        "q1": float(q1),
        "q3": float(q3),
        "iqr": float(q3 - q1),
        "ci_low": float(x[lo]),
        "ci_high": float(x[hi]),
        "n": int(x.size),
    }


def ratio(a_samples: Sequence[float], b_samples: Sequence[float], seed: int = 0) -> dict:
    """median(b) / median(a) with a 95% percentile-bootstrap interval.

    With times, a ratio above 1 means b is slower than a. The two samples are resampled
    independently (they are separate runs), `BOOTSTRAP_RESAMPLES` times from
    `numpy.random.default_rng(seed)`, so the interval is reproducible. `significant` means the
    interval excludes 1: the difference is larger than the run-to-run noise.
    """
    a, b = np.asarray(a_samples, dtype=float), np.asarray(b_samples, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("no samples")
    rng = np.random.default_rng(seed)
    med_a = np.median(rng.choice(a, size=(BOOTSTRAP_RESAMPLES, a.size)), axis=1)
    med_b = np.median(rng.choice(b, size=(BOOTSTRAP_RESAMPLES, b.size)), axis=1)
    alpha = (1.0 - CONFIDENCE) / 2
    low, high = np.quantile(med_b / med_a, [alpha, 1.0 - alpha])
    return {
        "ratio": float(np.median(b) / np.median(a)),
        "ci_low": float(low),
        "ci_high": float(high),
        "significant": bool(low > 1.0 or high < 1.0),
    }


def paired_median_ratio(a_samples: Sequence[float], b_samples: Sequence[float], seed: int = 0
                        ) -> dict:  # fmt: skip
    """median(b) / median(a) for two contenders sampled in the same rounds, with a 95%
    bootstrap interval that resamples whole rounds.

    A benchmark times the rows it compares in turns (`adaptive_rounds`): the i-th sample of
    each came from the same round, so whatever moved the GPU over the run (power, clocks)
    moved both. Resampling round indices keeps each round's pair together, so that shared
    drift is not counted as noise, as `ratio`'s independent resampling would. Fewer than
    MIN_PAIRS rounds get no interval and are never significant. The interval covers the noise
    within one run, not the spread between runs.
    """
    a, b = np.asarray(a_samples, dtype=float), np.asarray(b_samples, dtype=float)
    if a.size == 0 or a.size != b.size:
        raise ValueError(f"paired samples need equal, non-zero counts; got {a.size} and {b.size}")
    point = float(np.median(b) / np.median(a))
    if a.size < MIN_PAIRS:
        return {"ratio": point, "ci_low": math.nan, "ci_high": math.nan, "significant": False}
    picks = np.random.default_rng(seed).integers(0, a.size, size=(BOOTSTRAP_RESAMPLES, a.size))
    alpha = (1.0 - CONFIDENCE) / 2
    low, high = np.quantile(np.median(b[picks], axis=1) / np.median(a[picks], axis=1),
                            [alpha, 1.0 - alpha])  # fmt: skip
    return {"ratio": point, "ci_low": float(low), "ci_high": float(high),
            "significant": bool(low > 1.0 or high < 1.0)}  # fmt: skip


def paired_ratio(a_samples: Sequence[float], b_samples: Sequence[float], seed: int = 0) -> dict:
    """sum(b) / sum(a) over matched steps, with a 95% bootstrap interval over the steps.

    For runs whose i-th samples did the same work: the prefill chunks of two profiles (each at
    a longer context than the last, so the samples are not alike and an unpaired bootstrap of
    medians would mistake that spread for noise) or their decode steps. The ratio of sums is
    the ratio of throughputs; resampling step indices keeps each pair together. Fewer than
    MIN_PAIRS steps get no interval and are never significant. The interval covers the
    step-to-step noise of one run per arm, not the run-to-run noise of repeating the runs.
    """
    a, b = np.asarray(a_samples, dtype=float), np.asarray(b_samples, dtype=float)
    if a.size == 0 or a.size != b.size:
        raise ValueError(f"paired samples need equal, non-zero counts; got {a.size} and {b.size}")
    if a.size < MIN_PAIRS:  # a resample of so few steps says nothing about the noise
        return {"ratio": float(b.sum() / a.sum()), "ci_low": math.nan, "ci_high": math.nan,
                "significant": False}  # fmt: skip
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, a.size, size=(BOOTSTRAP_RESAMPLES, a.size))
    alpha = (1.0 - CONFIDENCE) / 2
    low, high = np.quantile(b[picks].sum(axis=1) / a[picks].sum(axis=1), [alpha, 1.0 - alpha])
    return {
        "ratio": float(b.sum() / a.sum()),
        "ci_low": float(low),
        "ci_high": float(high),
        "significant": bool(low > 1.0 or high < 1.0),
    }


def runs_ratio(
    a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]], seed: int = 0
) -> dict:
    """sum(b) / sum(a) over R pairs of runs of matched steps (run r of each arm did the same
    steps), with a two-level 95% bootstrap: the run pairs are resampled, then the steps within
    each pair picked (kept paired). The interval then covers the run-to-run noise (a new
    process: its clocks, its memory, the host's wait before each CUDA graph) as well as the
    step-to-step noise, which `paired_ratio` alone, one run per arm, does not: on the H200 a
    profile A/B of two arms running the same kernels read 1.05x (1.01-1.09) at decode. One
    pair is `paired_ratio`; a pair of fewer than MIN_PAIRS steps gives no interval."""
    if not a_runs or len(a_runs) != len(b_runs):
        raise ValueError(f"need as many runs of a as of b, at least one; got {len(a_runs)} "
                         f"and {len(b_runs)}")  # fmt: skip
    if len(a_runs) == 1:
        return paired_ratio(a_runs[0], b_runs[0], seed)
    pairs = [(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
             for a, b in zip(a_runs, b_runs, strict=True)]  # fmt: skip
    if any(a.size == 0 or a.size != b.size for a, b in pairs):
        raise ValueError("each pair of runs needs equal, non-zero step counts.")
    point = float(sum(b.sum() for _, b in pairs) / sum(a.sum() for a, _ in pairs))
    if min(a.size for a, _ in pairs) < MIN_PAIRS:
        return {"ratio": point, "ci_low": math.nan, "ci_high": math.nan, "significant": False}
    rng = np.random.default_rng(seed)
    # Per pair, the step-level resamples of both arms' sums; then R pairs drawn per resample.
    sums_a = np.empty((len(pairs), BOOTSTRAP_RESAMPLES))
    sums_b = np.empty_like(sums_a)
    for r, (a, b) in enumerate(pairs):
        picks = rng.integers(0, a.size, size=(BOOTSTRAP_RESAMPLES, a.size))
        sums_a[r], sums_b[r] = a[picks].sum(axis=1), b[picks].sum(axis=1)
    chosen = rng.integers(0, len(pairs), size=(BOOTSTRAP_RESAMPLES, len(pairs)))
    column = np.arange(BOOTSTRAP_RESAMPLES)[:, None]
    ratios = sums_b[chosen, column].sum(axis=1) / sums_a[chosen, column].sum(axis=1)
    alpha = (1.0 - CONFIDENCE) / 2
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return {"ratio": point, "ci_low": float(low), "ci_high": float(high),
            "significant": bool(low > 1.0 or high < 1.0)}  # fmt: skip


def runs_median_ratio(
    a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]], seed: int = 0
) -> dict:
    """median(b's run medians) / median(a's run medians) over each arm's runs of unpaired
    samples (a kernel A/B repeated: one worker a run), with a two-level 95% bootstrap: each
    arm's runs resampled, then the samples within each drawn run (a run drawn twice in one
    resample reuses its inner resample, which errs wide). So the interval covers the noise
    between processes (each run's clocks, caches and compiled code loaded anew) as well as
    within one, which `ratio` of one run an arm does not. One run an arm is `ratio`. With
    fewer than MIN_RUNS runs in an arm there is no interval and never significance: two runs
    cannot say how far apart processes read (simulated with equal arms, two runs each read
    "significant" 19-31% of the time, three 4-8%)."""
    if not a_runs or not b_runs:
        raise ValueError("need at least one run of each arm")
    if len(a_runs) == 1 and len(b_runs) == 1:
        return ratio(a_runs[0], b_runs[0], seed)
    runs = [[np.asarray(r, dtype=float) for r in arm] for arm in (a_runs, b_runs)]
    if any(r.size == 0 for arm in runs for r in arm):
        raise ValueError("a run has no samples")
    point = float(np.median([np.median(r) for r in runs[1]]) /
                  np.median([np.median(r) for r in runs[0]]))  # fmt: skip
    if min(len(a_runs), len(b_runs)) < MIN_RUNS:
        return {"ratio": point, "ci_low": math.nan, "ci_high": math.nan, "significant": False}
    rng = np.random.default_rng(seed)

    def resampled(arm: list[np.ndarray]) -> np.ndarray:
        """Per resample: the median over R drawn runs of a resampled median of each."""
        medians = np.stack([np.median(r[rng.integers(0, r.size, (BOOTSTRAP_RESAMPLES, r.size))],
                                      axis=1) for r in arm])  # fmt: skip
        chosen = rng.integers(0, len(arm), size=(BOOTSTRAP_RESAMPLES, len(arm)))
        return np.median(medians[chosen, np.arange(BOOTSTRAP_RESAMPLES)[:, None]], axis=1)

    alpha = (1.0 - CONFIDENCE) / 2
    low, high = np.quantile(resampled(runs[1]) / resampled(runs[0]), [alpha, 1.0 - alpha])
    return {"ratio": point, "ci_low": float(low), "ci_high": float(high),
            "significant": bool(low > 1.0 or high < 1.0)}  # fmt: skip


@dataclass(frozen=True)
class Repeats:
    """When `adaptive_rounds` stops: at least `min_n` rounds, at most `max_n` rounds or
    `budget_s` seconds a measure, and once every median's 95% interval is narrower than
    `rel_width` of it."""

    min_n: int = 10
    max_n: int = 200
    rel_width: float = 0.02
    budget_s: float = 10.0


def williams_orders(k: int) -> list[list[int]]:
    """The orders of a Williams design for k contenders: k orders (2k for odd k > 1) in which
    each contender takes each place, and follows each other contender, equally often.

    Rounds taken in these orders balance both the place in a round (the first one timed read
    faster) and the kernel just before (the state it leaves: heat, clocks, caches) over each
    full cycle of orders, where a random order balances them only on average and a rotation by
    one keeps every contender behind the same neighbour.
    """
    if k <= 0:
        return []
    first, low, high = [0], 1, k - 1
    while len(first) < k:  # 0, 1, k-1, 2, k-2, ...
        first.append(low)
        low += 1
        if len(first) < k:
            first.append(high)
            high -= 1
    orders = [[(x + shift) % k for x in first] for shift in range(k)]
    return orders + [order[::-1] for order in orders] if k % 2 and k > 1 else orders


def adaptive_rounds(
    measures: Sequence[Callable[[], float]],
    min_n: int = 10,
    max_n: int = 200,
    rel_width: float = 0.02,
    budget_s: float = 10.0,
) -> list[tuple[list[float], str] | Exception]:
    """Sample the measures in rounds until every one's median 95% interval is narrower than
    rel_width * its median.

    Each round takes one sample of every measure, the rounds' orders cycling through a
    Williams design (`williams_orders`). Contenders compared from one run are then sampled in
    the same stretch of time, each as often first or last and after each of the others, so
    a GPU's drift over a run (clocks, power, the state the kernel before leaves) falls on all
    of them alike; timed one after another, the first one timed read a few percent faster
    (docs/design.md, "position effect"). So all stay in the rounds until all are done (a
    quiet measure that stopped early would have its samples from a different stretch of time
    than the noisy ones'), and convergence ends the rounds only at the end of a full cycle of
    orders.

    Sampling stops when every measure has converged (after at least `min_n` rounds, at the
    end of a cycle), after `max_n` rounds, or once `budget_s * len(measures)` seconds have
    passed (wall clock, checked between rounds). Returns each measure's samples and
    "converged" if its interval is narrow, else why the rounds stopped ("max_n" or "budget").
    A measure that raises leaves the rounds (the others' design starts afresh), its result is
    the exception, and the others go on.
    """
    start = time.perf_counter()
    samples: list[list[float]] = [[] for _ in measures]
    failed: dict[int, Exception] = {}
    live, stopped = list(range(len(measures))), ""
    orders, cycle_start, rounds = williams_orders(len(live)), 0, 0
    while live and not stopped:
        for place in orders[(rounds - cycle_start) % len(orders)]:
            i = live[place]
            try:
                samples[i].append(float(measures[i]()))
            except Exception as err:  # noqa: BLE001 (one failing contender must not stop the rest)
                failed[i] = err
        rounds += 1
        if any(i in failed for i in live):
            live = [i for i in live if i not in failed]
            orders, cycle_start = williams_orders(len(live)), rounds
        cycle_done = (rounds - cycle_start) % max(len(orders), 1) == 0
        if cycle_done and all(_converged(samples[i], min_n, rel_width) for i in live):
            stopped = "converged"
        elif rounds >= max_n:
            stopped = "max_n"
        elif time.perf_counter() - start >= budget_s * len(measures):
            stopped = "budget"
    return [
        failed[i] if i in failed else
        (samples[i], "converged" if _converged(samples[i], min_n, rel_width) else stopped)
        for i in range(len(measures))
    ]  # fmt: skip


def _converged(samples: list[float], min_n: int, rel_width: float) -> bool:
    """At least `min_n` samples, and their median's 95% interval narrower than `rel_width`
    of it."""
    if len(samples) < min_n:
        return False
    s = summarise(samples)
    return s["ci_high"] - s["ci_low"] < rel_width * abs(s["median"])
