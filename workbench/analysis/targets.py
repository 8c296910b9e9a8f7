"""The dense and MoE kernels' performance targets, checked against benchmark runs.

Each target is a ratio that one run measures on both sides (our kernel over cuBLAS bf16, over
its roofline floor, over the fastest peer, or one arm of an A/B over the other), so a verdict
never mixes runs. The thresholds are the FP8 kernel work's goals: W8A16 beating cuBLAS bf16 at
decode by the bandwidth it saves, W8A8 running prefill at FP8 speed beside DeepGEMM and
cuBLAS's own blockwise FP8, the hybrid taking the better of both, the quantised MoE paths near
their floor, and the seed's hybrid A/B reproduced with significance. A verdict is `met`,
`missed`, or `None` when the run lacks a row it needs (a size or a peer it did not time): a
missing row is never read as a pass.

Pure pandas over the rows `bench dense` and `bench moe` write and an A/B result's table, so
the report, a notebook and the tests read the same verdicts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import pandas as pd

from workbench.analysis.bench_samples import rows_ratio

DENSE_LAYER = "dense-layer"  # bench dense's rows of the workbench's own layer kernels
DECODE_M = (1, 4, 6)
MIDDLE_M = (16, 24, 32, 64, 128, 256)
PREFILL_M = (4096, 16384)
FP8_PEERS = ("deepgemm", "cublas_fp8")
MOE_DECODE_T = 6
MOE_PREFILL_T = 33863
MOE_COLUMNS = ("kernel", "variant", "weight_dtype", "tokens", "routing", "ms", "ratio_to_floor",
               "tflops", "ratio_to_cublas", "spills")  # fmt: skip
HYBRID_SLACK = 1.05  # the hybrid within 5% of the better of its two kernels


@dataclass(frozen=True)
class Verdict:
    """One target: what is measured, the goal, the figures measured, and whether they meet it
    (None: the run lacks a row the target needs)."""

    measure: str
    target: str
    measured: str
    met: bool | None

    @property
    def status(self) -> str:
        return {True: "met", False: "missed", None: "not measured"}[self.met]


def _all(checks: Iterable[bool | None]) -> bool | None:
    """Met when every check is, None when any is unmeasured and none failed. A check may be a
    numpy bool (a comparison of a table's value), which is never `is False`, so each is made a
    Python bool first."""
    checks = [None if c is None else bool(c) for c in checks]
    if any(c is False for c in checks):
        return False
    return None if not checks or any(c is None for c in checks) else True


def _times(x: float) -> str:
    return f"{x:.2f}x"


# ---- dense --------------------------------------------------------------------------------------
def _timed_row(rows: pd.DataFrame, kernel: str, m: int, variant: str | None = None
               ) -> int | None:  # fmt: skip
    """The position in the bench table of `kernel`'s timed row (of its `variant`, when given)
    at M rows, None when the run did not time it (the verdicts number the rows by position:
    `_positions`)."""
    hit = (rows["kernel"] == kernel) & (rows["m"] == m) & rows["ms"].notna()
    if variant is not None:
        hit &= rows["variant"] == variant
    return int(rows.index[hit][0]) if hit.any() else None


def _peer_ms(rows: pd.DataFrame, kernel: str, m: int, variant: str | None = None) -> float | None:
    """The median ms of `kernel` (of its `variant`, when given) at M rows, None when the run
    did not time it."""
    row = _timed_row(rows, kernel, m, variant)
    return None if row is None else _ms(rows, row)


def _ms(rows: pd.DataFrame, row: int) -> float:
    """The median ms of the row at that position."""
    return float(rows.at[row, "ms"])


def _layer_ms(rows: pd.DataFrame, variant: str, m: int) -> float | None:
    """Our layer's median ms in `variant` at M rows."""
    return _peer_ms(rows, DENSE_LAYER, m, variant)


def _interval(samples: pd.DataFrame | None, baseline: int | None, contender: int | None) -> str:
    """' (95%: 1.26-1.29)': the interval of the contender's speed over the baseline's (its ms
    over the contender's; rows by position), over the rounds the two shared; '' when the run
    kept no samples for them (`analysis.bench_samples`)."""
    if samples is None or baseline is None or contender is None:
        return ""
    paired = rows_ratio(samples, contender, baseline)
    if paired is None or pd.isna(paired["ci_low"]):
        return ""
    return f" (95%: {paired['ci_low']:.2f}-{paired['ci_high']:.2f})"


def _positions(rows: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """The rows numbered by their position in the bench table, which the samples table uses,
    with every column a verdict reads."""
    rows = rows.reset_index(drop=True)
    return rows.reindex(columns=list(dict.fromkeys([*rows.columns, *columns])))


def _speedups(rows: pd.DataFrame, samples: pd.DataFrame | None, variant: str,
              sizes: Iterable[int], floor: float) -> tuple[str, bool | None]:  # fmt: skip
    """'M=1 1.27x (95%: 1.26-1.29), M=4 1.31x' over cuBLAS bf16, and whether each is at least
    `floor` (by the median: the interval says how near the edge it is)."""
    figures, checks = [], []
    for m in sizes:
        ours, bf16 = (_timed_row(rows, DENSE_LAYER, m, v) for v in (variant, "bf16"))
        s = None if ours is None or bf16 is None else _ms(rows, bf16) / _ms(rows, ours)
        figure = "not timed" if s is None else _times(s) + _interval(samples, bf16, ours)
        figures.append(f"M={m:,} {figure}")
        checks.append(None if s is None else s >= floor)
    return ", ".join(figures), _all(checks)


def _w8a16_decode(rows: pd.DataFrame, samples: pd.DataFrame | None) -> Verdict:
    figure, fast = _speedups(rows, samples, "w8a16", DECODE_M, 1.3)
    shares, checks = [], []  # humming's speed as a share of ours
    for m in DECODE_M:
        ours, humming = _layer_ms(rows, "w8a16", m), _peer_ms(rows, "humming", m)
        if ours is None or humming is None:
            checks.append(None)
            continue
        shares.append(ours / humming)
        checks.append(ours <= humming)
    figure += f"; humming at most {_times(max(shares))} our speed" if shares else "; no humming"
    return Verdict(
        "dense W8A16 per layer over cuBLAS bf16, M = 1, 4, 6",
        ">= 1.3x, and faster than humming",
        figure,
        _all([fast, *checks]),
    )


def _w8a16_middle(rows: pd.DataFrame, samples: pd.DataFrame | None) -> Verdict:
    figure, met = _speedups(rows, samples, "w8a16", MIDDLE_M, 1.0)
    return Verdict("dense W8A16 per layer over cuBLAS bf16, M = 16 ... 256", ">= 1.0x", figure,
                   met)  # fmt: skip


def _hybrid(rows: pd.DataFrame) -> Verdict:
    layer = rows[rows["kernel"] == DENSE_LAYER]
    worst: tuple[float, int] | None = None  # (time over the better kernel's, at M)
    checks = []
    for m in sorted(int(m) for m in layer["m"].dropna().unique()):
        hybrid, *others = (_layer_ms(rows, v, m) for v in ("hybrid", "w8a16", "w8a8"))
        if hybrid is None or None in others:
            checks.append(None)
            continue
        over = hybrid / min(others)
        checks.append(over <= HYBRID_SLACK)
        worst = max(worst or (over, m), (over, m))
    figure = ("not timed" if worst is None else
              f"at most {_times(worst[0])} the better one's time (M={worst[1]:,})")  # fmt: skip
    return Verdict("dense hybrid per layer against the better of W8A16 and W8A8, every M",
                   "within 5%", figure, _all(checks))  # fmt: skip


def _w8a8_prefill(rows: pd.DataFrame, samples: pd.DataFrame | None) -> Verdict:
    figure, fast = _speedups(rows, samples, "w8a8", PREFILL_M, 1.6)
    shares, checks = [], []
    for m in PREFILL_M:
        ours = _layer_ms(rows, "w8a8", m)
        peers = {k: t for k in FP8_PEERS if (t := _peer_ms(rows, k, m)) is not None}
        if ours is None or not peers:
            checks.append(None)
            continue
        fastest = min(peers, key=peers.__getitem__)
        share = peers[fastest] / ours
        interval = _interval(samples, _timed_row(rows, fastest, m),
                             _timed_row(rows, DENSE_LAYER, m, "w8a8"))  # fmt: skip
        shares.append(f"M={m:,} {_times(share)}{interval}")
        checks.append(share >= 0.95)
    figure += f"; of the fastest FP8 peer's speed: {', '.join(shares) or 'no peer timed'}"
    return Verdict("dense W8A8 per layer over cuBLAS bf16, M = 4,096 and 16,384",
                   ">= 1.6x, and >= 0.95x the fastest FP8 peer (DeepGEMM, cuBLAS FP8)",
                   figure, _all([fast, *checks]))  # fmt: skip


def dense_verdicts(rows: pd.DataFrame, samples: pd.DataFrame | None = None) -> list[Verdict]:
    """The dense targets from one `bench dense` run's rows (with its peers' rows) and, where
    the run kept them, its rows' samples, which give each speedup its interval."""
    rows = _positions(rows, ("kernel", "variant", "m", "ms"))
    return [_w8a16_decode(rows, samples), _w8a16_middle(rows, samples), _hybrid(rows),
            _w8a8_prefill(rows, samples)]  # fmt: skip


# ---- MoE ----------------------------------------------------------------------------------------
def _moe_row(rows: pd.DataFrame, variant: str, fmt: str, tokens: int) -> pd.Series | None:
    """Our MoE scheduler's row (uniform routing) that was timed, None when there is none."""
    hit = rows[(rows["kernel"] == "moe") & (rows["variant"] == variant)
               & (rows["weight_dtype"] == fmt) & (rows["tokens"] == tokens)
               & (rows["routing"] == "uniform") & rows["ms"].notna()]  # fmt: skip
    return hit.iloc[0] if len(hit) else None


def _moe_peer_ms(rows: pd.DataFrame, kernel: str, tokens: int) -> float | None:
    hit = rows[(rows["kernel"] == kernel) & (rows["tokens"] == tokens)
               & (rows["routing"] == "uniform")]["ms"].dropna()  # fmt: skip
    return float(hit.iloc[0]) if len(hit) else None


def _value(row: pd.Series | None, column: str) -> float | None:
    """A row's measure, None when there is no row or the run did not record that measure."""
    return None if row is None or pd.isna(row[column]) else float(row[column])


def _checked(value: float | None, check: Callable[[float], bool]) -> bool | None:
    return None if value is None else bool(check(value))


def _floor_figure(row: pd.Series | None) -> str:
    """'1.21x its floor (0.166 ms)', or why there is no such figure."""
    if row is None:
        return "not timed"
    floor = _value(row, "ratio_to_floor")
    return (
        f"{'no floor recorded' if floor is None else f'{_times(floor)} its floor'} "
        f"({row['ms']:.3f} ms)"
    )


def _fp8_decode(rows: pd.DataFrame) -> Verdict:
    flat = _moe_row(rows, "flat", "fp8", MOE_DECODE_T)
    peers = {k: _moe_peer_ms(rows, k, MOE_DECODE_T) for k in ("deepgemm", "humming")}
    checks = [_checked(_value(flat, "ratio_to_floor"), lambda r: r <= 1.3)]
    checks += [None if t is None or flat is None else flat["ms"] < t for t in peers.values()]
    figure = (
        _floor_figure(flat)
        + "; "
        + ", ".join(f"{k} {'not timed' if t is None else f'{t:.3f} ms'}" for k, t in peers.items())
    )
    return Verdict(
        f"MoE FP8 (W8A16) flat, T={MOE_DECODE_T} uniform, time over its floor",
        "<= 1.3x, and faster than DeepGEMM and humming",
        figure,
        _all(checks),
    )


def _int4_decode(rows: pd.DataFrame) -> Verdict:
    flat = _moe_row(rows, "flat", "int4", MOE_DECODE_T)
    return Verdict(f"MoE INT4 flat, T={MOE_DECODE_T}, time over its floor", "<= 1.5x",
                   _floor_figure(flat),
                   _checked(_value(flat, "ratio_to_floor"), lambda r: r <= 1.5))  # fmt: skip


def _int4_prefill(rows: pd.DataFrame) -> Verdict:
    int4, bf16 = (_moe_row(rows, "flat", f, MOE_PREFILL_T) for f in ("int4", "bf16"))
    ours, theirs, spills = _value(int4, "tflops"), _value(bf16, "tflops"), _value(int4, "spills")
    share = None if ours is None or not theirs else ours / theirs
    figure = "not timed" if int4 is None else (
        f"{'?' if spills is None else int(spills)} spills, "
        f"{'?' if share is None else _times(share)} bf16 flat's TFLOP/s")  # fmt: skip
    checks = [_checked(spills, lambda s: s == 0), _checked(share, lambda s: s >= 0.5)]
    return Verdict(f"MoE INT4 flat, T={MOE_PREFILL_T:,}", "no spills, >= 0.5x bf16 flat's "
                   "TFLOP/s", figure, _all(checks))  # fmt: skip


def _int4_spills(rows: pd.DataFrame) -> Verdict:
    int4 = rows[(rows["kernel"] == "moe") & (rows["weight_dtype"] == "int4")]
    compiled = int4[int4["spills"].notna()]
    spilling = compiled[compiled["spills"] > 0]
    spilled = zip(spilling["variant"], spilling["tokens"], spilling["spills"], strict=True)
    figure = ", ".join(f"{v} T={int(t):,}: {int(s) * 4} bytes" for v, t, s in spilled)
    figure = figure or "none spill"
    if compiled.empty:
        figure = "no INT4 rows compiled"
    return Verdict("MoE INT4, every scheduler and T: spills", "none", figure,
                   None if compiled.empty else spilling.empty)  # fmt: skip


def _w8a8_prefill_moe(rows: pd.DataFrame, samples: pd.DataFrame | None) -> Verdict:
    w8a8, bf16 = _moe_row(rows, "w8a8", "fp8", MOE_PREFILL_T), _moe_row(rows, "flat", "bf16",
                                                                         MOE_PREFILL_T)  # fmt: skip
    deepgemm = _moe_peer_ms(rows, "deepgemm", MOE_PREFILL_T)
    over_bf16 = None if w8a8 is None or bf16 is None else bf16["ms"] / w8a8["ms"]
    over_dg = None if w8a8 is None or deepgemm is None else deepgemm / w8a8["ms"]
    paired = "" if w8a8 is None or bf16 is None else _interval(samples, bf16.name, w8a8.name)
    figure = (f"{'?' if over_bf16 is None else _times(over_bf16)}{paired} our bf16 flat's speed, "
              f"{'?' if over_dg is None else _times(over_dg)} DeepGEMM's")  # fmt: skip
    checks = [None if over_bf16 is None else over_bf16 >= 1.5,
              None if over_dg is None else over_dg >= 0.9]  # fmt: skip
    return Verdict(f"MoE W8A8 prefill, T={MOE_PREFILL_T:,}", ">= 1.5x our bf16 flat, >= 0.9x "
                   "DeepGEMM contiguous", figure, _all(checks))  # fmt: skip


def _bf16_prefill(rows: pd.DataFrame) -> Verdict:
    flat = _moe_row(rows, "flat", "bf16", MOE_PREFILL_T)
    bare = _moe_peer_ms(rows, "torch_grouped_mm_bare", MOE_PREFILL_T)
    share = _value(flat, "ratio_to_cublas")
    bare_ms = "(not timed)" if bare is None else f"{bare:.2f} ms"
    figure = "not timed" if flat is None else (
        f"{'?' if share is None else f'{share:.1%}'} of cuBLAS bf16's rate; {flat['ms']:.2f} ms "
        f"against the bare grouped GEMMs' {bare_ms}")  # fmt: skip
    checks = [_checked(share, lambda r: r >= 0.65),
              None if flat is None or bare is None else flat["ms"] < bare]  # fmt: skip
    return Verdict(
        f"MoE bf16 flat prefill, T={MOE_PREFILL_T:,}",
        ">= 65% of cuBLAS bf16's rate, and faster than the bare torch._grouped_mm pair",
        figure,
        _all(checks),
    )


def moe_verdicts(rows: pd.DataFrame, samples: pd.DataFrame | None = None) -> list[Verdict]:
    """The MoE targets from one `bench moe` run's rows (with its peers' rows) and, where the
    run kept them, its rows' samples (an interval for the W8A8 speedup); measures an older
    run did not record count as not measured."""
    rows = _positions(rows, MOE_COLUMNS)
    return [_fp8_decode(rows), _int4_decode(rows), _int4_prefill(rows), _int4_spills(rows),
            _w8a8_prefill_moe(rows, samples), _bf16_prefill(rows)]  # fmt: skip


# ---- the seed's A/B -----------------------------------------------------------------------------
def hybrid_ab_verdict(table: pd.DataFrame) -> Verdict:
    """The seed's A/B from a profile A/B's table (a: W8A16, b: the hybrid): the hybrid's
    prefill tokens per second over W8A16's, significant when the interval excludes 1."""
    seed_ab = partial(Verdict, "seed A/B: hybrid prefill tokens/s over W8A16",
                      "> 1.0x, significant")  # fmt: skip
    prefill = table[table["phase"] == "prefill"]
    if prefill.empty:
        return seed_ab("no prefill row", None)
    row = prefill.iloc[0]
    if pd.isna(row["ci_low"]) or pd.isna(row["ci_high"]):
        return seed_ab(f"{_times(1 / row['ratio'])}, no interval", None)
    speed, low, high = 1 / row["ratio"], 1 / row["ci_high"], 1 / row["ci_low"]
    return seed_ab(f"{_times(speed)} at {int(row['tokens']):,} tokens (95% interval {low:.2f} - "
                   f"{high:.2f})", bool(low > 1.0))  # fmt: skip


def verdict_table(verdicts: Iterable[tuple[Verdict, str]]) -> pd.DataFrame:
    """(verdict, the run it came from) pairs as the report's table."""
    columns = ("measure", "target", "measured", "status", "from")
    return pd.DataFrame(
        [(v.measure, v.target, v.measured, v.status, source) for v, source in verdicts],
        columns=list(columns),
    )
