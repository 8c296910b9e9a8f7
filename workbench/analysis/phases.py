"""Where a profile's own wall time went (run.json's `phases` and `compiles`), as a line the CLI
prints and a table the HTML page shows. Pure: no torch, no Triton."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

# Where a profile's wall time goes, in order (run.json's `phases`, seconds; a phase that did not
# run is absent): importing torch and the capture modules (when profile() did), building the
# weights, drawing the inputs and the decode state, on a GPU compiling the Triton kernels the
# warm-up will need in parallel processes (`capture.precompile`), the warm-up run (Triton
# loads or compiles its kernels here), capturing the decode step's CUDA graph and learning its
# kernel signature, the profiled region, stopping the profiler and exporting the trace, parsing
# and attributing it, making the stored tables, and writing the run directory. run.json's
# `compiles` says how much of it was Triton compiling (`capture.compile_log`).
TIMED_PHASES = ("import", "build", "inputs", "precompile", "warm-up", "graphs", "profiled",
                "export", "parse", "tables", "write")  # fmt: skip


def phases_line(meta: Mapping) -> str | None:
    """`phases: build 12.3 s, warm-up 8.1 s, ... (wall 52.0 s); compiled 87 Triton kernels in
    24.1 s` from run.json; None for a run written before its phases were timed."""
    phases = meta.get("phases")
    if not phases:
        return None
    order = [p for p in TIMED_PHASES if p in phases] + sorted(set(phases) - set(TIMED_PHASES))
    spent = ", ".join(f"{name} {phases[name]:.1f} s" for name in order)
    wall = meta.get("wall_s")
    line = f"phases: {spent}" + (f" (wall {wall:.1f} s)" if wall is not None else "")
    compiles = meta.get("compiles")
    if compiles and (compiles["compiled"] or compiles["loaded"]):
        line += f"; {compiles_line(compiles)}"
    return line


def bytecode_hint(meta: Mapping, command: str | None = None) -> str | None:
    """What to do when the run's Python compiled torch's modules from source (run.json's
    `environment.bytecode`, `capture.environment`): nothing caches them, so every profile pays
    it again in its import and graph phases. `command`: the compile to suggest, when the caller
    knows the interpreter and the folder that holds torch (the CLI, in the process that ran);
    a page read elsewhere names them in words. None when they were cached or could be."""
    bytecode = meta.get("environment", {}).get("bytecode")
    if not bytecode or bytecode["torch_cached"] or bytecode["written"]:
        return None
    how = f"`{command}`" if command else (
        "`python -m compileall -q -j 0` with the Python that ran the profile, on the folder "
        "that holds torch"
    )  # fmt: skip
    return (
        "torch's Python modules have no bytecode cache and this Python may not write one "
        "(PYTHONDONTWRITEBYTECODE or -B), so every process compiles them from source (seconds "
        f"of the import and graphs phases): run {how} once."
    )


def phases_table(meta: Mapping) -> pd.DataFrame | None:
    """Where the profile's own wall time went: seconds and share of the wall time per phase,
    in order; None for a run written before its phases were timed."""
    phases = meta.get("phases")
    if not phases:
        return None
    order = [p for p in TIMED_PHASES if p in phases] + sorted(set(phases) - set(TIMED_PHASES))
    seconds = pd.Series({name: float(phases[name]) for name in order}, name="seconds")
    wall = meta.get("wall_s") or float(seconds.sum())
    table = pd.DataFrame({"seconds": seconds, "share_pct": 100 * seconds / wall})
    table.index.name = "phase"
    return table


def compiles_line(summary: dict) -> str:
    """run.json's `compiles` in words: `compiled 37 Triton kernels in 12 processes in 4.2 s;
    compiled 0 Triton kernels in 0.0 s, loaded 37 from the cache in 0.4 s`."""
    line = ""
    ahead = summary.get("precompile")
    if ahead and "error" in ahead:
        line = f"the parallel compile failed ({ahead['error']}); "
    elif ahead and (ahead["compiled"] or ahead.get("failed")):
        line = (f"compiled {ahead['compiled']} Triton kernels in {ahead['workers']} processes in "
                f"{ahead['s']:.1f} s; ")  # fmt: skip
        if ahead.get("failed"):  # the warm-up compiled these; run.json says why they failed
            line = line[:-2] + f" ({', '.join(ahead['failed'])} failed there); "
    line += f"compiled {summary['compiled']} Triton kernels in {summary['compile_s']:.1f} s"
    if summary["loaded"]:
        line += f", loaded {summary['loaded']} from the cache in {summary['load_s']:.1f} s"
    return line
