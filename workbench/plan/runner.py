"""Running a whole plan, and the command line (`run` and `check`) that does it.

The runner checks the plan first (`load_plan`), then runs its steps in order under the
plan's budget: each step gets its own timeout or what is left of the budget less the grace
period, whichever is less, so stopping it still fits; after each step it archives what the
step made and rewrites plan.json. It also turns SIGTERM to itself into the same orderly stop
as Ctrl-C, so a box taken back from outside still leaves a complete log.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from workbench.analysis.git_state import REPO, git_state
from workbench.errors import WorkbenchError
from workbench.plan.archive import archive, snapshot
from workbench.plan.commands import check_commands
from workbench.plan.plan_file import Plan, load_plan
from workbench.plan.records import (
    JSON_FILE,
    LOG_FILE,
    OK,
    TIMEOUT,
    PlanResult,
    RunContext,
    StepResult,
    now,
    write_json,
)
from workbench.plan.steps import GRACE_S, command, run_step

MIN_STEP_S = 1.0  # a step offered less time than this is skipped, not started


def _run_steps(
    plan: Plan, result: PlanResult, budget_s: float, start: float, ctx: RunContext
) -> None:
    """The steps in order, each skipped once the budget is spent or an earlier one failed."""
    stopped_by = ""
    for step, step_result in zip(plan.steps, result.steps):
        ctx.write(f"\n== step {step.name}: {step_result.command}\n")
        left = budget_s - (time.monotonic() - start) - ctx.grace_s
        if stopped_by or left < MIN_STEP_S:
            step_result.note = stopped_by or "the plan's budget ran out"
            ctx.write(f"== {step.name}: skipped ({step_result.note})\n")
            continue
        before = snapshot(step.archive, ctx.root, ctx.out_dir)
        run_step(step, step_result, min(step.timeout_s, left), left < step.timeout_s, ctx)
        ctx.write(
            f"== {step.name}: {step_result.status}, exit status "
            f"{step_result.exit_code}, {step_result.duration_s:.1f} s"
            f"{'; ' + step_result.note if step_result.note else ''}\n"
        )
        archive(step, step_result, before, ctx)
        if step_result.status != OK and not step.continue_on_failure:
            ended = "timed out" if step_result.status == TIMEOUT else "failed"
            stopped_by = f"step {step.name} {ended}"
        result.duration_s = time.monotonic() - start
        write_json(result)


def run_plan(
    path: str | Path,
    out_dir: str | Path,
    *,
    budget_s: float | None = None,
    root: str | Path | None = None,
    grace_s: float = GRACE_S,
    echo: TextIO | None = None,
    only: Sequence[str] = (),
) -> PlanResult:
    """Check the plan at `path`, then run its steps in order from the repository root (or
    `root`) into `out_dir`, and print a short table last.

    Each step gets min(its timeout_s, the plan budget left less `grace_s`), so stopping it
    still fits the budget; a step with no time left is skipped. A failed or stopped step
    skips the rest unless it says continue_on_failure. `budget_s` caps the plan's own budget
    for this run, and `only` names the steps to run (a long plan taken in parts). `echo` also
    gets the log as it is written (the CLI passes the console).
    """
    plan = load_plan(path)
    if only:
        unknown = sorted(set(only) - {step.name for step in plan.steps})
        if unknown:
            raise WorkbenchError(
                f"{plan.path} has no step named {', '.join(unknown)}; its steps are "
                + ", ".join(step.name for step in plan.steps)
            )
        plan = replace(plan, steps=tuple(step for step in plan.steps if step.name in only))
    check_commands(plan)  # before any step: a command that cannot parse costs no device time
    out_dir = Path(out_dir).resolve()
    root = Path(root).resolve() if root is not None else REPO  # steps start in the checkout
    if budget_s is not None and not budget_s > 0:
        raise WorkbenchError(f"--budget-s {budget_s} must be a positive number of seconds")
    budget_s = plan.budget_s if budget_s is None else min(plan.budget_s, budget_s)
    if (out_dir / JSON_FILE).exists():
        raise WorkbenchError(
            f"{out_dir} already holds {JSON_FILE} from an earlier run; give a new or empty folder"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    result = PlanResult(plan.name, plan.path, out_dir, budget_s, git_state(root), now())
    result.steps = [StepResult(s.name, command(s, out_dir)[1]) for s in plan.steps]
    start = time.monotonic()
    with (out_dir / LOG_FILE).open("ab") as log:
        ctx = RunContext(root, out_dir, log, echo, grace_s)
        ctx.write(
            f"# plan {plan.name} ({plan.path}), commit {result.git.get('commit')}, "
            f"started {result.started}, budget {budget_s:g} s, run from {root}\n"
        )
        write_json(result)
        try:
            _run_steps(plan, result, budget_s, start, ctx)
        except KeyboardInterrupt:
            ctx.write("\n== interrupted: the remaining steps did not run\n")
            raise
        finally:
            result.duration_s = time.monotonic() - start
            write_json(result)
            ctx.write("\n" + result.table() + "\n")
    if echo is None:
        print(result.table(), flush=True)
    return result


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM to the runner stops the running step as Ctrl-C does, and still writes the log
    and plan.json."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """`run PLAN OUT_DIR` (0 when every step is ok, else 1) or `check PLAN...`; a bad plan
    prints one line and returns 2."""
    parser = argparse.ArgumentParser(
        prog=prog or "python -m workbench.plan",
        description="Check or run a GPU capture plan (plans/*.toml; see docs/plans.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a plan's steps, logging and archiving into OUT_DIR")
    run.add_argument("plan")
    run.add_argument("out_dir")
    run.add_argument("--budget-s", type=float, help="cap the plan's budget for this run")
    run.add_argument(
        "--grace-s",
        type=float,
        default=GRACE_S,
        help=f"seconds between SIGTERM and SIGKILL ({GRACE_S:g})",
    )
    run.add_argument(
        "--only", action="append", default=[], metavar="STEP", help="run only this step (repeat)"
    )
    run.add_argument("--quiet", action="store_true", help="print only the table at the end")
    check = sub.add_parser("check", help="read and check plans without running them")
    check.add_argument("plans", nargs="+")
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _interrupt) if args.command == "run" else False
    try:
        if args.command == "check":
            for path in args.plans:
                plan = load_plan(path)
                check_commands(plan)
                print(
                    f"{path}: ok: {plan.name}, {len(plan.steps)} steps, budget {plan.budget_s:g} s"
                )
            return 0
        result = run_plan(
            args.plan,
            args.out_dir,
            budget_s=args.budget_s,
            grace_s=args.grace_s,
            echo=None if args.quiet else sys.stdout,
            only=args.only,
        )
    except WorkbenchError as err:
        print(f"workbench plan: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if previous is not False:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    return 0 if result.ok else 1
