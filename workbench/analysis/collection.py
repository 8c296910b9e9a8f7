"""Every artifact under some paths, loaded by kind: what a report or a notebook reads.

`raw/` holds run directories of several kinds (profiles, sweeps, A/B runs, benchmarks) beside
capture logs, and `ncu/` holds reports beside their `.json` and `.summary.txt`, so a report
cannot take "all of raw/" on trust: each run directory says its kind in `run.json`, and each
is read by the loader of that kind. A directory that does not load is listed with the reason,
never dropped in silence; files that are not artifacts (logs, sidecars) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from workbench.analysis.experiments import load_ab, load_sweep
from workbench.analysis.git_state import REPO, matching_commit
from workbench.analysis.ncu_files import SUFFIXES, shadowed
from workbench.analysis.profile import device_name, load
from workbench.artifacts import RUN_FILE, read_meta, read_table
from workbench.errors import ArtifactError

NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Artifact:
    """One artifact: where it is, its kind, its metadata and its loaded result: a ProfileResult,
    SweepResult, AbResult or NcuReport, or a benchmark's tables by name."""

    path: Path
    kind: str
    meta: dict
    result: Any


@dataclass
class Collection:
    """Artifacts in path order, and the directories that could not be read (with why)."""

    items: list[Artifact] = field(default_factory=list)
    unread: list[tuple[Path, str]] = field(default_factory=list)

    def of(self, kind: str) -> list[Any]:
        """The results of one kind ("profile", "ncu", "sweep", "ab", "bench-moe", ...)."""
        return [item.result for item in self.items if item.kind == kind]

    def kinds(self) -> dict[str, int]:
        """How many artifacts of each kind."""
        counts: dict[str, int] = {}
        for item in self.items:
            counts[item.kind] = counts.get(item.kind, 0) + 1
        return counts

    def ncu_catalog(self):
        """The ncu reports as one NcuCatalog, or None without reports."""
        from workbench.analysis.ncu_catalog import NcuCatalog

        reports = self.of("ncu")
        return NcuCatalog(reports) if reports else None


def _load_run(path: Path) -> Artifact:
    meta = read_meta(path)
    kind = str(meta.get("kind"))
    if kind == "profile":
        return Artifact(path, kind, meta, load(path))
    if kind == "sweep":
        return Artifact(path, kind, meta, load_sweep(path))
    if kind == "ab":
        return Artifact(path, kind, meta, load_ab(path))
    if kind.startswith("bench-"):
        tables = {name: read_table(path, meta, name) for name in meta.get("tables", {})}
        return Artifact(path, kind, meta, tables)
    raise ArtifactError(f"a '{kind}' run, which no report section reads")


def _visit(found: Collection, path: Path, depth: int) -> None:
    if path.name.startswith("."):  # a capture in progress, or tool state
        return
    if path.is_file():
        if path.name.endswith(SUFFIXES):
            if shadowed(path):
                return
            from workbench.analysis.ncu import load_ncu

            try:
                report = load_ncu(path)
            except ArtifactError as err:
                found.unread.append((path, str(err)))
            else:
                found.items.append(Artifact(path, "ncu", report.meta, report))
        return
    if (path / RUN_FILE).is_file():
        try:
            found.items.append(_load_run(path))
        except ArtifactError as err:
            found.unread.append((path, str(err)))
        return
    if path.is_dir() and depth > 0:
        for child in sorted(path.iterdir()):
            _visit(found, child, depth - 1)


def collect(paths: Iterable[str | Path]) -> Collection:
    """Load every artifact at `paths`: run directories, `.ncu-rep` files, or folders holding
    them (e.g. `raw` and `ncu`, searched two levels deep)."""
    found = Collection()
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ArtifactError(f"{path} does not exist; give run directories, .ncu-rep files "
                                "or folders holding them (default: raw and ncu).")  # fmt: skip
        _visit(found, path, depth=2)
    return found


def measured_on_cpu(item: Artifact) -> bool:
    """Whether an artifact's times were taken on a CPU: a profile of the torch references, or
    a sweep, A/B or benchmark whose environment found no GPU. Their times are CPU times, so a
    report keeps them out of its GPU tables; an artifact that records neither (hand-written,
    or from before runs recorded their environment) counts as GPU."""
    if item.kind == "ncu":
        return False
    if item.kind == "profile":
        return device_name(item.meta) == "CPU"
    if (item.meta.get("params") or {}).get("device") == "cpu":
        return True
    gpu = (item.meta.get("environment") or {}).get("gpu")
    return bool(gpu) and not gpu.get("name")


def split_cpu(collection: Collection) -> tuple[Collection, Collection]:
    """The artifacts measured on a GPU (with what could not be read), and those measured on a
    CPU (`measured_on_cpu`), each in the collection's order."""
    gpu, cpu = Collection(unread=list(collection.unread)), Collection()
    for item in collection.items:
        (cpu if measured_on_cpu(item) else gpu).items.append(item)
    return gpu, cpu


@cache
def code_commit(source_trees: tuple[tuple[str, str], ...]) -> str | None:
    """The commit of this repository whose source folders are `source_trees`, which a run
    recorded as dirty (`workbench.analysis.git_state`); None if none is, or none recorded."""
    return matching_commit(dict(source_trees), REPO) if source_trees else None


def environment_row(meta: dict) -> dict:
    """GPU, driver, CUDA, torch, Triton, date and commit of an artifact's metadata, with
    NOT_RECORDED where the artifact does not say (sweeps and A/B runs record no environment).
    A run recorded as dirty names the commit its source folders match, where one does: the
    GPU machine's copy of the tree carries a stale .git."""
    env = meta.get("environment") or {}
    gpu, git = env.get("gpu") or {}, env.get("git") or {}
    commit = str(git.get("commit") or "")[:10]
    if commit and git.get("dirty"):
        matched = code_commit(tuple(sorted((git.get("source_trees") or {}).items())))
        commit = f"{matched[:10]} (by its source)" if matched else f"{commit} (dirty)"
    values = {
        "GPU": gpu.get("name") or (gpu.get("note") if gpu else None),
        "driver": gpu.get("driver_version"),
        "CUDA": env.get("cuda"),
        "torch": env.get("torch"),
        "Triton": env.get("triton"),
        "date": env.get("date") or meta.get("started"),
        "commit": commit or None,
    }
    return {key: value or NOT_RECORDED for key, value in values.items()}
