"""Which code a capture ran: the git commit, and the git tree ids of the source folders as they
were on disk, so a run from a tree whose .git is stale can still be matched to its commit.

The GPU machine gets a copy of the working tree with the .git of an earlier moment: there
`git rev-parse HEAD` names an older commit and the tree reads as dirty. The tree ids of
`kernels/` and `workbench/` as they are on disk (hashed through a scratch index, so the
repository's own index is not touched) equal those of the commit whose code ran, which
`matching_commit` then finds in the local history. It lives in analysis, beside the report
that matches recorded trees, and needs only git: the captures and the plan runner record with
it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # this checkout: whose code a capture records
SOURCE_FOLDERS = ("kernels", "workbench")
HISTORY_DEPTH = 2000  # commits of HEAD's history `matching_commit` looks through


def git_output(root: Path, *args: str, env: Mapping[str, str] | None = None,
               stdin: str | None = None) -> str | None:  # fmt: skip
    """git's stripped output in `root`, or None where git failed or is missing."""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                             timeout=20, env=env, input=stdin)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_trees(root: Path) -> dict[str, str] | None:
    """{folder: git tree id} of SOURCE_FOLDERS as they are on disk (ignored files left out),
    or None where git cannot say (no git, no repository)."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        if git_output(root, "add", "-A", "--", *SOURCE_FOLDERS, env=env) is None:
            return None
        trees = {
            f: git_output(root, "write-tree", f"--prefix={f}/", env=env) for f in SOURCE_FOLDERS
        }
    return None if None in trees.values() else trees


def git_state(root: Path) -> dict:
    """The commit that ran, whether tracked files differ from it, and `source_trees`.
    WORKBENCH_GIT_COMMIT, which a capture script may pass along, wins."""
    if os.environ.get("WORKBENCH_GIT_COMMIT"):
        return {"commit": os.environ["WORKBENCH_GIT_COMMIT"], "dirty": None, "source": "env"}
    dirty = git_output(root, "status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git_output(root, "rev-parse", "HEAD"),
        "dirty": None if dirty is None else bool(dirty),
        "source_trees": source_trees(root),
    }


def matching_commit(trees: Mapping[str, str], root: Path,
                    depth: int = HISTORY_DEPTH) -> str | None:  # fmt: skip
    """The newest commit among HEAD's last `depth` whose source folders have exactly `trees`,
    or None: the code a run recorded as dirty, when it was a commit after all."""
    commits = (git_output(root, "rev-list", f"--max-count={depth}", "HEAD") or "").split()
    folders = list(trees)
    if not commits or not folders:
        return None
    queries = "".join(f"{c}:{f}\n" for c in commits for f in folders)
    answer = git_output(root, "cat-file", "--batch-check=%(objectname)", stdin=queries)
    if answer is None:
        return None
    ids = answer.splitlines()
    for i, commit in enumerate(commits):
        if ids[i * len(folders) : (i + 1) * len(folders)] == [trees[f] for f in folders]:
            return commit
    return None
