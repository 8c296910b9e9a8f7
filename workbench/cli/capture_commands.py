"""The commands that capture on a GPU (or the CPU stand-in): profile, ncu, bench, sweep, ab.

Each command has a parser builder (`add_<command>`) and a runner taking the parsed arguments;
the heavy modules are imported inside the runners, so `workbench --help` starts quickly.
"""

from __future__ import annotations

import argparse
import sys

from workbench.cli.values import (
    kernel_setting,
    profile_ab_setting,
    profile_setting,
    sweep_value,
)
from workbench.workloads.profile_params import describe


def add_profile(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="run the synthetic model under torch.profiler; print and save category tables",
        description=(
            "Prefill PROMPT_TOKENS in chunks, then decode DECODE_TOKENS steps, under "
            "torch.profiler. Prints prefill and per-decode-step kernel time by category, writes "
            "OUT/<run-id>/ and, with --html, a self-contained report. On a GPU the default preset "
            "is dsv4-flash-tp2; without one it is tiny (CPU op times, said in the output).\n\n"
            "Profile parameters (--param NAME=VALUE ...; NAME=default):\n" + describe()
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompt-tokens", type=int, default=33863, help="prompt length (33863)")
    p.add_argument("--decode-tokens", type=int, default=64, help="decode steps (64)")
    p.add_argument(
        "--param",
        dest="settings",
        type=profile_setting,
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=VALUE",
        help="profile parameters (see above) and shape overrides (layers=2)",
    )
    p.add_argument("--out", default="raw", help="artifact root (raw)")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--keep-trace", action="store_true", help="also keep the gzipped trace")


def profile(args) -> None:
    import workbench

    result = workbench.profile(
        args.prompt_tokens, args.decode_tokens, out=args.out, progress=not args.no_progress,
        keep_trace=args.keep_trace, **dict(args.settings),
    )  # fmt: skip
    if result is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    from workbench.analysis.phases import bytecode_hint, phases_line

    print(result.text())
    phases = phases_line(result.meta)
    if phases:
        print(f"\n{phases}")
    hint = bytecode_hint(result.meta, compile_torch_command())
    if hint:  # torch compiled from source: say how to cache it
        print(hint)
    print(f"\nwall time {result.meta['wall_s']:.1f} s; artifacts in {result.path}")
    if args.html:
        print(f"report: {result.to_html(args.html)}")


def compile_torch_command() -> str:
    """The shell command that compiles the bytecode of the folder holding torch, with the
    Python running now: the one that ran the profile."""
    import shlex
    from pathlib import Path

    import torch

    packages = Path(torch.__file__).resolve().parents[1]
    return f"{shlex.quote(sys.executable)} -m compileall -q -j 0 {shlex.quote(str(packages))}"


def add_ncu(sub) -> None:
    p = sub.add_parser(
        "ncu",
        help="capture Nsight Compute (--set full) reports of chosen launches",
        description=(
            "Relaunch a small target under `ncu --set full` and profile one launch per token "
            "count (after warm-up): KERNEL 'moe' with VARIANT a MoE scheduler at the TP2-rank "
            "shape, 'dense' with VARIANT a dense backend (bf16, w8a16, w8a8, hybrid; tokens are "
            "M, --param projection=o_b picks the layer's GEMM), 'attention' with VARIANT an "
            "attention variant (triton, fp8; tokens are queries ending at --param "
            "context=46000, --param part=indexer|select|indexer_select|attend), or "
            "'model-decode-step' for every kernel of one decode step (tokens are then the "
            "streams). For 'dense' and 'moe', VARIANT may name a peer (dense: cublas_fp8, "
            "deepgemm, humming, humming_w4a16; moe: deepgemm, humming), profiled on the "
            "weights bench gives it; diff its report against the workbench's kernel with "
            "`workbench ncu-report OURS --baseline PEER --select REGEX`. Writes "
            "OUT/<name>.ncu-rep, .json and .summary.txt."
        ),
    )
    p.add_argument("kernel", help="moe, dense, attention or model-decode-step")
    p.add_argument("variant", help="the variant, e.g. stock, multirow, flat; w8a16, w8a8; "
                   "or a peer, e.g. deepgemm")  # fmt: skip
    p.add_argument("--tokens", type=int, nargs="+", default=[6, 4096])
    p.add_argument("--param", type=kernel_setting, nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE", help="kernel settings (fmt=fp8 rows=2 ...)")  # fmt: skip
    p.add_argument("--out", default="ncu")
    p.add_argument("--name", help="report name (default: from kernel, variant and tokens)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds before ncu and its target are stopped (900)")  # fmt: skip
    p.add_argument("--set", dest="ncu_set", help="ncu section set: full (default), detailed, basic")
    p.add_argument("--section", dest="sections", action="append", default=[],
                   help="collect this ncu section (or regex:...) instead of a set")  # fmt: skip
    p.add_argument("--code", help="profile another version of the kernels package: a git "
                   "revision, a folder holding one, or worktree (as ab's code= arms); the "
                   "report's name ends in -code<commit>")  # fmt: skip


def ncu(args) -> None:
    import workbench

    report = workbench.ncu(args.kernel, args.variant, args.tokens, args.out, name=args.name,
                           timeout_s=args.timeout, ncu_set=args.ncu_set, sections=args.sections,
                           code=args.code, **dict(args.param))  # fmt: skip
    print(report.text())


def add_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark kernels against their physical floor and peers (GPU)",
        description=(
            "bench moe: every MoE scheduler x weight format, the torch._grouped_mm and "
            "per-expert cuBLAS baselines and the MoE peers (deepgemm, humming, ...: --peers), at "
            "the TP2-rank shape. bench dense: every dense backend "
            "(bf16, w8a16, w8a8, hybrid) and dense peer (cublas_fp8, humming, ...: --peers) over "
            "one layer's dense projections at each M (--tokens), and the seed's decode/prefill "
            "A/B table of the backends. bench attention: the indexer, the top-k select and "
            "the sparse attention, torch, triton and fp8, with DeepGEMM's FP8 indexer as a peer, "
            "at decode (2K, 46K context) and a 4096-token prefill chunk. Each row is checked "
            "against the reference before it is timed, with the copy "
            "bandwidth and cuBLAS rates measured in the same run. Writes "
            "OUT/bench-KERNEL-<date>/bench.csv (with every timed row's samples) and prints it."
        ),
    )
    p.add_argument("kernel", choices=["moe", "dense", "attention"])
    p.add_argument("--tokens", type=int, nargs="+", default=None, help="token counts (dense: M)")
    p.add_argument("--routing", nargs="+", default=["uniform", "skewed"])
    p.add_argument("--variants", nargs="+", default=None)
    p.add_argument("--formats", nargs="+", default=None)
    p.add_argument("--no-peers", action="store_true", help="run no peers")
    p.add_argument("--peers", nargs="+", default=None,
                   help="peers to run (default: all of the workload)")  # fmt: skip
    p.add_argument("--block", type=int, default=128,
                   help="dense: FP8 block edge (DeepSeek's 128; 32 too)")  # fmt: skip
    p.add_argument("--hybrid-m", type=int, help="dense: largest M of hybrid's W8A16 path")
    p.add_argument("--no-ab", action="store_true", help="dense: skip the seed's A/B table")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--out", default="raw")


def _bench_moe(args):
    from workbench.capture import bench_moe as bench

    return bench.bench_moe(
        tokens=args.tokens or bench.TOKENS,
        routings=args.routing,
        variants=args.variants or bench.SCHEDULERS,
        formats=args.formats or bench.FORMATS,
        peers=[] if args.no_peers else args.peers,
        out=args.out,
        progress=not args.no_progress,
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
        peers=[] if args.no_peers else args.peers,
        progress=not args.no_progress,
    )


def _bench_attention(args):
    from workbench.capture import bench_attention as bench

    peers = [] if args.no_peers else (args.peers or list(bench.PEERS))
    return bench.bench_attention(variants=args.variants or bench.VARIANTS, peers=peers,
                                 out=args.out, progress=not args.no_progress)  # fmt: skip


def bench(args) -> None:
    run = {"moe": _bench_moe, "dense": _bench_dense, "attention": _bench_attention}
    table = run[args.kernel](args)
    print(table.round(3).to_string(index=False))
    if "gpu_state" in table.attrs:
        print(f"\nthe GPU while the rows were timed: {table.attrs['gpu_state']}")
    print(f"\nwritten to {table.attrs['path']}")


def add_sweep(sub) -> None:
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
    p.add_argument("values", nargs="+", type=sweep_value)
    p.add_argument("--tokens", type=int, nargs="+", default=[6, 4096])
    p.add_argument("--param", dest="fixed", type=kernel_setting, nargs="+", action="extend",
                   default=[], metavar="KEY=VALUE",
                   help="fixed settings (variant=stock fmt=fp8 ...)")  # fmt: skip
    p.add_argument("--baseline", type=sweep_value, help="value to compare against (did not help)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    p.add_argument("--out", default="raw")
    p.add_argument("--run-dir", help="resume into this run directory")


def sweep(args) -> int:
    """Exit status 1 when every configuration failed (said on stderr), else 0."""
    import warnings

    import workbench
    from workbench.capture.experiments import AllFailedWarning, all_failed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AllFailedWarning)  # said below, in one line
        result = workbench.sweep(
            args.kernel, args.param, args.values, args.tokens, out=args.out,
            timeout_s=args.timeout, run_dir=args.run_dir, **dict(args.fixed),
        )  # fmt: skip
    print(result.table().round(4).to_string(index=False))
    failed = all_failed(result.rows)
    if failed:
        print(f"workbench: {failed}", file=sys.stderr)
        return 1
    if args.baseline is not None:
        print("\nDid not help?\n" + result.did_not_help(args.baseline).to_string(index=False))
    return 0


def add_ab(sub) -> None:
    p = sub.add_parser(
        "ab", help="A/B two settings of one workload: ratio b/a with its 95%% interval per size"
    )
    p.add_argument(
        "kernel",
        choices=["moe", "dense", "profile"],
        help="moe: kernel settings; dense: a dense backend's layer (variant=w8a16 ..., "
        "tokens are its rows); profile: whole profile() settings (dense=...)",
    )
    p.add_argument("--a", nargs="+", action="extend", required=True, metavar="KEY=VALUE",
                   help="the settings of arm A; code=REF runs the kernels package of git "
                   "revision REF (or of a folder holding one; worktree: the files as they "
                   "are, the default)")  # fmt: skip
    p.add_argument("--b", nargs="+", action="extend", required=True, metavar="KEY=VALUE",
                   help="the settings of arm B (code= as for --a)")  # fmt: skip
    p.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=[6, 4096],
        help="token counts (profile: prompt lengths)",
    )
    p.add_argument("--param", dest="fixed", nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE", help="settings both arms share")  # fmt: skip
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--runs", type=int, default=None,
                   help="workers (profiles) per arm at each size, in the order a b b a "
                   "(default: 2 for profile, 1 for moe and dense)")  # fmt: skip
    p.add_argument("--out", default="raw")
    p.add_argument("--run-dir")


def ab(args) -> int:
    """Exit status 1 when every configuration failed (said on stderr), else 0."""
    import warnings

    import workbench
    from workbench.capture.experiments import AllFailedWarning, all_failed

    read = profile_ab_setting if args.kernel == "profile" else kernel_setting  # typed values
    a, b, fixed = ({k: v for k, v in map(read, texts)} for texts in (args.a, args.b, args.fixed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AllFailedWarning)  # said below, in one line
        result = workbench.ab(
            a, b, args.tokens, kernel=args.kernel, out=args.out, timeout_s=args.timeout,
            run_dir=args.run_dir, **({} if args.runs is None else {"runs": args.runs}), **fixed,
        )  # fmt: skip
    print(result.table().round(4).to_string(index=False))
    where = result.where()
    if not where.empty:
        parts = ("the mean step by category, its gaps and its total" if "phase" in where
                 else "each kernel's time per call (dense: per layer)")  # fmt: skip
        print(f"\nWhere the change went: {parts}")
        print(where.round(4).to_string(index=False))
    failed = all_failed(result.rows)
    if failed:
        print(f"workbench: {failed}", file=sys.stderr)
    return 1 if failed else 0
