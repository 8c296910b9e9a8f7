"""Which `kernels` package an A/B arm runs: the files as they are, a git commit's, or a folder's.

A kernel engineer's A/B is often of code, not of a setting: the kernel as edited against the
kernel as committed. `ab(..., a={"code": "HEAD"}, b={"code": "worktree"})` runs each arm's
workers on its own copy of the package: a commit's `kernels/` is exported by `git archive`
into a scratch folder, and the arm's worker puts that folder first on its import path before
anything imports `kernels`, so the rest (the workbench, the timer, the workload builders) is
the same code in both arms. A machine whose checkout has no git history for the commit (a GPU
machine gets a copy of the working tree) takes a folder instead: `code=DIR`, where
`DIR/kernels` is the package (`git archive REF kernels | tar -x -C DIR`, made where the history
is, and carried along), copied into the scratch folder as the A/B starts. The arm's
provenance goes into the run's metadata: the commit, or the folder's name and the digest of
its files, never a machine path.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from workbench.analysis.git_state import REPO, git_output
from workbench.capture.debris import TEMP_PREFIX, owned_prefix
from workbench.errors import WorkbenchError

WORKTREE = "worktree"  # `code=worktree`: the kernels package as it is on disk
PACKAGE = "kernels"
CODE_DIR_ENV = "WORKBENCH_CODE_VERSIONS"  # where an A/B run's workers find the arms' packages
KERNELS_FROM_ENV = "WORKBENCH_KERNELS_FROM"  # the folder a process must import `kernels` from
CACHE = "__pycache__"  # compiled bytecode: not part of a package's code


@dataclass(frozen=True)
class CodeVersion:
    """One arm's kernels: `commit` (a full sha) or `folder` (holding kernels/, with `digest`
    of its files), or neither (the working tree)."""

    commit: str | None = None
    folder: Path | None = None
    digest: str | None = None

    @property
    def key(self) -> str | None:
        """Its package's name in an A/B run's scratch folder (`export_kernels`); None for the
        working tree. A folder's holds its files' digest: two folders of one name differ."""
        if self.folder is not None:
            name = re.sub(r"[^\w.-]", "_", self.folder.name)  # a path separator in PYTHONPATH
            return f"folder-{name}-{self.digest[:12]}"
        return None if self.commit is None else self.commit[:12]

    def record(self) -> dict:
        """What the run's metadata says of this arm's code (no machine path)."""
        if self.commit:
            return {"code": "commit", "commit": self.commit}
        if self.folder is not None:
            return {"code": "folder", "folder": self.folder.name, "digest": self.digest}
        return {"code": WORKTREE}


def package_digest(folder: Path) -> str:
    """sha256 over the package's files (their paths and bytes; compiled caches left out),
    which names what a folder arm ran: a folder's name says nothing of what it held then."""
    digest = hashlib.sha256()
    files = [p for p in (folder / PACKAGE).rglob("*") if p.is_file() and CACHE not in p.parts]
    for path in sorted(files):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def code_version(value: object, root: Path = REPO) -> CodeVersion:
    """The arm's `code=` value read: `worktree`, a folder holding a kernels package, or a git
    revision of the checkout at `root` (a sha, HEAD~1, a branch)."""
    text = str(value).strip()
    if text == WORKTREE:
        return CodeVersion()
    if not text:
        raise WorkbenchError(f"code= is empty; give a git revision (HEAD, a sha), a folder "
                             f"holding a {PACKAGE} package or {WORKTREE!r}.")  # fmt: skip
    folder = Path(text)
    if (folder / PACKAGE / "__init__.py").is_file():
        return CodeVersion(folder=folder.resolve(), digest=package_digest(folder))
    if folder.is_dir():
        raise WorkbenchError(f"code={text!r}: that folder has no {PACKAGE}/__init__.py; give a "
                             f"folder holding a {PACKAGE} package, a git revision or "
                             f"{WORKTREE!r}.")  # fmt: skip
    commit = git_output(root, "rev-parse", "--verify", "--quiet", f"{text}^{{commit}}")
    if not commit:
        raise WorkbenchError(
            f"code={text!r} is neither {WORKTREE!r}, a folder holding a {PACKAGE} package, nor "
            "a git revision of this checkout. Where the checkout has no history for it (a GPU "
            f"machine's copy), export it where the history is (git archive {text} {PACKAGE} | "
            "tar -x -C DIR) and pass code=DIR."
        )
    return CodeVersion(commit=commit)


def export_kernels(version: CodeVersion, scratch: Path, root: Path = REPO) -> str | None:
    """Lay out `version`'s kernels package under `scratch` and return its name there (the
    arm's `code_key`), or None for the working tree: a commit's package exported by git, a
    folder's copied. Workers find `scratch` by CODE_DIR_ENV (`use_kernels_from`), so no machine
    path goes into a row."""
    key = version.key
    if key is None:
        return None
    into = scratch / key  # a key already laid out holds the same files (`key`)
    if into.exists():
        return key
    if version.folder is not None:  # a copy: the folder may change while the arm runs
        shutil.copytree(version.folder / PACKAGE, into / PACKAGE, symlinks=False,
                        ignore=shutil.ignore_patterns(CACHE))  # fmt: skip
        if package_digest(into) != version.digest:
            raise WorkbenchError(f"code=: the folder {version.folder.name} changed while the "
                                 "A/B started; run it again.")  # fmt: skip
        return key
    archive = subprocess.run(["git", "archive", "--format=tar", version.commit, PACKAGE],
                             cwd=root, capture_output=True)  # fmt: skip
    if archive.returncode:
        raise WorkbenchError(f"commit {key} has no {PACKAGE} folder to export: "
                             f"{archive.stderr.decode().strip()[:200]}")  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return key


def use_kernels_from(key: str | None) -> None:
    """In an arm's worker, before anything imports `kernels`: take it from the arm's folder
    (`export_kernels`; None: the working tree's), here and in the processes this one starts,
    under `package_environment`: PYTHONPATH names the folder, PYTHONSAFEPATH keeps `python -m`
    (a profile's precompile workers) from putting the working directory, the repository's
    root, ahead of it, and TRITON_CACHE_DIR gives its kernels a cache of their own."""
    if key is None:
        return
    scratch = os.environ.get(CODE_DIR_ENV)
    if not scratch:
        raise WorkbenchError(f"{CODE_DIR_ENV} is not set: the arm's kernels cannot be found "
                             "(the A/B run sets it for its workers).")  # fmt: skip
    folder = str(Path(scratch) / key)
    if _imported_elsewhere(folder) is not None:
        raise WorkbenchError(
            f"the {PACKAGE} package was imported before the arm's code was set, so this worker "
            f"would time the working tree's {PACKAGE}, not {key}'s. A spawned worker re-runs "
            f"the imports of the main script: put the script's imports of {PACKAGE} (and of "
            "modules that import it) under `if __name__ == '__main__':`, or run the A/B by "
            "`workbench ab` or from a notebook."
        )
    sys.path.insert(0, folder)
    os.environ.update(package_environment(Path(folder)))


def package_environment(folder: Path) -> dict[str, str]:
    """The variables under which a Python process, and the `python -m` processes it starts,
    import `kernels` from `folder` (holding the package): PYTHONPATH names the folder, then
    the workbench itself, where it is not installed; PYTHONSAFEPATH keeps `python -m` from
    putting the working directory, the repository's root, ahead of them.

    TRITON_CACHE_DIR is a folder beside `folder`, gone with it. Triton keys its cache by a
    kernel's source, not its path, and a compiled kernel's line table names the file it was
    compiled from: with one cache, a kernel the working tree shares with an exported copy was
    found in the cache under the copy's path, in a folder since removed, so Nsight Compute
    could not import its source (the 2026-12-05 captures of flat INT4 MoE, both codes). This
    keeps such entries out of the default cache from now on; one written there before stays
    until that cache is cleared (~/.triton/cache). The exported code compiles cold once per
    A/B (its workers share the folder) and once per capture."""
    path = [str(folder), str(REPO), os.environ.get("PYTHONPATH")]
    cache = folder.parent / f"{folder.name}.triton-cache"
    return {"PYTHONPATH": os.pathsep.join(filter(None, path)), "PYTHONSAFEPATH": "1",
            KERNELS_FROM_ENV: str(folder), "TRITON_CACHE_DIR": str(cache)}  # fmt: skip


def check_kernels_from() -> None:
    """Refuse, in a process started under `package_environment`, a `kernels` package imported
    from anywhere but that folder: a process started with the wrong working directory or path
    would otherwise run, and report, the working tree's kernels as the code asked for."""
    folder = os.environ.get(KERNELS_FROM_ENV)
    elsewhere = _imported_elsewhere(folder) if folder else None
    if elsewhere is not None:
        raise WorkbenchError(f"this process imported {PACKAGE} from {elsewhere}, not from "
                             f"{folder}, the code it was asked to run; PYTHONPATH and the "
                             "working directory decide which.")  # fmt: skip


def _imported_elsewhere(folder: str) -> Path | None:
    """Where this process imported `kernels` from, when that is not inside `folder`; None when
    it did not import it yet or took it from there (paths resolved: links count as their
    targets)."""
    loaded = sys.modules.get(PACKAGE)
    if loaded is None:
        return None
    where = Path(str(loaded.__file__)).resolve()
    return None if where.is_relative_to(Path(folder).resolve()) else where.parent


@contextlib.contextmanager
def arm_packages(versions: Iterable[CodeVersion], root: Path = REPO) -> Iterator[None]:
    """While an A/B run's workers run: the arms' packages laid out in a scratch folder that
    their workers find by CODE_DIR_ENV (nothing where every arm is the working tree)."""
    versions = [v for v in versions if v.key is not None]
    if not versions:
        yield
        return
    kept = os.environ.get(CODE_DIR_ENV)
    with tempfile.TemporaryDirectory(prefix=owned_prefix(TEMP_PREFIX + "code")) as scratch:
        for version in versions:
            export_kernels(version, Path(scratch), root)
        os.environ[CODE_DIR_ENV] = scratch
        try:
            yield
        finally:
            if kept is None:
                os.environ.pop(CODE_DIR_ENV, None)
            else:
                os.environ[CODE_DIR_ENV] = kept
