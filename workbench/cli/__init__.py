"""The `workbench` command: profile, benchmark, sweep and A/B on a GPU; show, trace, ncu-report
and report anywhere; plans for the GPU box.

Errors the user can fix (bad input, a damaged artifact, no GPU) print one clear line and exit
with status 2; anything else is a bug and keeps its traceback. Every output path is checked
before any work starts, SIGTERM unwinds like Ctrl-C (temporary files go), and a closed pipe
(`workbench show ... | head`) ends quietly.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from workbench.artifacts import check_output_dir, check_output_file
from workbench.cli import capture_commands as capture
from workbench.cli import read_commands as read
from workbench.errors import WorkbenchError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Profile MoE and dense GEMM kernels: where the time goes, and why.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    capture.add_profile(sub)
    read.add_show(sub)
    read.add_trace(sub)
    capture.add_ncu(sub)
    read.add_ncu_report(sub)
    capture.add_bench(sub)
    capture.add_sweep(sub)
    capture.add_ab(sub)
    read.add_report(sub)
    sub.add_parser("plan", help="check or run a GPU capture plan (plans/*.toml); see plan --help")
    read.add_export_notebook(sub)
    return parser


COMMANDS = {
    "profile": capture.profile,
    "show": read.show,
    "trace": read.trace,
    "ncu": capture.ncu,
    "ncu-report": read.ncu_report,
    "bench": capture.bench,
    "sweep": capture.sweep,
    "ab": capture.ab,
    "report": read.report,
    "export-notebook": read.export_notebook,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"]:  # the plan runner parses its own arguments, --help included
        from workbench.plan import main as plan_main

        return plan_main(argv[1:], prog="workbench plan")
    args = build_parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so temporary folders and staged runs are removed.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        _check_outputs(args)
        status = COMMANDS[args.command](args)
    except (WorkbenchError, argparse.ArgumentTypeError) as err:
        print(f"workbench: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `workbench show ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return status or 0


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _check_outputs(args: argparse.Namespace) -> None:
    """Every output path is checked before any work starts, so a measurement is never lost to
    a bad path at the end."""
    if getattr(args, "out", None) is not None:
        check_output_dir(args.out, "--out")
    for flag in ("html", "markdown"):
        if getattr(args, flag, None) is not None:
            check_output_file(getattr(args, flag), f"--{flag}")
