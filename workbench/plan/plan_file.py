"""The plan file: its format, the checked dataclasses it becomes, and loading with clear errors.

A plan runs on a GPU box whose time is lent and short, so every mistake a plan file can hold
(an unknown or misspelt key, a missing `run`, a timeout that is not a positive number, a
duplicate step name, a glob outside the repository, TOML that does not parse) is reported
here, with its fix, before the first step starts. The format is documented in docs/plans.md;
the tables of allowed keys below also write the "allowed keys" part of the error messages.
"""

from __future__ import annotations

import difflib
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError

OUT_TOKEN = "{out}"  # replaced by the output folder in run, env and archive globs
PACKS = ("xz",)

PLAN_KEYS = {
    "name": "the plan's name (a string)",
    "description": "what the plan captures and why (a string)",
    "budget_s": "seconds the whole plan may take",
    "step": "the steps, each a [[step]] table",
}
STEP_KEYS = {
    "name": "the step's name",
    "run": "a shell command string, or an argv list",
    "timeout_s": "seconds the step may take",
    "env": "extra environment variables (a table of strings)",
    "continue_on_failure": "true to go on with the plan when this step fails",
    "archive": "globs of what the step produces, copied (or packed) into the output folder",
}
ARCHIVE_KEYS = {"glob": "a glob", "pack": 'how to pack each match: "xz"'}


@dataclass(frozen=True)
class ArchiveRule:
    """Matches of `glob` (relative to the repository root, or under `{out}`) that a step
    created or changed go to the output folder, as they are or packed."""

    glob: str
    pack: str | None = None


@dataclass(frozen=True)
class Step:
    """One [[step]] of a plan, checked: a command with its own time limit, so one hung
    capture cannot take the time of the steps after it."""

    name: str
    run: str | tuple[str, ...]  # a string runs under /bin/sh; a tuple is an argv
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    continue_on_failure: bool = False
    archive: tuple[ArchiveRule, ...] = ()


@dataclass(frozen=True)
class Plan:
    """A checked plan file: every field valid before the first step starts."""

    path: Path
    name: str
    description: str
    budget_s: float
    steps: tuple[Step, ...]


def _fail(path: Path, where: str, problem: str) -> WorkbenchError:
    return WorkbenchError(f"{path}: {where}{problem} (see docs/plans.md)")


def _check_keys(path: Path, where: str, table: dict[str, Any], allowed: dict[str, str]) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise _fail(
                path,
                where,
                f"unknown key '{key}'; {hint}allowed keys: "
                + ", ".join(f"{k} ({v})" for k, v in allowed.items()),
            )


def _seconds(path: Path, where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(
            path, where, f"{key} = {value!r} is not a number of seconds; write e.g. {key} = 300"
        )
    if value <= 0:
        raise _fail(path, where, f"{key} = {value!r} must be positive; write e.g. {key} = 300")
    return float(value)


def _text(path: Path, where: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, where, f'{key} must be a non-empty string, e.g. {key} = "..."')
    return value


def _archive_rule(path: Path, where: str, item: Any) -> ArchiveRule:
    if isinstance(item, dict):
        _check_keys(path, where + "archive: ", item, ARCHIVE_KEYS)
        if "glob" not in item:
            raise _fail(
                path,
                where,
                'an archive table needs a glob, e.g. { glob = "ncu/*.ncu-rep", pack = "xz" }',
            )
        pattern, pack = item["glob"], item.get("pack")
    else:
        pattern, pack = item, None
    pattern = _text(path, where + "archive: ", "glob", pattern)
    if pack is not None and pack not in PACKS:
        raise _fail(
            path,
            where,
            f'archive pack = {pack!r} is not known; use pack = "xz" '
            "or leave pack out to copy as is",
        )
    parts = Path(pattern).parts
    if not pattern.startswith(OUT_TOKEN) and (Path(pattern).is_absolute() or ".." in parts):
        raise _fail(
            path,
            where,
            f"archive glob {pattern!r} must be relative to the repository "
            f'root (e.g. "raw/bench-*") or start with {OUT_TOKEN}',
        )
    return ArchiveRule(pattern, pack)


def _step(path: Path, index: int, table: Any, seen: set[str]) -> Step:
    where = f"step {index}: "
    if not isinstance(table, dict):
        raise _fail(path, where, "is not a table; write each step as a [[step]] table")
    if isinstance(table.get("name"), str):
        where = f"step {index} ('{table['name']}'): "
    _check_keys(path, where, table, STEP_KEYS)
    for key in ("name", "run", "timeout_s"):
        if key not in table:
            raise _fail(path, where, f"missing '{key}' ({STEP_KEYS[key]})")
    name = _text(path, where, "name", table["name"])
    if name in seen:
        raise _fail(path, where, f"a second step named '{name}'; give each step its own name")
    seen.add(name)
    run = table["run"]
    if isinstance(run, list):
        if not run or not all(isinstance(a, str) and a for a in run):
            raise _fail(
                path,
                where,
                "run as a list must be non-empty strings, e.g. "
                'run = ["python3", "-m", "workbench.cli", "bench", "dense"]',
            )
        run = tuple(run)
    else:
        run = _text(path, where, "run", run).strip()
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise _fail(
            path,
            where,
            "env must be a table of strings, e.g. "
            'env = { WORKBENCH_GPU_TESTS = "1" } (quote numbers)',
        )
    cont = table.get("continue_on_failure", False)
    if not isinstance(cont, bool):
        raise _fail(path, where, "continue_on_failure must be true or false")
    archive = table.get("archive", [])
    if not isinstance(archive, list):
        raise _fail(path, where, 'archive must be a list, e.g. archive = ["raw/bench-*"]')
    return Step(
        name=name,
        run=run,
        timeout_s=_seconds(path, where, "timeout_s", table["timeout_s"]),
        env=dict(env),
        continue_on_failure=cont,
        archive=tuple(_archive_rule(path, where, item) for item in archive),
    )


def load_plan(path: str | Path) -> Plan:
    """Read and check a plan; a WorkbenchError names the first problem and its fix."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise WorkbenchError(
            f"cannot read plan {path}: {err.strerror or err}; give the path of "
            "a plan file such as plans/bench-all.toml"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise WorkbenchError(
            f"{path} is not valid TOML: {err}; fix the syntax (see docs/plans.md)"
        ) from None
    _check_keys(path, "", data, PLAN_KEYS)
    for key in ("name", "budget_s", "step"):
        if key not in data:
            raise _fail(path, "", f"missing top-level '{key}' ({PLAN_KEYS[key]})")
    steps = data["step"]
    if not isinstance(steps, list) or not steps:
        raise _fail(path, "", "'step' must be one or more [[step]] tables (double brackets)")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "", "description must be a string")
    seen: set[str] = set()
    return Plan(
        path=path,
        name=_text(path, "", "name", data["name"]),
        description=description,
        budget_s=_seconds(path, "", "budget_s", data["budget_s"]),
        steps=tuple(_step(path, i, table, seen) for i, table in enumerate(steps, 1)),
    )
