"""The `workbench` command: profile, show a run, read an external trace.

Errors the user can fix (bad input, a damaged artifact, no GPU) print one clear line and exit
with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from workbench.errors import WorkbenchError


def _chunk(value: str) -> int | None:
    return None if value.lower() in {"none", "0"} else int(value)


def _add_profile(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="run the synthetic model under torch.profiler; print and save category tables",
        description=(
            "Prefill PROMPT_TOKENS in chunks, then decode DECODE_TOKENS steps, under "
            "torch.profiler. Prints prefill and per-decode-step kernel time by category, writes "
            "OUT/<run-id>/ and, with --html, a self-contained report. On a GPU the default preset "
            "is dsv4-flash-tp2; without one it is tiny (CPU op times, said in the output)."
        ),
    )
    p.add_argument("--prompt-tokens", type=int, default=33863, help="prompt length (33863)")
    p.add_argument("--decode-tokens", type=int, default=64, help="decode steps (64)")
    p.add_argument("--preset", help="model preset (default: dsv4-flash-tp2 on a GPU, else tiny)")
    p.add_argument("--moe", default="stock", help="MoE kernel variant (stock)")
    p.add_argument("--dense", default="bf16", help="dense GEMM variant: bf16, w8a16, w8a8, hybrid")
    p.add_argument(
        "--hybrid-m", type=int, help="--dense hybrid: largest M for W8A16 ($DENSE_HYBRID_M or 128)"
    )
    p.add_argument("--attention", default="torch", help="sparse attention: torch or triton")
    p.add_argument("--routing", default="uniform", help="uniform or skewed (uniform)")
    p.add_argument("--streams", type=int, default=1, help="tokens per decode step (1)")
    p.add_argument(
        "--prefill-chunk", type=_chunk, default=4096, help="prefill chunk; 'none' for one pass"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="cuda or cpu (default: cuda when a GPU is visible)")
    p.add_argument(
        "--tp", type=int, help="tensor parallelism: N ranks through torch.distributed (or torchrun)"
    )
    p.add_argument("--out", default="raw", help="artifact root (raw)")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay decode steps as CUDA graphs (default: on a GPU)",
    )
    p.add_argument("--keep-trace", action="store_true", help="also keep the gzipped trace")


def _add_show(sub) -> None:
    p = sub.add_parser("show", help="print the tables of a saved run (works without a GPU)")
    p.add_argument("runs", nargs="+", help="run directories under raw/; several are compared")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")


def _add_trace(sub) -> None:
    p = sub.add_parser(
        "trace", help="attribute an external torch.profiler trace (.json or .json.gz)"
    )
    p.add_argument("path")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")


def _param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--param {text!r}: write it as key=value")
    try:
        return key, int(value)
    except ValueError:
        return key, value


def _add_ncu(sub) -> None:
    p = sub.add_parser(
        "ncu",
        help="capture Nsight Compute (--set full) reports of chosen launches",
        description=(
            "Relaunch a small target under `ncu --set full` and profile one launch per token "
            "count (after warm-up): KERNEL 'moe' with VARIANT a MoE scheduler at the TP2-rank "
            "shape, 'dense' with VARIANT a dense backend (bf16, w8a16, w8a8, hybrid; tokens are "
            "M, --param projection=o_b picks the layer's GEMM), or 'model-decode-step' for "
            "every kernel of one decode step (tokens are then the streams). Writes "
            "OUT/<name>.ncu-rep, .json and .summary.txt."
        ),
    )
    p.add_argument("kernel", help="moe, dense or model-decode-step")
    p.add_argument("variant", help="the variant, e.g. stock, multirow, flat; w8a16, w8a8")
    p.add_argument("--tokens", type=int, nargs="+", default=[6, 4096])
    p.add_argument("--param", type=_param, action="append", default=[], help="key=value")
    p.add_argument("--out", default="ncu")
    p.add_argument("--name", help="report name (default: from kernel, variant and tokens)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds before ncu and its target are stopped (900)")  # fmt: skip
    p.add_argument("--set", dest="ncu_set", help="ncu section set: full (default), detailed, basic")
    p.add_argument("--section", dest="sections", action="append", default=[],
                   help="collect this ncu section (or regex:...) instead of a set")  # fmt: skip


def _add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark kernels against their physical floor and peers (GPU)",
        description=(
            "bench moe: every MoE scheduler x weight format, and the torch._grouped_mm and "
            "per-expert cuBLAS peers, at the TP2-rank shape. bench dense: every dense backend "
            "(bf16, w8a16, w8a8, hybrid) over one layer's dense projections at each M (--tokens), "
            "and the seed's decode/prefill A/B table. bench attention: the indexer and sparse "
            "attention, torch and triton, at decode (2K, 46K context) and a 4096-token prefill "
            "chunk. Each row is checked against the reference before it is timed, with the copy "
            "bandwidth and cuBLAS rates measured in the same run. Writes "
            "OUT/bench-KERNEL-<date>/bench.csv and prints it."
        ),
    )
    p.add_argument("kernel", choices=["moe", "dense", "attention"])
    p.add_argument("--tokens", type=int, nargs="+", default=None, help="token counts (dense: M)")
    p.add_argument("--routing", nargs="+", default=["uniform", "skewed"])
    p.add_argument("--variants", nargs="+", default=None)
    p.add_argument("--formats", nargs="+", default=None)
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--block", type=int, default=32, help="dense: FP8 block edge (32)")
    p.add_argument("--hybrid-m", type=int, help="dense: largest M of hybrid's W8A16 path")
    p.add_argument("--no-ab", action="store_true", help="dense: skip the seed's A/B table")
    p.add_argument("--out", default="raw")


def _bench_moe(args):
    from workbench.capture import bench_moe as bench

    return bench.bench_moe(
        tokens=args.tokens or bench.TOKENS,
        routings=args.routing,
        variants=args.variants or bench.SCHEDULERS,
        formats=args.formats or bench.FORMATS,
        peers=not args.no_peers,
        out=args.out,
    )


def _bench_dense(args):
    from workbench.capture import bench_dense as bench

    return bench.bench_dense(
        ms=args.tokens or bench.M_SWEEP,
        variants=args.variants or bench.BACKENDS,
        ab=not args.no_ab,
        block=args.block,
        hybrid_m=args.hybrid_m,
        out=args.out,
    )


def _bench_attention(args):
    from workbench.capture import bench_attention as bench

    return bench.bench_attention(variants=args.variants or bench.VARIANTS, out=args.out)


def _bench(args) -> None:
    run = {"moe": _bench_moe, "dense": _bench_dense, "attention": _bench_attention}
    table = run[args.kernel](args)
    print(table.round(3).to_string(index=False))
    print(f"\nwritten to {table.attrs['path']}")


def _value(text: str) -> object:
    try:
        return int(text)
    except ValueError:
        return text


def _add_sweep(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="time a kernel across values of one parameter, each in an isolated worker",
        description=(
            "Every VALUE of PARAM x every token count runs in its own worker process under a "
            "watchdog; failures (wrong, spills, oom, compile-error, crash, timeout) are rows. "
            "Rows go to OUT/<run-id>/rows.jsonl as they finish; --run-dir resumes a sweep."
        ),
    )
    p.add_argument("kernel", choices=["moe"])
    p.add_argument("param", help="the parameter to vary, e.g. num_stages, groups, rows")
    p.add_argument("values", nargs="+", type=_value)
    p.add_argument("--tokens", type=int, nargs="+", default=[6, 4096])
    p.add_argument("--param", dest="fixed", type=_param, action="append", default=[],
                   help="a fixed setting key=value (variant=stock, fmt=fp8, ...)")  # fmt: skip
    p.add_argument("--baseline", type=_value, help="value to compare against (did not help)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    p.add_argument("--out", default="raw")
    p.add_argument("--run-dir", help="resume into this run directory")


def _add_ab(sub) -> None:
    p = sub.add_parser(
        "ab", help="A/B two settings of one workload: ratio b/a with its 95%% interval per size"
    )
    p.add_argument(
        "kernel",
        choices=["moe", "profile"],
        help="moe: kernel settings; profile: whole profile() settings (dense=...)",
    )
    p.add_argument("--a", type=_param, action="append", required=True, help="key=value of A")
    p.add_argument("--b", type=_param, action="append", required=True, help="key=value of B")
    p.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=[6, 4096],
        help="token counts (profile: prompt lengths)",
    )
    p.add_argument("--param", dest="fixed", type=_param, action="append", default=[])
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default="raw")
    p.add_argument("--run-dir")


def _sweep(args) -> None:
    import workbench

    result = workbench.sweep(
        args.kernel, args.param, args.values, args.tokens, out=args.out,
        timeout_s=args.timeout, run_dir=args.run_dir, **dict(args.fixed),
    )  # fmt: skip
    print(result.table().round(4).to_string(index=False))
    if args.baseline is not None:
        print("\nDid not help?\n" + result.did_not_help(args.baseline).to_string(index=False))


def _ab(args) -> None:
    import workbench

    result = workbench.ab(
        dict(args.a), dict(args.b), args.tokens, kernel=args.kernel, out=args.out,
        timeout_s=args.timeout, run_dir=args.run_dir, **dict(args.fixed),
    )  # fmt: skip
    print(result.table().round(4).to_string(index=False))


def _add_ncu_report(sub) -> None:
    p = sub.add_parser("ncu-report", help="print the tables of any .ncu-rep (no GPU needed)")
    p.add_argument("report")
    p.add_argument("--baseline", help="another report to diff against")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")


def _ncu(args) -> None:
    import workbench

    report = workbench.ncu(args.kernel, args.variant, args.tokens, args.out, name=args.name,
                           timeout_s=args.timeout, ncu_set=args.ncu_set, sections=args.sections,
                           **dict(args.param))  # fmt: skip
    print(report.text())


def _ncu_report(args) -> None:
    import workbench

    report = workbench.load_ncu(args.report)
    print(report.text())
    if args.baseline:
        print(
            "\nChange from baseline\n" + report.diff(workbench.load_ncu(args.baseline)).to_string()
        )
    if args.html:
        print(f"report: {report.to_html(args.html)}")


def _profile(args) -> None:
    import workbench

    result = workbench.profile(
        args.prompt_tokens,
        args.decode_tokens,
        preset=args.preset,
        moe=args.moe,
        dense=args.dense,
        attention=args.attention,
        routing=args.routing,
        streams=args.streams,
        prefill_chunk=args.prefill_chunk,
        seed=args.seed,
        device=args.device,
        tp=args.tp,
        out=args.out,
        progress=not args.no_progress,
        cuda_graphs=args.cuda_graphs,
        keep_trace=args.keep_trace,
        hybrid_m=args.hybrid_m,
    )
    if result is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    print(result.text())
    print(f"\nwall time {result.meta['wall_s']:.1f} s; artifacts in {result.path}")
    if args.html:
        print(f"report: {result.to_html(args.html)}")


def _show(args) -> None:
    import workbench

    runs = [workbench.load(path) for path in args.runs]
    if len(runs) == 1:
        print(runs[0].text())
        page = runs[0]
    else:
        page = runs[0].compare(*runs[1:])
        print("Prefill (ms)\n" + page.prefill().round(2).to_string())
        print("\nDecode, per step (mean ms)\n" + page.decode().round(3).to_string())
    if args.html:
        print(f"report: {page.to_html(args.html)}")


def _trace(args) -> None:
    import workbench

    result = workbench.load_trace(args.path)
    print(result.text())
    print("\nHow categories were decided (kernel counts)\n" + result.attribution().to_string())
    if args.html:
        print(f"report: {result.to_html(args.html)}")


def _add_report(sub) -> None:
    p = sub.add_parser(
        "report",
        help="the seed report's tables from artifacts, on one self-contained HTML page",
        description=(
            "Rebuild every table of the seed report that the ARTIFACTS support (run "
            "directories, .ncu-rep files, or folders of them; default: raw and ncu), with "
            "figures, a contents list and each artifact's metadata. A table whose artifacts "
            "are absent says so and names the command that makes them. Works without a GPU."
        ),
    )
    p.add_argument("artifacts", nargs="*", help="run directories, reports or folders")
    p.add_argument("--html", metavar="PATH", required=True, help="where to write the page")


def _report(args) -> None:
    from workbench.report.seed_report import write_report

    print(f"report: {write_report(args.artifacts, args.html)}")


def _add_export_notebook(sub) -> None:
    p = sub.add_parser(
        "export-notebook", help="a notebook as an HTML page that opens offline (no CDN)"
    )
    p.add_argument("notebook")
    p.add_argument("--html", metavar="PATH", required=True, help="where to write the page")
    p.add_argument("--execute", action="store_true", help="run the notebook first")
    p.add_argument("--timeout", type=int, default=600, help="seconds per cell with --execute")


def _export_notebook(args) -> None:
    from workbench.report.notebook_export import export_notebook

    page = export_notebook(args.notebook, args.html, run=args.execute, timeout_s=args.timeout)
    print(f"notebook: {page}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Profile MoE and dense GEMM kernels: where the time goes, and why.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_profile(sub)
    _add_show(sub)
    _add_trace(sub)
    _add_ncu(sub)
    _add_ncu_report(sub)
    _add_bench(sub)
    _add_sweep(sub)
    _add_ab(sub)
    _add_report(sub)
    _add_export_notebook(sub)
    return parser


COMMANDS = {
    "profile": _profile,
    "show": _show,
    "trace": _trace,
    "ncu": _ncu,
    "ncu-report": _ncu_report,
    "bench": _bench,
    "sweep": _sweep,
    "ab": _ab,
    "report": _report,
    "export-notebook": _export_notebook,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except WorkbenchError as err:
        print(f"workbench: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
