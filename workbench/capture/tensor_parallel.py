"""Tensor-parallel profiles: N ranks through torch.distributed, traces merged by rank.

`profile(tp=N)` spawns N processes (or, under `torchrun`, is one of them), each holding 1/N of
the model (`model.Shard`) and running the all-reduces in `allreduce` scopes: NCCL between GPUs,
one per rank, gloo on CPUs. Every rank writes its own trace; the parent (rank 0 under torchrun)
attributes each one, lines them up on the shared host clock and writes one run with a `rank`
column and the rank-skew table. A rank that dies stops the others with a clear error: the
spawner terminates the survivors, and the process group's timeout bounds any other hang.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workbench.analysis.profile import ProfileResult
from workbench.analysis.skew import skew_table
from workbench.analysis.trace import read_chrome_trace
from workbench.capture.debris import TEMP_PREFIX, owned_prefix, remove_leftovers
from workbench.capture.profile_run import ProfileSpec, notes, write_profile
from workbench.capture.rank_capture import attributed_kernels, capture_rank
from workbench.errors import WorkbenchError
from workbench.workloads.model import Shard

# Keep NVLink multicast off: on shared hosts it can take the GPUs out of service.
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
COLLECTIVE_TIMEOUT_S = 300
RUN_DEADLINE_S = 3600
# Set to a rank number to make that rank exit abruptly after joining the group: how the test
# suite checks that the other ranks stop with a clear error instead of hanging.
KILL_RANK_ENV = "WORKBENCH_KILL_RANK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int,
    spec: ProfileSpec,
    tmp: str,
    init_method: str,
    progress: bool,
    local_rank: int | None = None,
) -> None:
    """One rank: join the group, capture, and leave its results in `tmp` for the parent.

    The GPU is `local_rank` (torchrun's LOCAL_RANK) or, when spawned on one host, the rank.
    """
    os.environ.update(NCCL_ENV)
    on_gpu = spec.device.startswith("cuda")
    gpu = rank if local_rank is None else local_rank
    device = torch.device(f"cuda:{gpu}") if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    else:  # ranks share the host's cores: oversubscribed threads would time the scheduler
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.tp))
    dist.init_process_group(
        "nccl" if on_gpu else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=spec.tp,
        timeout=dt.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    try:
        if os.environ.get(KILL_RANK_ENV) == str(rank):
            os._exit(17)
        shard = Shard(tp=spec.tp, rank=rank, group=dist.group.WORLD)
        folder = Path(tmp)
        trace = folder / f"trace{rank}.json"
        capture = capture_rank(spec, shard, device, trace, progress and rank == 0)
        capture.trace = capture.trace.name  # the parent finds it in the same folder
        torch.save(capture, folder / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(spec: ProfileSpec, tmp: str, progress: bool, deadline_s: float) -> None:
    """Run the ranks; stop them all when one fails or when `deadline_s` passes.

    The deadline matters under CUDA graphs: collectives replayed from a graph are outside
    NCCL's watchdog, so the process group's own timeout does not end a hang there.
    """
    os.environ.update(NCCL_ENV)  # the children inherit it too
    init = f"tcp://127.0.0.1:{_free_port()}"
    context = mp.start_processes(
        _rank_main,
        args=(spec, tmp, init, progress),
        nprocs=spec.tp,
        join=False,
        start_method="spawn",
    )
    until = time.monotonic() + deadline_s
    try:
        while not context.join(timeout=5):
            if time.monotonic() > until:
                for process in context.processes:
                    process.kill()
                raise WorkbenchError(
                    f"tp={spec.tp} did not finish within {deadline_s:.0f} s (a hung collective?); "
                    "every rank was stopped. Rerun with fewer tokens or check the ranks' output."
                )
    except mp.ProcessRaisedException as err:
        last = str(err).strip().splitlines()[-1]
        raise WorkbenchError(
            f"rank {err.error_index} of tp={spec.tp} failed ({last}); the other ranks were "
            "stopped. Its traceback is above."
        ) from None
    except mp.ProcessExitedException as err:
        raise WorkbenchError(
            f"rank {err.error_index} of tp={spec.tp} died (exit code {err.exit_code}); the "
            "other ranks were stopped. Check its output above (out of memory? killed?)."
        ) from None


def _under_torchrun(spec: ProfileSpec, out, progress: bool, begun: float):
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if world != spec.tp:
        raise WorkbenchError(
            f"torchrun started {world} processes but tp={spec.tp}; pass --nproc-per-node {spec.tp}."
        )
    folder = Path(out) / f".tp-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    _rank_main(rank, spec, str(folder), "env://", progress, int(os.environ.get("LOCAL_RANK", rank)))
    if rank != 0:
        return None
    try:
        return _write(spec, out, folder, begun, time.perf_counter() - started)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def merge_ranks(tmp: Path, tp: int) -> tuple[pd.DataFrame, dict, list]:
    """Each rank's attributed kernel table on one clock, concatenated with a `rank` column."""
    captures = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(tp)]
    for c in captures:
        c.trace = tmp / c.trace
    origin = min(read_chrome_trace(c.trace).first_us() for c in captures)
    tables, matching = [], {}
    for rank, capture in enumerate(captures):
        kernels, matched = attributed_kernels(capture, origin_us=origin)
        tables.append(kernels.assign(rank=rank))
        matching[str(rank)] = matched
    kernels = pd.concat(tables, ignore_index=True)
    kernels["rank"] = kernels["rank"].astype("Int64")
    return kernels, matching, captures


def run_profile_tp(
    spec: ProfileSpec, out: str | Path = "raw", progress: bool = True
) -> ProfileResult | None:
    """Spawn `spec.tp` ranks (or be one of torchrun's), profile, merge and write one run.

    Under torchrun every process calls this; rank 0 returns the result, the others None.
    """
    begun = time.perf_counter()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _under_torchrun(spec, out, progress, begun)
    for line in remove_leftovers(Path(out)):
        print(line)
    with tempfile.TemporaryDirectory(prefix=owned_prefix(TEMP_PREFIX + "profile-tp")) as tmp:
        started = time.perf_counter()
        _spawn(spec, tmp, progress, RUN_DEADLINE_S)
        profiled_s = time.perf_counter() - started
        return _write(spec, out, Path(tmp), begun, profiled_s)


def _write(spec: ProfileSpec, out, folder: Path, begun: float, profiled_s: float) -> ProfileResult:
    parse_started = time.perf_counter()
    try:
        kernels, matching, captures = merge_ranks(folder, spec.tp)
    except (OSError, EOFError, RuntimeError) as err:
        raise WorkbenchError(
            f"a rank of tp={spec.tp} finished without leaving its results ({err}); rerun."
        ) from None
    # Rank 0's phases, then the parent's: reading and attributing every rank's trace.
    phases = {**captures[0].phases, "parse": time.perf_counter() - parse_started}
    extra = {"tokens": captures[0].tokens, "final_hidden": captures[0].final_hidden}
    skew_note = []
    try:
        extra["rank_skew"] = skew_table(kernels).reset_index()
    except ValueError as err:  # keep the run; say why the skew is missing
        skew_note = [f"No rank-skew table: {err}."]
    meta = {
        "kernels_run": captures[0].kernels_run,
        "notes": [
            *notes(spec, captures[0].kernels_run, kernels),
            f"Tensor parallelism {spec.tp}: one process per rank through torch.distributed "
            f"({'NCCL' if spec.device.startswith('cuda') else 'gloo'}); tables by category "
            "are per rank, averaged over the ranks unless a rank is chosen.",
            *skew_note,
        ],
        "graph_matching": matching if spec.cuda_graphs else None,
        "wall_s": round(time.perf_counter() - begun, 3),
        "profiled_s": round(profiled_s, 3),
        "peak_gpu_memory_gib": [c.peak_gpu_memory_gib for c in captures],
        "phases": phases,
        "compiles": captures[0].compiles,
    }
    return write_profile(spec, out, kernels, extra, meta, None, begun)
