"""Run a GPU capture plan: a TOML file of time-boxed steps, each logged and archived.

A capture on a GPU box is a handful of commands (GPU tests, `workbench bench`, `profile`,
`ncu`, tuning scripts) whose outputs must come back even when one hangs or the time runs out.
A plan (`plans/*.toml`, format in docs/plans.md) says that declaratively; this package checks
it before anything runs, then runs its steps in order from the repository root, each in its
own process group under its timeout and what is left of the plan's budget (SIGTERM to the
group, SIGKILL after a grace period, so a step's child processes stop with it). It writes
`OUT/plan-log.txt` (every step's command, start, duration, exit status and full output) and
`OUT/plan.json` after every step, so an interrupted run still says what happened, and copies
or xz-packs what each step produced into OUT.

    python -m workbench.plan check plans/bench-all.toml
    python -m workbench.plan run plans/bench-all.toml OUT_DIR

One job a module:

- `plan_file`: the format, its checked dataclasses, and `load_plan` with errors that give the fix;
- `steps`: one step in its own process group, under its limit, output to the log;
- `archive`: what a step created or changed, copied or xz-packed into the output folder;
- `records`: the step and plan results, plan.json and the log they are written to;
- `runner`: `run_plan` (the steps in order under the budget) and `main` (the command line).

Standard library only (no torch, no pandas), so it runs on a bare GPU image or anywhere.
"""

from workbench.plan.plan_file import OUT_TOKEN, ArchiveRule, Plan, Step, load_plan
from workbench.plan.records import JSON_FILE, LOG_FILE, PlanResult, StepResult
from workbench.plan.runner import main, run_plan
from workbench.plan.steps import GRACE_S

__all__ = [
    "GRACE_S",
    "JSON_FILE",
    "LOG_FILE",
    "OUT_TOKEN",
    "ArchiveRule",
    "Plan",
    "PlanResult",
    "Step",
    "StepResult",
    "load_plan",
    "main",
    "run_plan",
]
