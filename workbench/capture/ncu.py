"""`capture()`: profile kernel launches under `ncu --set full` and write `ncu/<name>.*`.

ncu 2025.3 cannot attach to a running process, so a capture relaunches the target entry point
(`workbench.capture.ncu_target`) under ncu in a subprocess. The command is built as an argument
list (as nsight-python does), never as a shell string:

    ncu --set full --import-source yes --clock-control none
        --nvtx --nvtx-include wb:moe:stock:T=6/ --nvtx-include wb:moe:stock:T=4096/
        --target-processes all -f -o <out>/<name> python -m workbench.capture.ncu_target ...

`--clock-control none` keeps the GPU at the clocks it serves at instead of ncu's base clock;
`--import-source yes` embeds the source files, so Triton samples map to Python lines anywhere.
One `--nvtx-include` per token count selects exactly the marked launches (see ncu_target).

ncu writes into a temporary folder beside the destination; the report, `<name>.json` (what
ran, the command, ncu's version and the environment) and `<name>.summary.txt` (the analysis
tables) are renamed into place only once the report has loaded, so a failed or interrupted
capture never damages an earlier one. Every failure a user can fix raises WorkbenchError.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from workbench.analysis.ncu import load_ncu
from workbench.artifacts import SCHEMA_VERSION, write_json_atomic
from workbench.capture.code_versions import (
    KERNELS_FROM_ENV,
    code_version,
    export_kernels,
    package_environment,
)
from workbench.capture.debris import owned_prefix
from workbench.capture.environment import REPO, describe
from workbench.capture.ncu_args import DECODE_STEP, DONE, PREFIX, TargetArgs, nvtx_filter
from workbench.capture.ncu_peers import peer_record
from workbench.errors import ArtifactError, WorkbenchError
from workbench.peers import peer_of

TARGET_MODULE = "workbench.capture.ncu_target"
NCU_OPTIONS = ("--import-source", "yes", "--clock-control", "none")
# ncu's section sets, lightest first; `full` (the default) holds what stalls() and hotspots()
# read. A whole step is ~100 mostly tiny kernels: a lighter set, or explicit `--section`s, keeps
# its report small enough to commit (see ncu/README.md).
NCU_SETS = ("basic", "detailed", "full")


def collection_options(ncu_set: str | None = None, sections: Sequence[str] = ()) -> list[str]:
    """ncu's options for what to collect: `--set NCU_SET` (full when neither is given), or one
    `--section` per entry of `sections` (ncu's identifiers, or `regex:...`) instead of a set."""
    if sections and ncu_set is not None:
        raise WorkbenchError(
            "give ncu_set or sections, not both: ncu collects the sections instead of the set."
        )
    if sections:
        return [arg for section in sections for arg in ("--section", section)]
    ncu_set = ncu_set or "full"
    if ncu_set not in NCU_SETS:
        raise WorkbenchError(
            f"ncu_set '{ncu_set}' is not one of ncu's sets {', '.join(NCU_SETS)}: 'full' for "
            "stalls and source hot spots, a lighter one for a smaller report of many kernels."
        )
    return ["--set", ncu_set]


# The workbench's Triton kernels (`_counts_kernel`, `_flat_gate_up_kernel`, ...). A MoE range also
# holds the launch's torch glue (zeros, casts, a reduction): profiling those too made a report of
# 6 tokens 28 MB, and they are not what a MoE report is about. A MoE peer's range is profiled
# whole: its GEMMs have names of their own, and its glue is part of what its row times.
MOE_KERNELS = "regex:^(_|silu_reduce)"
NCU_HOMES = "/usr/local/cuda/bin/ncu or /opt/nvidia/nsight-compute/<version>/ncu"
TAIL_LINES = 40


def find_ncu() -> str:
    """The ncu on PATH; the machines have it in CUDA's bin folder, not always on PATH."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise WorkbenchError(
            f"ncu (the Nsight Compute CLI) is not on PATH; it usually lives at {NCU_HOMES}. "
            "Add its folder to PATH, e.g. export PATH=/usr/local/cuda/bin:$PATH."
        )
    return ncu


def recorded_command(command: Sequence[str], kept: Path) -> list[str]:
    """`command` as a capture's metadata keeps it: the report under the name it is kept by
    (relative to the working folder where it lies inside it), not the temporary folder ncu
    wrote it in, and programs by their names, so an artifact names no folder of the machine
    that captured it."""
    recorded = list(command)
    try:
        kept = kept.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        kept = Path(kept.name)
    recorded[recorded.index("-o") + 1] = str(kept)
    return [Path(arg).name if Path(arg).is_absolute() else arg for arg in recorded]


def ncu_command(
    ncu: str,
    output: Path,
    target: TargetArgs,
    python: str = sys.executable,
    collect: Sequence[str] = ("--set", "full"),
) -> list[str]:
    """The full ncu command line that profiles `target`'s marked launches into `output`.ncu-rep."""
    filters = [
        arg for name in target.range_names() for arg in ("--nvtx-include", nvtx_filter(name))
    ]
    if target.kernel == "moe" and peer_of("moe", target.variant) is None:
        filters += ["--kernel-name", MOE_KERNELS]
    return [
        ncu,
        *collect,
        *NCU_OPTIONS,
        "--nvtx",
        *filters,
        "--target-processes",
        "all",
        "-f",
        "-o",
        str(output),
        python,
        "-m",
        TARGET_MODULE,
        *target.to_argv(),
    ]


def default_name(target: TargetArgs) -> str:
    """e.g. `moe-stock-T6-4096`, then parameters, routing and seed when not the defaults."""
    parts = [target.kernel, target.variant, "T" + "-".join(map(str, target.tokens))]
    parts += [f"{key}{value}" for key, value in sorted(target.params.items())]
    if target.routing != "uniform":
        parts.append(target.routing)
    if target.seed:
        parts.append(f"seed{target.seed}")
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", "-".join(parts))


def _tail(output: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(output.rstrip().splitlines()[-lines:])


def _require_gpu() -> None:
    if not torch.cuda.is_available():
        raise WorkbenchError(
            "no CUDA GPU is visible (torch.cuda.is_available() is False): ncu captures run on "
            "the GPU machine. Existing reports load anywhere with workbench.load_ncu(path)."
        )


def _run(
    command: Sequence[str], timeout_s: float, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ncu in its own process group, with `env` over this process's environment; past
    `timeout_s`, kill ncu and the target it started."""
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
    except FileNotFoundError:
        raise WorkbenchError(
            f"could not start {command[0]}; install Nsight Compute (usually {NCU_HOMES})."
        ) from None
    previous = _raise_on_sigterm()
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise WorkbenchError(
            f"ncu ran past timeout_s={timeout_s:g} s and was stopped. --set full replays every "
            "kernel dozens of times: raise timeout_s, or profile fewer token counts or layers. "
            f"Last lines of its output:\n{_tail(output or '')}"
        ) from None
    except BaseException:  # Ctrl-C, or a supervisor's SIGTERM: ncu and its target go too
        os.killpg(process.pid, signal.SIGKILL)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return process.returncode, output


def _raise_on_sigterm():
    """Make SIGTERM raise SystemExit while ncu runs (main thread only), so the handler above
    kills ncu's process group instead of leaving it profiling on the GPU; returns the handler
    to restore, or None off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def check_output(returncode: int, output: str, target: TargetArgs) -> None:
    """Turn ncu's known failures, read from its exit status and output, into clear errors."""
    if "ERR_NVGPUCTRPERM" in output:
        raise WorkbenchError(
            "ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM): run the capture "
            "as root, or let every user profile by loading the NVIDIA driver with "
            "NVreg_RestrictProfilingToAdminUsers=0 (a line `options nvidia "
            "NVreg_RestrictProfilingToAdminUsers=0` in /etc/modprobe.d/, then reboot)."
        )
    errors = [line for line in output.splitlines() if line.startswith(f"{PREFIX} error:")]
    if errors:
        raise WorkbenchError(
            f"the target failed under ncu: {errors[-1].removeprefix(f'{PREFIX} error:').strip()}"
            f"\nLast lines of its output:\n{_tail(output)}"
        )
    if returncode != 0 or DONE not in output:
        raise WorkbenchError(
            f"ncu or the target it ran failed (exit status {returncode}) before the target "
            f"finished. Last lines of the output:\n{_tail(output)}"
        )
    if "No kernels were profiled" in output:
        raise WorkbenchError(_no_match(target, "ncu profiled no kernel"))


def _no_match(target: TargetArgs, what: str) -> str:
    filters = " ".join(f"--nvtx-include {nvtx_filter(n)}" for n in target.range_names())
    return (
        f"{what}: no kernel launch matched the NVTX filter ({filters}). The target marks each "
        "launch with a torch.cuda.nvtx push/pop range of that name; check that the variant "
        "launches GPU kernels and that the names match."
    )


def ncu_version(ncu: str) -> str | None:
    """ncu's own version line, e.g. 'Version 2025.3.1.0 (build ...)'."""
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def capture(
    kernel: str,
    variant: str,
    tokens: int | Sequence[int],
    out: str | Path = "ncu",
    name: str | None = None,
    timeout_s: float = 900,
    *,
    routing: str = "uniform",
    seed: int = 0,
    ncu_set: str | None = None,
    sections: Sequence[str] = (),
    code: str | None = None,
    **params: object,
) -> Path:
    """Profile one launch of `kernel`/`variant` per token count with Nsight Compute.

    `code` profiles another version of the kernels package, as `ab`'s `code=` arms take one (a
    git revision, a folder holding a kernels package, or "worktree"): the target then imports
    that package, the rest of the workbench being the working tree's; the report's name ends
    in `-code<commit or folder>` and its metadata records the code, so a kernel edit's reports,
    before and after, diff with `workbench ncu-report AFTER --baseline BEFORE`.

    `variant` may name a peer of `kernel` (dense: cublas_fp8, deepgemm, humming, ...; moe:
    deepgemm, humming), profiled on the weights bench hands it (`ncu_peers`); its metadata then
    says which package it ran. `params` go to the variant (e.g. `block_m=32`). ncu collects
    `--set full`, or `ncu_set` (one of NCU_SETS), or instead the `sections` named (see
    collection_options). Writes `out/<name>.ncu-rep`, `<name>.json` and `<name>.summary.txt`
    and returns the report's path; `name` defaults to e.g. `moe-stock-T6-4096`. Needs ncu and
    a GPU; the report then loads anywhere with load_ncu.
    """
    counts = (tokens,) if isinstance(tokens, int) else tuple(tokens)
    target = TargetArgs(kernel, variant, counts, dict(params), routing, seed)
    target.validate()
    collect = collection_options(ncu_set, sections)
    version = None if code is None else code_version(code)
    suffix = "" if version is None or version.key is None else f"-code{version.key}"
    name = name or default_name(target) + suffix
    if not re.fullmatch(r"[A-Za-z0-9._=-]+", name) or name.startswith("."):
        raise WorkbenchError(f"name '{name}' must be a plain file name (letters, digits, ._=-).")
    peer = peer_record(kernel, variant)  # a peer's package and version, as it reports them
    if peer is not None and not peer["available"]:  # before ncu, not minutes into it
        raise WorkbenchError(f"{kernel} peer '{variant}' cannot run here: {peer['why']}")
    ncu = find_ncu()
    _require_gpu()
    out_dir = Path(out).resolve()  # ncu runs from the repository's root, not from here
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=owned_prefix(f".{name}"), dir=out_dir))
    try:
        command = ncu_command(ncu, tmp / name, target, collect=collect)
        env = {KERNELS_FROM_ENV: ""}  # the working tree's, whatever this process inherited
        key = None if version is None else export_kernels(version, tmp)
        if key is not None:  # the target imports that package, and so do its children
            env = package_environment(tmp / key)
        begun = time.perf_counter()
        returncode, output = _run(command, timeout_s, env)
        wall_s = time.perf_counter() - begun
        check_output(returncode, output, target)
        report = tmp / f"{name}.ncu-rep"
        if not report.is_file():
            raise WorkbenchError(_no_match(target, "ncu wrote no report"))
        meta = {
            "schema_version": SCHEMA_VERSION,
            "kind": "ncu",
            "kernel": kernel,
            "variant": variant,
            "tokens": list(counts),
            "params": dict(params),
            "routing": routing,
            "seed": seed,
            "preset": target.preset,
            "nvtx_ranges": target.range_names(),
            "collect": collect,
            "command": recorded_command(command, out_dir / name),
            "ncu_version": ncu_version(ncu),
            "wall_s": round(wall_s, 1),
            "environment": describe(),
        }
        if version is not None:
            meta["code"] = version.record()
        if peer is not None:
            meta["peer"] = peer
        write_json_atomic(tmp / f"{name}.json", meta)
        try:
            summary = load_ncu(report).text()
        except ArtifactError as err:
            raise WorkbenchError(f"ncu finished but its report is not usable: {err}") from None
        _write_text_atomic(tmp / f"{name}.summary.txt", summary)
        for suffix in (".json", ".summary.txt", ".ncu-rep"):  # the report last: it is the key
            os.replace(tmp / f"{name}{suffix}", out_dir / f"{name}{suffix}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / f"{name}.ncu-rep"


def capture_decode_step(
    variant: str = "stock",
    streams: int | Sequence[int] = 1,
    out: str | Path = "ncu",
    name: str | None = None,
    timeout_s: float = 900,
    *,
    layers: int = 4,
    prompt_tokens: int = 2048,
    routing: str = "uniform",
    seed: int = 0,
    ncu_set: str | None = None,
    sections: Sequence[str] = (),
    **params: object,
) -> Path:
    """Every kernel of one decode step of the synthetic model (dsv4-flash-tp2) in one report.

    The target prefills `prompt_tokens`, runs one warm-up decode step, then decode step 1 inside
    the NVTX range; one range per `streams` count (tokens per step). `layers` of the model's 40
    keep ncu's time short; `params` may also set dense, attention and prefill_chunk.
    """
    counts = (streams,) if isinstance(streams, int) else tuple(streams)
    return capture(
        DECODE_STEP,
        variant,
        counts,
        out,
        name,
        timeout_s,
        routing=routing,
        seed=seed,
        ncu_set=ncu_set,
        sections=sections,
        layers=layers,
        prompt_tokens=prompt_tokens,
        **params,
    )
