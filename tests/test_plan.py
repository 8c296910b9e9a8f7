"""GPU capture plans (workbench.plan) on the CPU, with stand-in commands for the GPU work:
order, timeouts that take child processes with them, failures, archives, budgets, and plans
rejected before anything runs. Every committed plans/*.toml is checked here too."""

from __future__ import annotations

import io
import json
import lzma
import os
import random
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from workbench import plan as wp
from workbench.errors import WorkbenchError
from workbench.plan.commands import workbench_argvs

ROOT = Path(__file__).resolve().parents[1]
PLANS = sorted((ROOT / "plans").glob("*.toml"))
PY = sys.executable
GRACE = 0.5  # seconds between SIGTERM and SIGKILL in these tests


def _toml(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return repr(value)


def write_plan(tmp_path: Path, steps: list[dict], budget_s: float = 30, **top: object) -> Path:
    lines = ['name = "test"', f"budget_s = {budget_s}"]
    lines += [f"{key} = {_toml(value)}" for key, value in top.items()]
    for step in steps:
        lines.append("[[step]]")
        lines += [f"{key} = {_toml(value)}" for key, value in step.items()]
    path = tmp_path / "plan.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def py(code: str) -> list[str]:
    """An argv running `code` in this interpreter."""
    return [PY, "-c", code]


def step(name: str, run: str | list[str], timeout_s: float = 10, **extra: object) -> dict:
    return {"name": name, "run": run, "timeout_s": timeout_s, **extra}


def run(tmp_path: Path, steps: list[dict], budget_s: float = 30, **options) -> wp.PlanResult:
    path = write_plan(tmp_path, steps, budget_s)
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return wp.run_plan(path, tmp_path / "out", root=root, grace_s=GRACE, **options)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting to be reaped has stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_steps_run_in_order_from_the_root_and_are_logged(tmp_path):
    steps = [
        step("first", py("import os; print('one in', os.getcwd())")),
        step("second", "echo two; echo to stderr >&2"),
        step("third", "echo three $GREETING", env={"GREETING": "hello ${HOME}"}),
    ]
    result = run(tmp_path, steps)
    assert result.ok and [s.status for s in result.steps] == ["ok"] * 3
    assert [s.exit_code for s in result.steps] == [0, 0, 0]
    log = (tmp_path / "out" / wp.LOG_FILE).read_text()
    order = [
        log.index(text)
        for text in ("one in", "two", "to stderr", f"three hello {os.environ['HOME']}")
    ]
    assert order == sorted(order)
    assert f"one in {tmp_path / 'root'}" in log  # run from the root, not the caller's folder
    assert "== step second: echo two; echo to stderr >&2" in log and "exit status 0" in log
    saved = json.loads((tmp_path / "out" / wp.JSON_FILE).read_text())
    assert saved["status"] == "ok" and "commit" in saved
    assert [s["name"] for s in saved["steps"]] == ["first", "second", "third"]
    assert all(s["started"] and s["duration_s"] >= 0 for s in saved["steps"])


def test_a_steps_relative_search_paths_are_taken_from_the_root(tmp_path):
    """`PYTHONPATH = "build/ncu:${PYTHONPATH}"` names the checkout's build/ncu from any folder a
    step's command moves to; absolute entries stay, empty ones (an unset variable) go."""
    show = "import os; print('path=' + os.environ['PYTHONPATH'], 'bin=' + os.environ['PATH'])"
    env = {"PYTHONPATH": "build/ncu:/abs/site:", "PATH": "tools:${PATH}"}
    result = run(tmp_path, [step("paths", ["bash", "-c", f'cd / && python3 -c "{show}"'],
                                 env=env)])  # fmt: skip
    assert result.ok
    log = (tmp_path / "out" / wp.LOG_FILE).read_text()
    root = tmp_path / "root"
    assert f"path={root / 'build/ncu'}:/abs/site " in log
    assert f"bin={root / 'tools'}:" in log


def test_a_step_past_its_timeout_is_stopped_with_its_children(tmp_path):
    pids = tmp_path / "root" / "child.pid"
    steps = [step("hang", "sleep 60 & echo $! > child.pid; sleep 60", timeout_s=1)]
    start = time.monotonic()
    result = run(tmp_path, steps)
    (hang,) = result.steps
    assert hang.status == "timeout" and hang.exit_code == -15  # SIGTERM, to the whole group
    assert "stopped at its timeout (1 s)" in hang.note
    assert time.monotonic() - start < 5
    child = int(pids.read_text())
    deadline = time.monotonic() + 2
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the step's background child outlived it"


def test_a_step_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    result = run(tmp_path, [step("stubborn", py(code), timeout_s=1)])
    (stubborn,) = result.steps
    assert stubborn.status == "timeout" and stubborn.exit_code == -9
    assert 1 + GRACE <= stubborn.duration_s < 4


def test_leftover_processes_of_a_finished_step_are_stopped(tmp_path):
    # The shell exits at once; its background child still holds the output.
    result = run(tmp_path, [step("leaves", "sleep 60 & echo $! > child.pid; echo done")])
    assert result.ok and result.steps[0].duration_s < 3
    assert not alive(int((tmp_path / "root" / "child.pid").read_text()))


def test_a_failing_step_stops_the_plan(tmp_path):
    steps = [
        step("good", "echo good"),
        step("bad", py("import sys; print('going down'); sys.exit(3)")),
        step("after", "touch after"),
    ]
    result = run(tmp_path, steps)
    assert not result.ok
    assert [(s.status, s.exit_code) for s in result.steps] == [
        ("ok", 0),
        ("failed", 3),
        ("skipped", None),
    ]
    assert result.steps[2].note == "step bad failed"
    assert not (tmp_path / "root" / "after").exists()
    log = (tmp_path / "out" / wp.LOG_FILE).read_text()
    assert "going down" in log and "== bad: failed, exit status 3" in log


def test_continue_on_failure_runs_the_rest(tmp_path):
    steps = [
        step("bad", "exit 4", continue_on_failure=True),
        step("missing", ["no-such-command-here"], continue_on_failure=True),
        step("after", "touch after"),
    ]
    result = run(tmp_path, steps)
    assert [s.status for s in result.steps] == ["failed", "failed", "ok"]
    assert "could not start" in result.steps[1].note
    assert (tmp_path / "root" / "after").exists() and not result.ok


def test_archive_copies_what_a_step_made_and_xz_packs(tmp_path):
    root = tmp_path / "root"
    (root / "raw" / "old-run").mkdir(parents=True)
    (root / "raw" / "old-run" / "run.json").write_text("{}")  # there before: not archived
    report = random.Random(0).randbytes(1000) * 50  # repeats, as an ncu report's cubins do
    make = (
        "import os, pathlib; r = pathlib.Path('raw/new-run'); r.mkdir(); "
        "(r / 'run.json').write_text('{}'); pathlib.Path('ncu').mkdir(); "
        "import random; report = random.Random(0).randbytes(1000) * 50; "
        "pathlib.Path('ncu/k.ncu-rep').write_bytes(report); "
        "pathlib.Path('ncu/k.json').write_text('{}'); "
        "d = pathlib.Path(os.environ['OUT_DIR']) / 'tune'; d.mkdir(); "
        "(d / 'tune.csv').write_text('a,b'); (d / 'big.txt').write_text('x' * 10000)"
    )
    archive = [
        "raw/*-run",
        {"glob": "ncu/*.ncu-rep", "pack": "xz"},
        "ncu/*.json",
        {"glob": "{out}/tune/*.txt", "pack": "xz"},
        {"glob": "raw/new-run", "pack": "xz"},
        "nothing/*",
    ]
    result = run(tmp_path, [step("make", py(make), env={"OUT_DIR": "{out}"}, archive=archive)])
    out = tmp_path / "out"
    assert result.ok
    assert (out / "raw" / "new-run" / "run.json").read_text() == "{}"
    assert not (out / "raw" / "old-run").exists()
    assert lzma.decompress((out / "ncu" / "k.ncu-rep.xz").read_bytes()) == report
    assert len((out / "ncu" / "k.ncu-rep.xz").read_bytes()) < len(report) / 10
    assert not (out / "ncu" / "k.ncu-rep").exists() and (out / "ncu" / "k.json").exists()
    # Under {out}: packed in place, the original removed; other files left as they are.
    assert lzma.decompress((out / "tune" / "big.txt.xz").read_bytes()) == b"x" * 10000
    assert not (out / "tune" / "big.txt").exists() and (out / "tune" / "tune.csv").exists()
    with tarfile.open(out / "raw" / "new-run.tar.xz") as tar:
        assert "new-run/run.json" in tar.getnames()
    assert set(result.steps[0].archived) == {
        "raw/new-run",
        "ncu/k.ncu-rep.xz",
        "ncu/k.json",
        "tune/big.txt.xz",
        "raw/new-run.tar.xz",
    }
    log = (out / wp.LOG_FILE).read_text()
    assert "== archive nothing/*: nothing new" in log


def test_the_plan_budget_stops_a_step_and_skips_the_rest(tmp_path):
    steps = [step("long", "sleep 30", timeout_s=20), step("next", "touch next")]
    start = time.monotonic()
    result = run(tmp_path, steps, budget_s=2)
    assert time.monotonic() - start < 2.5
    long, nxt = result.steps
    assert long.status == "timeout" and long.note == "stopped: the plan's budget ran out"
    assert long.limit_s == pytest.approx(2 - GRACE, abs=0.1)
    assert nxt.status == "skipped" and not (tmp_path / "root" / "next").exists()


def test_a_step_left_without_time_is_skipped(tmp_path):
    steps = [step("first", "sleep 0.8", timeout_s=5), step("second", "touch second")]
    result = run(tmp_path, steps, budget_s=2)  # 2 s less the grace: 0.7 s left after first
    assert [s.status for s in result.steps] == ["ok", "skipped"]
    assert result.steps[1].note == "the plan's budget ran out"


def test_budget_override_and_only(tmp_path, capsys):
    steps = [step("a", "touch a"), step("b", "touch b"), step("c", "touch c")]
    path = write_plan(tmp_path, steps, budget_s=100)
    root = tmp_path / "root"
    root.mkdir()
    result = wp.run_plan(
        path, tmp_path / "out", root=root, budget_s=5, grace_s=GRACE, only=["a", "c"]
    )
    assert result.budget_s == 5 and [s.name for s in result.steps] == ["a", "c"]
    assert {p.name for p in root.iterdir()} == {"a", "c"}
    assert "plan test: 2 of 2 steps ok" in capsys.readouterr().out  # the table, printed last
    with pytest.raises(WorkbenchError, match="no step named d; its steps are a, b, c"):
        wp.run_plan(path, tmp_path / "out2", root=root, only=["d"])


def test_an_output_folder_of_an_earlier_run_is_refused(tmp_path):
    run(tmp_path, [step("a", "true")])
    with pytest.raises(WorkbenchError, match="already holds plan.json"):
        run(tmp_path, [step("a", "true")])


BAD_PLANS = {
    "unknown step key": (
        '[[step]]\nname = "a"\nrun = "true"\ntimeout = 5\n',
        "step 2 ('a'): unknown key 'timeout'; did you mean 'timeout_s'?",
    ),
    "unknown top-level key": (
        '[[steps]]\nname = "a"\n',
        "unknown key 'steps'; did you mean 'step'",
    ),
    "missing run": ('[[step]]\nname = "a"\ntimeout_s = 5\n', "step 2 ('a'): missing 'run'"),
    "empty run": ('[[step]]\nname = "a"\nrun = " "\ntimeout_s = 5\n', "run must be a non-empty"),
    "negative timeout": (
        '[[step]]\nname = "a"\nrun = "true"\ntimeout_s = -5\n',
        "timeout_s = -5 must be positive",
    ),
    "timeout as text": (
        '[[step]]\nname = "a"\nrun = "true"\ntimeout_s = "5"\n',
        "timeout_s = '5' is not a number of seconds",
    ),
    "unreadable TOML": ('[[step]\nname = "a"\n', "is not valid TOML"),
    "one step table": ('[step]\nname = "a"\nrun = "true"\ntimeout_s = 5\n', "[[step]] tables"),
    "duplicate names": (
        '[[step]]\nname = "a"\nrun = "true"\ntimeout_s = 5\n' * 2,
        "a second step named 'a'",
    ),
    "unknown pack": (
        '[[step]]\nname = "a"\nrun = "true"\ntimeout_s = 5\n'
        'archive = [{ glob = "x", pack = "zip" }]\n',
        "archive pack = 'zip' is not known",
    ),
    "glob outside the root": (
        '[[step]]\nname = "a"\nrun = "true"\ntimeout_s = 5\narchive = ["../x"]\n',
        "must be relative to the repository root",
    ),
    "env not strings": (
        '[[step]]\nname = "a"\nrun = "true"\ntimeout_s = 5\nenv = { N = 1 }\n',
        "env must be a table of strings",
    ),
    "run list not strings": (
        '[[step]]\nname = "a"\nrun = ["python3", 1]\ntimeout_s = 5\n',
        "run as a list must be non-empty strings",
    ),
}


@pytest.mark.parametrize("case", BAD_PLANS)
def test_bad_plans_are_rejected_before_any_step_runs(tmp_path, case):
    body, message = BAD_PLANS[case]
    first = '[[step]]\nname = "first"\nrun = "touch ran"\ntimeout_s = 5\n'
    if case.startswith(("unreadable", "one step", "unknown top")):
        first = ""
    path = tmp_path / "bad.toml"
    path.write_text(f'name = "bad"\nbudget_s = 60\n{first}{body}')
    with pytest.raises(WorkbenchError) as err:
        wp.run_plan(path, tmp_path / "out", root=tmp_path)
    assert message in str(err.value) and str(path) in str(err.value)
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ("budget_s = 0\n", "budget_s = 0 must be positive"),
        ('name = "x"\n', "missing top-level 'budget_s'"),
        ('name = "x"\nbudget_s = 60\n', "missing top-level 'step'"),
    ],
)
def test_bad_plan_headers_are_rejected(tmp_path, top, message):
    path = tmp_path / "bad.toml"
    header = top if top.startswith("name") else f'name = "x"\n{top}'
    steps = "" if "'step'" in message else '[[step]]\nname = "a"\nrun = "true"\ntimeout_s = 5\n'
    path.write_text(header + steps)
    with pytest.raises(WorkbenchError, match=message):
        wp.load_plan(path)


def test_a_missing_plan_file_says_what_to_give(tmp_path):
    with pytest.raises(WorkbenchError, match="cannot read plan .*plans/bench-all.toml"):
        wp.load_plan(tmp_path / "nope.toml")


def test_command_line_run_and_check(tmp_path, capsys):
    path = write_plan(tmp_path, [step("a", "echo from-a"), step("b", "exit 1")])
    assert wp.main(["check", str(path)]) == 0
    assert "ok: test, 2 steps, budget 30 s" in capsys.readouterr().out
    assert wp.main(["run", str(path), str(tmp_path / "out"), "--grace-s", "0.5"]) == 1
    printed = capsys.readouterr().out
    assert "from-a" in printed  # the log, as it is written
    assert printed.rstrip().splitlines()[-1].split()[:2] == ["b", "failed"]  # the table last
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nbudget_s = 1\n[[step]]\nname = "a"\n')
    assert wp.main(["check", str(bad)]) == 2
    assert "workbench plan: error:" in capsys.readouterr().err


def test_the_module_runs_without_torch():
    code = "import sys, workbench.plan; sys.exit('torch' in sys.modules)"
    assert subprocess.run([PY, "-c", code], cwd=ROOT).returncode == 0


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_committed_plans_check(path, capsys):
    assert wp.main(["check", str(path)]) == 0
    assert wp.load_plan(path).description.strip()


def test_committed_plans_call_existing_commands_and_files():
    """Plans install the package first; their workbench commands parse (`plan check`, the
    test above, checks them); the tests and scripts they name exist."""
    assert {p.stem for p in PLANS} >= {"bench-all", "gpu-tests", "ncu-kernels", "profiles"}
    for path in PLANS:  # the package is installed first, not put on PYTHONPATH
        first = str(wp.load_plan(path).steps[0].run)
        assert "pip install" in first and "--no-build-isolation" in first, path.name
    for path in PLANS:
        for s in wp.load_plan(path).steps:
            text = s.run if isinstance(s.run, str) else shlex.join(s.run)
            for arg in shlex.split(text.replace("\\\n", " ")):
                if arg.startswith(("tests/", "scripts/")):
                    assert (ROOT / arg).is_file(), f"{path.name}, {s.name}: no {arg}"


def test_the_workbench_commands_of_a_step_are_found_in_its_shell_line():
    """Cut at the shell's operators, past variable assignments and a redirection's file
    descriptor, with {out} filled in; `workbench plan` (the runner itself) is not one."""
    line = (
        "CODE=abc workbench ab dense --a x=1 --b x=2 --out {out}/raw 2>&1 | tee log && \\\n"
        "python3 scripts/a.py && workbench plan check p.toml; workbench report raw > r.txt"
    )
    assert workbench_argvs(line) == [
        ["ab", "dense", "--a", "x=1", "--b", "x=2", "--out", "OUT/raw"],
        ["report", "raw"],
    ]
    assert workbench_argvs(("workbench", "bench", "moe")) == [["bench", "moe"]]


def test_a_workbench_command_that_does_not_parse_stops_the_plan_before_it_starts(tmp_path, capsys):
    """A misspelt flag is found by `plan check` and before `plan run` starts any step, with
    the step and argparse's complaint named, not on the GPU box after the steps before it."""
    misspelt = "workbench ab dense --a x=1 --b x=2 --tokenz 64"
    steps = [step("first", "echo ran > first.txt"), step("ab", misspelt)]
    assert wp.main(["check", str(write_plan(tmp_path, steps))]) == 2
    err = capsys.readouterr().err
    assert f"step 'ab': `{misspelt}` does not parse" in err
    assert "unrecognized arguments: --tokenz 64" in err
    with pytest.raises(WorkbenchError, match="step 'ab'"):
        run(tmp_path, steps)
    assert not (tmp_path / "root" / "first.txt").exists()


def test_commands_go_unchecked_where_the_cli_cannot_be_imported_yet(tmp_path, monkeypatch):
    """The runner starts with the standard library alone (the plan's first step installs the
    rest): without the CLI's dependencies it says the commands went unchecked and goes on."""
    from workbench.plan.commands import check_commands

    monkeypatch.setitem(sys.modules, "workbench.cli", None)  # import workbench.cli fails
    plan = wp.load_plan(write_plan(tmp_path, [step("ab", "workbench ab dense --tokenz 64")]))
    note = io.StringIO()
    check_commands(plan, note)
    assert "workbench commands not checked: the CLI needs workbench.cli" in note.getvalue()
