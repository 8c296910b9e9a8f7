"""A/B arms on different code: a commit's or a folder's kernels package, found by the arm's
workers before anything imports `kernels`, and recorded without machine paths."""

import os
import subprocess
import sys

import pytest
from helpers import QUICK, ROOT, SMALL

from workbench.analysis.git_state import git_output
from workbench.artifacts import ROWS_FILE, read_meta
from workbench.capture import experiments as ex
from workbench.capture.code_versions import (
    CODE_DIR_ENV,
    WORKTREE,
    CodeVersion,
    arm_packages,
    code_version,
    export_kernels,
    use_kernels_from,
)
from workbench.cli.values import kernel_setting, profile_ab_setting
from workbench.errors import WorkbenchError
from workbench.report.sections_experiments import _arm


def head() -> str:
    return git_output(ROOT, "rev-parse", "HEAD")


def package_folder(root, text: str):
    """A folder `root/old` holding a kernels package whose one file says `text`."""
    (root / "old" / "kernels").mkdir(parents=True)
    (root / "old" / "kernels" / "__init__.py").write_text(text)
    return root / "old"


def test_an_arms_code_is_the_worktree_a_commit_or_a_folder(tmp_path):
    assert code_version(WORKTREE) == CodeVersion()
    assert code_version("HEAD") == CodeVersion(commit=head())
    folder = code_version(str(package_folder(tmp_path, "")))
    assert folder.folder == (tmp_path / "old").resolve()
    # what the metadata keeps: the commit, or the folder's name and what it held, never where
    # it lies; two folders of one name holding other files are two arms
    assert folder.record() == {"code": "folder", "folder": "old", "digest": folder.digest}
    other = code_version(str(package_folder(tmp_path / "y", "X = 1\n")))
    assert other.key != folder.key and other.key.startswith("folder-old-")
    with pytest.raises(WorkbenchError, match="code= is empty"):
        code_version(" ")
    assert code_version("HEAD").record() == {"code": "commit", "commit": head()}
    with pytest.raises(WorkbenchError, match=r"that folder has no kernels/__init__.py"):
        code_version(str(tmp_path))
    with pytest.raises(WorkbenchError, match=r"git archive no-such-ref kernels \| tar -x -C DIR"):
        code_version("no-such-ref")
    # a checkout without the history (a GPU machine's copy): the same way out
    with pytest.raises(WorkbenchError, match="pass code=DIR"):
        code_version("HEAD", root=tmp_path)


def test_a_commits_kernels_are_exported_as_the_commit_has_them(tmp_path):
    version = code_version("HEAD")
    key = export_kernels(version, tmp_path)
    assert key == head()[:12] == version.key
    exported = (tmp_path / key / "kernels" / "moe" / "flat.py").read_text()
    committed = subprocess.run(["git", "show", "HEAD:kernels/moe/flat.py"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert exported == committed
    assert export_kernels(CodeVersion(), tmp_path) is None  # the worktree: nothing to lay out


def test_a_folder_arm_runs_a_copy_of_its_files_taken_as_the_ab_starts(tmp_path):
    folder = tmp_path / "base:v1"  # a name that would split PYTHONPATH
    (folder / "kernels" / "__pycache__").mkdir(parents=True)
    (folder / "kernels" / "__init__.py").write_text("A = 1\n")
    (folder / "kernels" / "__pycache__" / "x.pyc").write_bytes(b"stale")
    version = code_version(str(folder))
    key = export_kernels(version, tmp_path / "scratch")
    assert key == f"folder-base_v1-{version.digest[:12]}" and os.pathsep not in key
    (folder / "kernels" / "__init__.py").write_text("A = 2\n")  # edited while the arm runs
    copied = tmp_path / "scratch" / key / "kernels"
    assert (copied / "__init__.py").read_text() == "A = 1\n"
    assert not (copied / "__pycache__").exists()  # compiled caches are not code
    with pytest.raises(WorkbenchError, match="changed while the A/B started"):
        export_kernels(version, tmp_path / "again")


def test_a_commit_without_kernels_is_refused_by_name(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "README").write_text("no kernels here\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-qm", "no kernels"], check=True)
    version = code_version("HEAD", root=tmp_path)
    with pytest.raises(WorkbenchError, match=f"commit {version.commit[:12]} has no kernels"):
        export_kernels(version, tmp_path / "scratch", root=tmp_path)


def test_a_worker_without_the_runs_scratch_folder_says_so(monkeypatch):
    monkeypatch.delenv(CODE_DIR_ENV, raising=False)
    with pytest.raises(WorkbenchError, match=f"{CODE_DIR_ENV} is not set"):
        use_kernels_from("0123456789ab")
    use_kernels_from(None)  # the working tree's: nothing to do


def imported_kernels(scratch, key, first: str = "",
                     via_module: bool = False) -> subprocess.CompletedProcess:  # fmt: skip
    """Where `kernels` comes from in a fresh process that takes the arm's code first (with
    `via_module`, also in a process that one starts from the repository's root, as a
    profile's `python -m` precompile workers are)."""
    script = (f"{first}from workbench.capture.code_versions import use_kernels_from\n"
              f"use_kernels_from({key!r})\nimport kernels, os\n"
              "print(kernels.__file__)\nprint(os.environ['PYTHONPATH'])\n"
              "print(os.environ['TRITON_CACHE_DIR'])\n")  # fmt: skip
    if via_module:  # `-c` puts the working directory first on the path as `-m` does
        script += ("import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', "
                   "'import kernels; print(kernels.__file__)'], capture_output=True, text=True,"
                   " check=True).stdout.strip())\n")  # fmt: skip
    env = {**os.environ, CODE_DIR_ENV: str(scratch)}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, env=env)  # fmt: skip


def test_an_arms_worker_imports_the_arms_kernels_and_passes_them_on(tmp_path):
    with arm_packages([code_version("HEAD")]):
        scratch = os.environ[CODE_DIR_ENV]
        done = imported_kernels(scratch, head()[:12])
        assert done.returncode == 0, done.stderr
        where, path, cache = done.stdout.splitlines()
        assert where.startswith(os.path.join(scratch, head()[:12], "kernels"))
        assert path.split(os.pathsep)[0] == os.path.join(scratch, head()[:12])
        # its kernels compile into a Triton cache in the scratch folder, gone with it
        assert os.path.dirname(cache) == scratch
        # a process it starts by `python -m` from the repository's root (a profile's
        # precompile workers) takes the arm's kernels too, not the root's own
        grandchild = imported_kernels(scratch, head()[:12], via_module=True)
        assert grandchild.returncode == 0, grandchild.stderr
        assert grandchild.stdout.splitlines()[-1].startswith(os.path.join(scratch, head()[:12]))
        late = imported_kernels(scratch, head()[:12], first="import kernels\n")
        assert late.returncode != 0 and "imported before the arm's code was set" in late.stderr
    assert CODE_DIR_ENV not in os.environ and not os.path.exists(scratch)  # cleaned up


def test_an_ab_of_a_commit_against_the_worktree_records_which_code_ran(tmp_path):
    result = ex.ab({"code": "HEAD"}, {"code": WORKTREE}, [3], run_dir=tmp_path, variant="stock",
                   fmt="bf16", repeats=QUICK, workers=2, progress=False, **SMALL)  # fmt: skip
    row = result.table().iloc[0]
    assert row["status_a"] == row["status_b"] == "ok"
    assert read_meta(tmp_path)["params"]["code"] == {
        "a": {"code": "commit", "commit": head()},
        "b": {"code": WORKTREE},
    }
    assert "workbench-capture-code" not in (tmp_path / ROWS_FILE).read_text()  # no scratch path
    # the report's caption names the commit an arm ran
    params = read_meta(tmp_path)["params"]
    assert _arm(params, "a") == f"code=commit {head()[:12]}"
    assert _arm(params, "b") == "code=worktree"
    with pytest.raises(WorkbenchError, match="give it to the arms, not to both"):
        ex.ab({}, {}, [3], run_dir=tmp_path / "x", code="HEAD")


def test_the_command_line_keeps_a_revision_as_text():
    # a short sha of digits would read as a number, 6e86749 as a float
    assert kernel_setting("code=4010743") == ("code", "4010743")
    assert profile_ab_setting("code=6e86749") == ("code", "6e86749")
    assert kernel_setting("num_stages=2") == ("num_stages", 2)


def test_a_dense_ab_runs_each_arm_in_turns_and_widens_over_its_runs(tmp_path):
    # W8A16 layers of HEAD and the worktree at 4 rows, each arm in three workers (a b b a a b)
    result = ex.ab({"code": "HEAD"}, {}, [4], kernel="dense", runs=3, run_dir=tmp_path,
                   variant="w8a16", repeats=QUICK, workers=2, progress=False)  # fmt: skip
    row = result.table().iloc[0]
    assert row["status_a"] == row["status_b"] == "ok"
    assert row["ci_low"] <= row["ratio"] <= row["ci_high"]
    runs = result.rows.sort_values(["arm", "run"])[["arm", "run"]].to_records(index=False)
    assert [tuple(r) for r in runs] == [("a", r) for r in range(3)] + [("b", r) for r in range(3)]
    assert (result.rows["rel_error"] < 1e-2).all()  # checked against the dequantised weights
    params = read_meta(tmp_path)["params"]
    assert params["runs"] == 3 and params["code"]["a"]["commit"] == head()
