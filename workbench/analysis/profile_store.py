"""What a profile run stores beside its kernel table, so that reading it re-derives nothing.

A run's kernel table holds ~10^6 rows and takes seconds to parse; `show` and `report` need
only the tables by category, the decode caption, the phases, the ranks and the rank skew.
Those are computed once, at capture, by the very methods that answer them
(`ProfileResult.prefill()`, `.decode()`, ...) and stored: the small tables as CSV, the facts
in run.json's `summary`, which names the table holding each method's answer. A loaded run
answers from them without reading its kernels.

One process: `prefill.csv` and `decode.csv` (`profile_tables`) are those answers already.
Tensor parallelism: they are computed over the merged ranks, while `prefill()` and `decode()`
return the mean over the ranks (one GPU's view), so the means are stored beside them as
`prefill_mean.csv` and `decode_mean.csv`. Runs written before the summary existed compute from
their kernels, or get it added by `backfill` (`python -m workbench.analysis.profile_store
raw/profile-*`), which computes it the same way from the kernel table on disk.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from workbench.analysis.profile import SUMMARY, ProfileResult, stored_frame
from workbench.analysis.trace import with_schema
from workbench.artifacts import RUN_FILE, read_meta, read_table, write_json_atomic

ANSWERS = ("prefill", "decode")  # methods answered by a stored table (over all ranks)


def stored_answers(
    kernels: pd.DataFrame, existing: Callable[[str], pd.DataFrame | None]
) -> tuple[dict[str, pd.DataFrame], dict]:
    """The tables to write and run.json's summary, computed from `kernels` by the methods a
    loaded run will skip. `existing(name)` is a table the run holds already, as a loaded run
    reads it, or None: one that is exactly a method's answer is named, not written again, and
    one that is not (written by an older workbench) is left to be computed when asked."""
    run = ProfileResult(meta={}, kernels=kernels)
    summary: dict = {"phases": run.phases, "ranks": run.ranks, "tables": {}}
    new: dict[str, pd.DataFrame] = {}
    for answer in ANSWERS:
        if answer not in summary["phases"]:
            continue
        table = getattr(run, answer)()
        if answer == "decode":
            summary["decode_steps"] = int(table.attrs["steps"])
        # One process: `profile_tables` wrote this very table under the answer's name.
        name = f"{answer}_mean" if run.ranks else answer
        held = existing(name)
        if held is None:
            new[name] = table
        elif not held.equals(table):
            continue
        summary["tables"][answer] = name
    if run.ranks and existing("rank_skew") is not None:  # skew_table(kernels) at capture
        summary["tables"]["rank_skew"] = "rank_skew"
    summary["caption"] = run.caption_facts()
    return new, summary


def backfill(path: str | Path) -> list[str]:
    """Add the stored answers to a run written before them: computed from its kernel table, the
    tables written beside it and the summary into its run.json. Returns the files written (none
    when the run has its summary already)."""
    path = Path(path)
    meta = read_meta(path)
    if SUMMARY in meta or meta.get("kind") != "profile":
        return []

    def existing(name: str) -> pd.DataFrame | None:
        if name not in meta.get("tables", {}):
            return None
        return stored_frame(read_table(path, meta, name), name.removesuffix("_mean"))

    new, summary = stored_answers(with_schema(read_table(path, meta, "kernels")), existing)
    files = []
    for name, table in new.items():
        file = f"{name}.csv"  # small: plain CSV, as `artifacts.write_run` writes small tables
        fd, tmp = tempfile.mkstemp(prefix=f".{file}.", dir=path)
        os.close(fd)
        table.to_csv(tmp, index=table.index.name is not None)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path / file)
        meta["tables"][name] = file
        files.append(file)
    # Provenance: these answers were derived later from the run's own kernel table.
    meta[SUMMARY] = summary | {"derived": "added after the capture by profile_store.backfill, "
                               "computed from this run's own kernel table"}  # fmt: skip
    write_json_atomic(path / RUN_FILE, meta)
    return [*files, RUN_FILE]


if __name__ == "__main__":
    for run_dir in sys.argv[1:]:
        print(run_dir, ", ".join(backfill(run_dir)) or "(has its summary)")
