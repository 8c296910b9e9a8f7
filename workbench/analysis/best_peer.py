"""Ours against the best peer: per size, the fastest of the workbench's kernels beside the
fastest of everyone else's, from one benchmark's rows.

A kernel engineer's first question of a benchmark is "do we beat what a server runs, and by
how much?"; the long table answers it only after reading every row of a size. Only rows that
passed their check and were timed count (status `ok` or `spills`); a size where either side
has none is left out rather than guessed.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

TIMED = ("ok", "spills")
COLUMNS = ["ours", "ours (ms)", "best peer", "peer (ms)", "peer / ours (×)"]


def _fastest(rows: pd.DataFrame) -> tuple[str, float] | None:
    timed = rows[rows["status"].isin(TIMED) & rows["ms"].notna()]
    if timed.empty:
        return None
    best = timed.loc[timed["ms"].idxmin()]
    return str(best["name"]), float(best["ms"])


def ours_vs_best_peer(rows: pd.DataFrame, by: Sequence[str], ours: pd.Series) -> pd.DataFrame:
    """One row per value of `by` (e.g. M, or routing and tokens): the fastest row where `ours`
    is true and the fastest where it is false, each by its `name` column, and the peer's time
    over ours (above 1: ours is faster)."""
    out = {}
    for key, group in rows.groupby(list(by), sort=True):
        mine, theirs = _fastest(group[ours[group.index]]), _fastest(group[~ours[group.index]])
        if mine is None or theirs is None:
            continue
        out[key] = [mine[0], mine[1], theirs[0], theirs[1], theirs[1] / mine[1]]
    frame = pd.DataFrame.from_dict(out, orient="index", columns=COLUMNS)
    frame.index = pd.MultiIndex.from_tuples(
        [k if isinstance(k, tuple) else (k,) for k in out], names=list(by)
    ) if out else pd.Index([], name=by[0])  # fmt: skip
    return frame
