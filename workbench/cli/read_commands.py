"""The commands that read artifacts on any machine: show, trace, ncu-report, report and
export-notebook."""

from __future__ import annotations

import sys

from workbench.artifacts import run_kind
from workbench.errors import WorkbenchError


def add_show(sub) -> None:
    p = sub.add_parser("show", help="print the tables of a saved run (works without a GPU)")
    p.add_argument("runs", nargs="+", help="run directories under raw/; several are compared")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")


def show(args) -> None:
    import workbench

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
                   "in the report and the baseline (e.g. gate_up)")  # fmt: skip
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
            "directories, .ncu-rep files, or folders of them; default: raw and ncu): --html "
            "writes one self-contained page with figures and each artifact's metadata, "
            "--markdown the tables as GitHub Markdown with the artifacts each came from "
            "(docs/results.md is `workbench report raw ncu --markdown docs/results.md`). A "
            "table whose artifacts are absent says so and names the command that makes them. "
            "Works without a GPU."
        ),
    )
    p.add_argument("artifacts", nargs="*", help="run directories, reports or folders")
    p.add_argument("--html", metavar="PATH", help="write the HTML page here")
    p.add_argument("--markdown", metavar="PATH", help="write the Markdown tables here")


def report(args) -> None:
    if not (args.html or args.markdown):
        raise WorkbenchError("report: say where to write it: --html PATH, --markdown PATH or both")
    from workbench.analysis.collection import collect
    from workbench.report.seed_tables import DEFAULT_PATHS

    paths = args.artifacts or list(DEFAULT_PATHS)
    found = collect(paths)  # read once, written as many ways as asked
    if args.html:
        from workbench.report.seed_report import build

        print(f"report: {build(found).write(args.html)}")
    if args.markdown:
        from workbench.report.markdown import write_markdown

        print(f"markdown: {write_markdown(found, args.markdown, paths)}")


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
