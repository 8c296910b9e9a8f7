"""Two rows of one benchmark run compared round by round.

`bench moe`, `bench dense` and `bench attention` time the rows they compare in turns, one
sample of each a round, and keep every timed row's samples beside the table (its `samples`
table: `row`, the row's position in the bench table; `group`, the rows timed in turns
together, as at one size; `round`; `ms`). Two rows of one group then have their samples in
pairs, and the ratio of their medians gets an interval that resamples whole rounds
(`stats.paired_median_ratio`). Runs written before the samples were kept have no such table,
and their ratios no interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.stats import paired_median_ratio


def row_samples(samples: pd.DataFrame | None, row: int) -> np.ndarray:
    """One row's samples in round order (empty when the run kept none for it)."""
    if samples is None or samples.empty:
        return np.empty(0)
    mine = samples[samples["row"] == row].sort_values("round")
    return mine["ms"].to_numpy(dtype=float)


def rows_ratio(samples: pd.DataFrame | None, a: int, b: int) -> dict | None:
    """Row b's median ms over row a's, with a 95% interval over the rounds they shared, or None
    when the run kept no samples for one of them or they were not timed in the same rounds
    (another group: another size)."""
    if samples is None or samples.empty:
        return None
    groups = samples.groupby("row")["group"].first()
    if a not in groups.index or b not in groups.index or groups[a] != groups[b]:
        return None
    return paired_median_ratio(row_samples(samples, a), row_samples(samples, b))
