"""Rank skew at collectives: how long each rank waited for the last one to arrive.

A collective cannot finish before every rank has reached it. For the k-th collective of a run,
each rank's arrival is when its collective began (its NCCL kernel, or on the CPU its blocking
all-reduce scope) and the last arrival is the latest of those. A rank's time in the collective
splits into *waiting* (arrival to last arrival: another rank was late) and *transfer* (last
arrival to its end). The seed's "one rank waiting for the other", measured.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.rules import ALL_REDUCE


def collectives(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, collective): index k, phase, step, arrival and end (us).

    Consecutive All-reduce rows of a rank form one collective: in the model every collective
    is separated from the next by compute.
    """
    frames = []
    for rank, rows in kernels.groupby("rank"):
        rows = rows.sort_values("start_us")
        is_ar = rows["category"].eq(ALL_REDUCE).to_numpy()
        starts_new = is_ar & ~pd.Series(is_ar).shift(fill_value=False).to_numpy()
        index = pd.Series(starts_new.cumsum() - 1, index=rows.index)[is_ar]
        ar = rows[is_ar].assign(k=index, end_us=lambda r: r["start_us"] + r["dur_us"])
        grouped = ar.groupby("k").agg(
            phase=("phase", "first"),
            step=("step", "first"),
            arrival_us=("start_us", "min"),
            end_us=("end_us", "max"),
        )
        frames.append(grouped.reset_index().assign(rank=rank))
    if not frames:
        return pd.DataFrame(columns=["rank", "k", "phase", "step", "arrival_us", "end_us"])
    return pd.concat(frames, ignore_index=True)


def skew_table(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per rank and phase: collectives, time in them, waiting for the last rank, transfer (ms).

    Ranks must have run the same collectives in the same order; a rank with a different count
    is reported rather than matched wrongly.
    """
    per = collectives(kernels)
    counts = per.groupby("rank")["k"].nunique()
    if counts.nunique() > 1:
        raise ValueError(f"ranks ran different numbers of collectives: {counts.to_dict()}")
    last = per.groupby("k")["arrival_us"].transform("max")
    per = per.assign(
        wait_us=last - per["arrival_us"],
        transfer_us=(per["end_us"] - last).clip(lower=0),
        time_us=per["end_us"] - per["arrival_us"],
    )
    table = per.groupby(["rank", "phase"]).agg(
        collectives=("k", "count"),
        time_ms=("time_us", "sum"),
        wait_ms=("wait_us", "sum"),
        transfer_ms=("transfer_us", "sum"),
    )
    table[["time_ms", "wait_ms", "transfer_ms"]] /= 1e3
    return table
