"""The commands that read artifacts on any machine: show, trace, ncu-report, report and
export-notebook."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.artifacts import run_kind
from workbench.errors import WorkbenchError

if TYPE_CHECKING:  # the commands import what they read when they run
    from workbench.analysis.collection import Collection


def add_show(sub) -> None:
    p = sub.add_parser("show", help="print the tables of a saved run (works without a GPU)")
    p.add_argument("runs", nargs="+", help="run directories under raw/; several are compared")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")


def show(args) -> None:
    import workbench

    missing = [path for path in args.runs if not Path(path).exists()]
    if missing:
        raise WorkbenchError(f"{', '.join(missing)} does not exist; give a profile run's folder "
                             "(raw/profile-*), as `workbench profile` wrote it.")  # fmt: skip
    runs, skipped = [], {}
    for path in args.runs:
        kind = run_kind(path)
        if kind == "profile":
            runs.append(workbench.load(path))
        else:  # an A/B, sweep or benchmark folder among profiles (`show raw/*/`)
            skipped[kind.split(" (")[0]] = skipped.get(kind.split(" (")[0], 0) + 1
    if skipped:
        what = ", ".join(f"{kind}: {n}" for kind, n in skipped.items())
        print(f"workbench show: skipped {sum(skipped.values())} folders that are not profiles "
              f"({what}); `workbench report` shows every kind", file=sys.stderr)  # fmt: skip
    if not runs:
        raise WorkbenchError(
            "none of these is a profile run; `show` prints profiles (raw/profile-*), "
            "`workbench report PATH --html PAGE` shows any artifact."
        )
    if len(runs) == 1:
        print(runs[0].text())
        page = runs[0]
    else:  # numbered columns and a legend: the labels are too long for a terminal's width
        page = runs[0].compare(*runs[1:], labels=[f"[{i + 1}]" for i in range(len(runs))])
        print("\n".join(f"[{i + 1}] {run.label}  ({run.path})" for i, run in enumerate(runs)))
        print("\nPrefill (ms)\n" + page.prefill().round(2).to_string())
        print("\nDecode, per step (mean ms)\n" + page.decode().round(3).to_string())
        if note := page.card_note():
            print("\n" + note)
    if args.html:
        if len(runs) > 1:
            page = runs[0].compare(*runs[1:])
        print(f"report: {page.to_html(args.html)}")


def add_trace(sub) -> None:
    p = sub.add_parser(
        "trace", help="attribute an external torch.profiler trace (.json or .json.gz)"
    )
    p.add_argument("path")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")


def trace(args) -> None:
    import workbench

    result = workbench.load_trace(args.path)
    print(result.text())
    print("\nHow categories were decided (kernel counts)\n" + result.attribution().to_string())
    if args.html:
        print(f"report: {result.to_html(args.html)}")


def add_ncu_report(sub) -> None:
    p = sub.add_parser("ncu-report", help="print the tables of any .ncu-rep (no GPU needed)")
    p.add_argument("report")
    p.add_argument("--baseline", help="another report to diff against (launches pair by "
                   "label, else by kernel, token count and position)")  # fmt: skip
    p.add_argument("--select", metavar="REGEX", help="only the launches whose label matches, "
                   "in the report and the baseline (e.g. gate_up). A label is 'kernel @ NVTX "
                   "range', so a word of the range matches all its launches ('gemm' matches "
                   "'wb:dense:deepgemm'); anchor at the kernel: '^(_w8a8|sm90_fp8)'")  # fmt: skip
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report "
                   "(with the diff when --baseline is given)")  # fmt: skip


def ncu_report(args) -> None:
    import workbench
    from workbench.analysis.ncu_text import diff_text

    report = workbench.load_ncu(args.report)
    baseline = workbench.load_ncu(args.baseline) if args.baseline else None
    if args.select:
        report = report.select(args.select)
        baseline = baseline.select(args.select) if baseline is not None else None
    print(report.text())
    if baseline is not None:
        print("\n" + diff_text(report, baseline))
    if args.html:
        print(f"report: {report.to_html(args.html, baseline)}")


def add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="the seed report's tables from artifacts, as an HTML page and/or Markdown",
        description=(
            "Rebuild every table of the seed report that the ARTIFACTS support (run "
            "directories, .ncu-rep files, or folders of them; default: raw and ncu, those of "
            "them that are here): --html writes one self-contained page with figures and each "
            "artifact's metadata, --markdown the tables as GitHub Markdown with the artifacts "
            "each came from (docs/results.md is `workbench report raw ncu --markdown "
            "docs/results.md`). A table whose artifacts are absent says so and names the "
            "command that makes them. Runs timed on a CPU stay out of the GPU tables "
            "(--include-cpu gives them a section of their own). Works without a GPU."
        ),
        epilog=(
            "Every artifact that could not be read is named on stderr with the reason. Exit "
            "status: 0 when the pages are written (damaged artifacts met while scanning a "
            "folder are warnings); 1 when they are written but an artifact named on the "
            "command line could not be read (or a folder named holds none), or none of the "
            "artifacts met could be; 2 for "
            "usage errors (no --html or --markdown, a named path that does not exist, neither "
            "raw nor ncu here)."
        ),
    )
    p.add_argument("artifacts", nargs="*", help="run directories, reports or folders")
    p.add_argument("--html", metavar="PATH", help="write the HTML page here")
    p.add_argument("--markdown", metavar="PATH", help="write the Markdown tables here")
    p.add_argument("--include-cpu", action="store_true", help="show runs timed on a CPU (the "
                   "quick start's tiny profile) in a section of their own")  # fmt: skip


def _report_paths(given: list[str]) -> list[str]:
    """The paths to report: those given (each must exist: `collect` says so), else the
    default folders that are here, with a note for each that is not."""
    from workbench.report.seed_tables import DEFAULT_PATHS, default_paths

    if given:
        return given
    here, missing = default_paths()
    if not here:
        raise WorkbenchError(
            f"neither {' nor '.join(DEFAULT_PATHS)} is in {Path.cwd()}: run this where they "
            "are, or give the artifacts (run directories, .ncu-rep files or folders of them)"
        )
    for path in missing:
        print(f"workbench report: no {path} here; reporting {' and '.join(here)}",
              file=sys.stderr)  # fmt: skip
    return here


def report(args) -> int:
    """Write the pages, say on stderr what was skipped (each unread artifact, the CPU runs),
    and return the exit status the epilog of `add_report` documents."""
    if not (args.html or args.markdown):
        raise WorkbenchError("report: say where to write it: --html PATH, --markdown PATH or both")
    from workbench.analysis.collection import collect, split_cpu
    from workbench.report.document import cpu_skipped

    paths = _report_paths(args.artifacts)
    found = collect(paths)  # read once, written as many ways as asked
    for path, why in found.unread:
        print(f"workbench report: skipped {path}: {why}", file=sys.stderr)
    cpu = split_cpu(found)[1]
    if cpu.items and not args.include_cpu:
        print(f"workbench report: {cpu_skipped(cpu)}", file=sys.stderr)
    if args.html:
        from workbench.report.seed_report import build

        print(f"report: {build(found, args.include_cpu).write(args.html)}")
    if args.markdown:
        from workbench.report.markdown import write_markdown

        page = write_markdown(found, args.markdown, paths, include_cpu=args.include_cpu)
        print(f"markdown: {page}")
    return _report_status(found, args.artifacts)


def _report_status(found: Collection, named: list[str]) -> int:
    """1 when an artifact `named` on the command line could not be read (or a named folder
    holds none), or when none of the artifacts met could be; else 0. Says why on stderr."""
    failed = {Path(p) for p in named} & {path for path, _ in found.unread}
    for given in map(Path, named):
        met = [item.path for item in found.items] + [path for path, _ in found.unread]
        if not any(path == given or given in path.parents for path in met):
            print(f"workbench report: skipped {given}: holds no run directory or Nsight "
                  "Compute report", file=sys.stderr)  # fmt: skip
            failed.add(given)
    if failed:
        print(f"workbench report: {len(failed)} of the paths named could not be read",
              file=sys.stderr)  # fmt: skip
        return 1
    if found.unread and not found.items:
        print(f"workbench report: none of the {len(found.unread)} artifacts met could be read",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def add_export_notebook(sub) -> None:
    p = sub.add_parser(
        "export-notebook", help="a notebook as an HTML page that opens offline (no CDN)"
    )
    p.add_argument("notebook")
    p.add_argument("--html", metavar="PATH", required=True, help="where to write the page")
    p.add_argument("--execute", action="store_true", help="run the notebook first")
    p.add_argument("--timeout", type=int, default=600, help="seconds per cell with --execute")


def export_notebook(args) -> None:
    from workbench.report.notebook_export import CODE_ONLY, export_notebook

    page = export_notebook(args.notebook, args.html, run=args.execute, timeout_s=args.timeout)
    print(f"notebook: {page}")
    if not args.execute and CODE_ONLY in page.read_text():
        print("workbench export-notebook: the page shows code without results; add --execute "
              "to run the notebook first", file=sys.stderr)  # fmt: skip
