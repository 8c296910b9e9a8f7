"""The GPU's state while a bench's rows were timed, summarised from its `gpu_state` table.

`bench moe`, `bench dense` and `bench attention` sample NVML while each group of rows is timed
in turns (`capture.gpu_state`): one line a sample, with `group` (the same numbers as the
`samples` table's), `t_s`, `sm_mhz`, `mem_mhz`, `power_w`, `temp_c` and `slowdown` (the
reasons NVML gave for holding the clocks down, '+'-joined, empty for none). A slow run is then
told from a slow kernel: its SM clock below the maximum, the share of samples under a power
cap, the temperature it reached. Pure pandas, for the report, a notebook and the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd


def state_summary(state: pd.DataFrame | None, group: int | None = None) -> dict | None:
    """Median, lowest and highest SM clock (MHz), median power (W), highest temperature (C),
    and the share of samples with each slowdown reason, over the whole run or one `group`;
    None when there are no samples."""
    if state is None or state.empty:
        return None
    if group is not None:
        state = state[state["group"] == group]
        if state.empty:
            return None
    reasons = state["slowdown"].fillna("").astype(str).str.split("+").explode()
    shares = reasons[reasons != ""].value_counts() / len(state)
    return {
        "samples": len(state),
        "sm_mhz_median": float(state["sm_mhz"].median()),
        "sm_mhz_min": float(state["sm_mhz"].min()),
        "sm_mhz_max": float(state["sm_mhz"].max()),
        "power_w_median": float(state["power_w"].median()),
        "temp_c_max": float(state["temp_c"].max()),
        "slowdown_share": {str(k): float(v) for k, v in shares.items()},
    }


def summarised(state: pd.DataFrame, max_sm_mhz: float | None = None) -> dict:
    """What a run.json keeps of some readings: their summary and its one-line description."""
    summary = state_summary(state)
    return {"summary": summary, "description": describe_state(summary, max_sm_mhz)}


def describe_state(summary: dict | None, max_sm_mhz: float | None = None) -> str:
    """One line: 'SM clock 1,980 MHz median (1,755-1,980; max 1,980), 640 W, up to 71 C,
    power-cap in 12% of samples', or '' without samples."""
    if not summary:
        return ""
    top = f"; max {max_sm_mhz:,.0f}" if max_sm_mhz else ""
    clocks = (f"SM clock {summary['sm_mhz_median']:,.0f} MHz median "
              f"({summary['sm_mhz_min']:,.0f}-{summary['sm_mhz_max']:,.0f}{top})")  # fmt: skip
    parts = [clocks, f"{summary['power_w_median']:.0f} W", f"up to {summary['temp_c_max']:.0f} C"]
    slowdowns = summary["slowdown_share"]
    parts += [f"{name} in {share:.0%} of samples" for name, share in slowdowns.items()]
    if not slowdowns:
        parts.append("no slowdown reported")
    return ", ".join(parts)


def state_by_size(state: pd.DataFrame | None, samples: pd.DataFrame | None,
                  bench: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:  # fmt: skip
    """One line a group of rows timed in turns, named by its rows' `names` columns of `bench`
    (dense: `m`; MoE: `routing` and `tokens`): how many rows, the SM clock (median, lowest),
    the median power and the share of samples under a power cap or another slowdown (named by
    its group number where `bench` has none of `names`). Empty when the run read no state (a
    CPU run, runs before 2026-12-04T05:02)."""
    if state is None or state.empty or samples is None or samples.empty:
        return pd.DataFrame()
    names = [n for n in names if n in bench]
    lines = []
    for group, rows in samples.groupby("group")["row"]:
        summary = state_summary(state, int(group))
        if summary is None:
            continue
        positions = sorted(set(rows))
        slowdown = summary["slowdown_share"]
        label = {n: _label(bench.iloc[positions][n]) for n in names} or {"group": int(group)}
        lines.append({
            **label, "rows": len(positions),
            "SM clock median (MHz)": summary["sm_mhz_median"],
            "SM clock lowest (MHz)": summary["sm_mhz_min"],
            "power median (W)": summary["power_w_median"],
            "power-capped samples": f"{slowdown.get('power-cap', 0.0):.0%}",
            "other slowdowns": ", ".join(f"{k} {v:.0%}" for k, v in slowdown.items()
                                         if k != "power-cap") or "none",
        })  # fmt: skip
    return pd.DataFrame(lines)


def _label(values: pd.Series) -> str:
    """A group's values of one naming column: '4,096' for a number, the text otherwise,
    comma-joined (numbers in order) where the group's rows differ; '' for none."""
    present = pd.Series(pd.unique(values.dropna()))
    if present.empty:
        return ""
    if pd.api.types.is_numeric_dtype(present):
        return ", ".join(f"{v:,.0f}" for v in sorted(present))
    return ", ".join(sorted(str(v) for v in present))
