"""Whether a plan's `workbench` commands parse, checked before a step starts: a misspelt flag
found on the GPU box costs a device call, found by `plan check` it costs nothing.

Only the command line is checked, by the `workbench` parser itself; what a parameter's value
means (a kernel setting, a projection's name) is checked when the command runs. The parser
needs the workbench's own dependencies (pandas); the runner needs only the standard library,
so where they are not installed yet the commands go unchecked, and the runner says so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from typing import TextIO

from workbench.errors import WorkbenchError
from workbench.plan.plan_file import OUT_TOKEN, Plan, Step

_OPERATOR = re.compile(r"^[;&|()<>]+$")  # what shlex's punctuation_chars splits off
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def workbench_argvs(run: str | tuple[str, ...]) -> list[list[str]]:
    """The arguments after `workbench` of each `workbench` command in a step's `run`: a shell
    line is cut at its operators (&&, ;, |, redirections), and a command's leading variable
    assignments (`CODE=... workbench ...`) and a redirection's file descriptor are left out."""
    if isinstance(run, tuple):
        tokens = list(run)
    else:
        lexer = shlex.shlex(run.replace("\\\n", " "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    commands, current = [], []
    for token in tokens:
        if _OPERATOR.match(token):
            if token.startswith((">", "<")) and current and current[-1].isdigit():
                current.pop()  # the 2 of 2>&1
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    argvs = []
    for words in commands:
        while words and _ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words[:1] == ["workbench"] and words[1:2] != ["plan"]:
            argvs.append([word.replace(OUT_TOKEN, "OUT") for word in words[1:]])
    return argvs


def parse_problem(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """argparse's complaint about `workbench ARGV`, or None where it parses."""
    complaint = io.StringIO()
    try:
        with contextlib.redirect_stderr(complaint), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as stop:
        if stop.code:
            return complaint.getvalue().strip().splitlines()[-1]
    return None


def check_commands(plan: Plan, note: TextIO = sys.stderr) -> None:
    """Refuse a plan with a `workbench` command that does not parse, naming its step; where
    the CLI cannot be imported yet, say on `note` that the commands went unchecked."""
    argvs = [(step, argv) for step in plan.steps for argv in workbench_argvs(step.run)]
    if not argvs:
        return
    try:
        from workbench.cli import build_parser
    except ImportError as err:
        print(f"workbench plan: {plan.path}'s workbench commands not checked: the CLI needs "
              f"{err.name or err}, not installed yet", file=note)  # fmt: skip
        return
    parser = build_parser()
    for step, argv in argvs:
        problem = parse_problem(parser, argv)
        if problem is not None:
            raise _unparsed(plan, step, argv, problem)


def _unparsed(plan: Plan, step: Step, argv: list[str], problem: str) -> WorkbenchError:
    return WorkbenchError(
        f"{plan.path}: step '{step.name}': `workbench {shlex.join(argv)}` does not parse "
        f"({problem}); fix the command (`workbench {argv[0] if argv else ''} --help`)"
    )
