"""workbench.analysis.git_state: the commit a capture records, and the source trees that match
a run from a copy whose .git is stale to the commit whose code ran."""

import shutil
import subprocess
from pathlib import Path

import pytest

from workbench.analysis.git_state import git_state, matching_commit, source_trees


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          cwd=root, capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip()


def commit_files(root: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / ".gitignore").write_text("__pycache__/\n")
    return root


def test_a_copy_with_a_stale_git_is_matched_to_the_commit_whose_code_ran(repo, tmp_path):
    first = commit_files(repo, {"kernels/k.py": "a = 1\n", "workbench/w.py": "b = 1\n"}, "one")
    commit_files(repo, {"kernels/k.py": "a = 2\n"}, "two")
    third = commit_files(repo, {"README.md": "docs only\n"}, "three")  # same source folders
    # the GPU machine's copy: today's files, the .git of an earlier moment
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy)
    git(copy, "reset", "-q", "--soft", first)
    (copy / "kernels" / "__pycache__").mkdir()
    (copy / "kernels" / "__pycache__" / "k.pyc").write_bytes(b"ignored")
    state = git_state(copy)
    assert (state["commit"], state["dirty"]) == (first, True)
    assert state["source_trees"] == source_trees(repo)
    # the second and third commits hold that code: the newest is named
    assert matching_commit(state["source_trees"], repo) == third
    git(copy, "reset", "-q", "--hard", first)
    assert matching_commit(source_trees(copy), repo) == first


def test_code_that_no_commit_holds_matches_none(repo):
    commit_files(repo, {"kernels/k.py": "a = 1\n", "workbench/w.py": "b = 1\n"}, "one")
    (repo / "kernels" / "k.py").write_text("a = 3\n")
    state = git_state(repo)
    assert state["dirty"] is True
    assert matching_commit(state["source_trees"], repo) is None


def test_the_commit_passed_by_a_capture_script_wins(monkeypatch, repo):
    monkeypatch.setenv("WORKBENCH_GIT_COMMIT", "d93424b68b89b0f5e2e045db633792259ffedcb3")
    assert git_state(repo) == {"commit": "d93424b68b89b0f5e2e045db633792259ffedcb3",
                               "dirty": None, "source": "env"}  # fmt: skip


def test_outside_a_repository_nothing_is_claimed(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_GIT_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert git_state(tmp_path) == {"commit": None, "dirty": None, "source_trees": None}


def test_the_report_names_the_commit_a_dirty_runs_source_matches():
    from workbench.analysis.collection import REPO, environment_row

    try:
        head = git(REPO, "rev-parse", "HEAD")
        trees = {f: git(REPO, "rev-parse", f"HEAD:{f}") for f in ("kernels", "workbench")}
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("the workbench is not in a git checkout here")
    stale = {"commit": "0" * 40, "dirty": True}
    row = environment_row({"environment": {"git": {**stale, "source_trees": trees}}})
    assert row["commit"] == f"{head[:10]} (by its source)"  # HEAD is the newest with them
    assert environment_row({"environment": {"git": stale}})["commit"] == "0000000000 (dirty)"
