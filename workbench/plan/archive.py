"""Archiving what a step produced: copied, or xz-packed, into the output folder.

Captures write where the tools put them (`raw/bench-*`, `ncu/*.ncu-rep`), in a copy of the
tree on a GPU box that is gone after the run; only the output folder comes back. So after
each step, whatever its archive globs match that the step created or changed (mtime before
and after, so earlier runs' files stay out) goes into the output folder at the same relative
path, packed with xz where asked (ncu reports shrink many times over).
"""

from __future__ import annotations

import contextlib
import glob
import lzma
import os
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from workbench.plan.plan_file import OUT_TOKEN, ArchiveRule, Step
from workbench.plan.records import RunContext, StepResult


def _glob_path(rule: ArchiveRule, root: Path, out_dir: Path) -> str:
    if rule.glob.startswith(OUT_TOKEN):
        return glob.escape(str(out_dir)) + rule.glob[len(OUT_TOKEN) :]
    return os.path.join(glob.escape(str(root)), rule.glob)


def snapshot(rules: Sequence[ArchiveRule], root: Path, out_dir: Path) -> dict[str, int]:
    """mtime of everything the rules match now, to tell what a step creates or changes."""
    seen: dict[str, int] = {}
    for rule in rules:
        for match in glob.glob(_glob_path(rule, root, out_dir), recursive=True):
            with contextlib.suppress(OSError):
                seen[match] = os.stat(match).st_mtime_ns
    return seen


def _pack_xz(source: Path, target: Path) -> Path:
    """`source` as target.xz (a file) or target.tar.xz (a folder), at xz -9 whose long window
    folds together the repeated cubins of ncu reports."""
    packed = target.with_name(target.name + (".tar.xz" if source.is_dir() else ".xz"))
    tmp = packed.with_name("." + packed.name + ".tmp")
    if source.is_dir():
        with tarfile.open(tmp, "w:xz", preset=9) as tar:
            tar.add(source, arcname=source.name)
    else:
        with source.open("rb") as src, lzma.open(tmp, "wb", preset=9) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(tmp, packed)
    return packed


def _archive_one(match: Path, rule: ArchiveRule, root: Path, out_dir: Path) -> Path:
    inside_out = match.is_relative_to(out_dir)
    if inside_out:
        target = match
    elif match.is_relative_to(root):
        target = out_dir / match.relative_to(root)
    else:
        target = out_dir / match.name
    target.parent.mkdir(parents=True, exist_ok=True)
    if rule.pack == "xz":
        packed = _pack_xz(match, target)
        if inside_out:  # only the packed copy is wanted in the output folder
            shutil.rmtree(match) if match.is_dir() else match.unlink()
        return packed
    if not inside_out:
        if match.is_dir():
            shutil.copytree(match, target, dirs_exist_ok=True)
        else:
            shutil.copy2(match, target)
    return target


def archive(step: Step, result: StepResult, before: dict[str, int], ctx: RunContext) -> None:
    """Store what `step` created or changed since `before` (its `snapshot`), logging each
    file and noting on `result` what was stored; a file that cannot be stored is logged and
    noted, and the rest still go."""
    for rule in step.archive:
        found = []
        for name in sorted(glob.glob(_glob_path(rule, ctx.root, ctx.out_dir), recursive=True)):
            try:
                changed = before.get(name) != os.stat(name).st_mtime_ns
            except OSError:
                continue
            if changed:
                found.append(Path(name).resolve())
        for match in found:
            try:
                stored = _archive_one(match, rule, ctx.root, ctx.out_dir)
            except OSError as err:
                ctx.write(f"== archive {match}: failed: {err}\n")
                result.note = (result.note + "; " if result.note else "") + "archive failed"
                continue
            result.archived.append(str(stored.relative_to(ctx.out_dir)))
            ctx.write(f"== archived {match} -> {stored}\n")
        if not found:
            ctx.write(f"== archive {rule.glob}: nothing new\n")
