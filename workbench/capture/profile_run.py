"""`profile()`: run the synthetic model under torch.profiler and write `raw/<run-id>/`.

Order of work: check every parameter and the memory first (nothing is written for bad input),
build the model, warm up (Triton compiles and cuBLAS handles stay out of the trace), profile
the prefill and decode steps, attribute the trace, and only then write the run directory in
one atomic rename. `capture_rank` is the part one process does; a tensor-parallel run
(`capture.tensor_parallel`) runs it on every rank and merges the traces.

Where the workbench's own time goes is timed per phase (`analysis.phases.TIMED_PHASES`) into
run.json's `phases`, and one progress bar over the profiled layers names the phase the work is
in.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from workbench.analysis.phases import TIMED_PHASES
from workbench.analysis.profile import SUMMARY, ProfileResult, profile_tables
from workbench.analysis.profile_store import stored_answers
from workbench.analysis.trace import early_launch_notes
from workbench.artifacts import read_meta, run_stamp, write_run
from workbench.capture.debris import TEMP_PREFIX, owned_prefix, remove_leftovers
from workbench.capture.environment import describe
from workbench.capture.memory import available_host_bytes, estimate_bytes, out_of_memory_error
from workbench.capture.profile_progress import Progress, timed
from workbench.capture.profile_settings import (
    check_backends,
    check_count,
    check_dense_pdl,
    check_moe_format,
    device_defaults,
    hybrid_m_for,
)
from workbench.capture.rank_capture import attributed_kernels, capture_rank
from workbench.errors import WorkbenchError
from workbench.presets import ROUTINGS, Preset, get_preset, with_overrides
from workbench.workloads.model import Plan, Shard

DEFAULT_GPU_PRESET, DEFAULT_CPU_PRESET = "dsv4-flash-tp2", "tiny"


@dataclass
class ProfileSpec:
    """Every parameter of a profile, checked; picklable, so ranks of a TP run receive it."""

    prompt_tokens: int
    decode_tokens: int
    preset: str
    moe: str
    dense: str
    attention: str
    routing: str
    streams: int
    prefill_chunk: int | None
    seed: int
    device: str
    cuda_graphs: bool
    tp: int | None
    shape_overrides: dict = field(default_factory=dict)
    hybrid_m: int | None = None  # dense="hybrid" only: the largest M sent to W8A16
    moe_format: str = "bf16"  # the routed experts' weights: one of kernels.moe.FORMATS
    dense_pdl: bool | None = False  # W8A16 GEMMs with programmatic dependent launch (kernels.pdl)

    @property
    def plan(self) -> Plan:
        return Plan(self.prompt_tokens, self.decode_tokens, self.streams, self.prefill_chunk)

    def model_preset(self) -> Preset:
        base = get_preset(self.preset)
        return with_overrides(base, **self.shape_overrides) if self.shape_overrides else base


def resolve(
    prompt_tokens: int,
    decode_tokens: int,
    *,
    preset: str | None,
    moe: str,
    dense: str | None,
    attention: str | None,
    routing: str,
    streams: int,
    prefill_chunk: int | None,
    seed: int,
    device: str | None,
    cuda_graphs: bool | None,
    tp: int | None,
    shape_overrides: dict,
    hybrid_m: int | None = None,
    moe_format: str | None = None,
    dense_pdl: bool | None = False,
) -> ProfileSpec:
    """Check everything that can be checked before any work, and fill in the defaults."""
    for name, value in (("prompt_tokens", prompt_tokens), ("decode_tokens", decode_tokens),
                        ("streams", streams), ("seed", seed)):  # fmt: skip
        check_count(name, value, minimum=0 if name == "seed" else 1)
    if prefill_chunk is not None:
        check_count("prefill_chunk", prefill_chunk)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise WorkbenchError(
            f"device={device!r} is not a device the workbench runs on; give 'cuda' (or "
            "'cuda:N') for a GPU, 'cpu', or leave it out to pick the GPU when there is one."
        )
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise WorkbenchError(
            "device='cuda' was asked for but no CUDA GPU is visible (torch.cuda.is_available() "
            "is False); run on the GPU machine or drop device= to use the CPU."
        )
    on_gpu = device.startswith("cuda")
    filled = device_defaults(
        {"moe": moe, "dense": dense, "attention": attention, "moe_format": moe_format}, on_gpu
    )
    dense, attention, moe_format = filled["dense"], filled["attention"], filled["moe_format"]
    graphs = on_gpu if cuda_graphs is None else cuda_graphs
    if graphs and not on_gpu:
        raise WorkbenchError(
            "cuda_graphs=True needs a GPU (decode steps are replayed as CUDA graphs); "
            "drop it or pass cuda_graphs=False on the CPU."
        )
    if routing not in ROUTINGS:
        raise WorkbenchError(f"unknown routing '{routing}'; known: {', '.join(ROUTINGS)}")
    hybrid_m = hybrid_m_for(dense, hybrid_m)
    check_dense_pdl(dense, dense_pdl, on_gpu)
    check_moe_format(moe, moe_format)
    spec = ProfileSpec(
        prompt_tokens,
        decode_tokens,
        preset or (DEFAULT_GPU_PRESET if on_gpu else DEFAULT_CPU_PRESET),
        moe,
        dense,
        attention,
        routing,
        streams,
        prefill_chunk,
        seed,
        device,
        graphs,
        tp,
        dict(shape_overrides),
        hybrid_m,
        moe_format,
        dense_pdl,
    )
    chosen = spec.model_preset()
    chosen.validate()
    if tp is not None:
        if tp < 1:
            raise WorkbenchError(f"tp={tp} is below 1; give the number of ranks.")
        chosen.rank_shapes(tp)  # raises when tp does not divide the sharded dimensions
        if on_gpu and tp > torch.cuda.device_count():
            raise WorkbenchError(
                f"tp={tp} needs {tp} GPUs, one per rank; {torch.cuda.device_count()} visible."
            )
    plan = spec.plan  # validates the counts
    check_backends(moe=moe, dense=dense, attention=attention, on_gpu=on_gpu)
    _check_memory(chosen, plan, torch.device(device), tp)
    return spec


def _check_memory(preset: Preset, plan: Plan, device: torch.device, tp: int | None) -> None:
    if device.type != "cuda":
        _check_host_memory(preset, plan)
        return
    if tp is not None:
        preset = with_overrides(preset, simulated_tp=tp)
    if device.index is None and "LOCAL_RANK" in os.environ:  # a torchrun rank: its own GPU
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    free, _ = torch.cuda.mem_get_info(device)
    chunk = min(plan.prefill_chunk or plan.prompt_tokens, plan.prompt_tokens)
    if estimate_bytes(preset, plan.prompt_tokens, chunk, plan.streams) > free:
        raise out_of_memory_error(
            preset, plan.prompt_tokens, plan.prefill_chunk, free, plan.streams
        )


def _check_host_memory(preset: Preset, plan: Plan) -> None:
    """On the CPU the same estimate holds against the memory the host has free (fp32 doubles
    the bf16 estimate)."""
    free = available_host_bytes()
    chunk = min(plan.prefill_chunk or plan.prompt_tokens, plan.prompt_tokens)
    need = 2 * estimate_bytes(preset, plan.prompt_tokens, chunk, plan.streams)
    if free is not None and need > free:
        raise out_of_memory_error(
            preset, plan.prompt_tokens, plan.prefill_chunk, free // 2, plan.streams, where="host"
        )


def notes(spec: ProfileSpec, kernels_run: dict, kernels: pd.DataFrame) -> list[str]:
    if spec.device.startswith("cuda"):
        said = [f"GPU run: times are summed GPU kernel time on {torch.cuda.get_device_name(0)}."]
        said += early_launch_notes(kernels)
        if spec.cuda_graphs:
            said.append(
                "Decode: each step's CUDA graph is launched before the host waits for the "
                "previous step's token, as an overlap scheduler does, so the gaps are the GPU's "
                "idle time inside the steps, not the host's graph launches (runs before commit "
                "2231800 waited for each step first)."
            )
        return said
    return [
        f"CPU run (no GPU found): preset '{spec.preset}'; Triton kernels replaced by their torch "
        f"references ({', '.join(f'{k}={v}' for k, v in kernels_run.items())}), computing in "
        "float32; rows are CPU ops and times are CPU op times, not GPU kernel times."
    ]


def run_name(spec: ProfileSpec) -> str:
    """The run id before its time stamp, e.g. `profile-tiny-stock-fp8-bf16-graphs-4096t`: the
    preset, the MoE kernel (and its expert format when not bf16), the dense backend (`-pdl`
    with programmatic dependent launch) and mode."""
    mode = (f"-tp{spec.tp}" if spec.tp else "") + ("-graphs" if spec.cuda_graphs else "")
    moe = spec.moe + (f"-{spec.moe_format}" if spec.moe_format != "bf16" else "")
    dense = spec.dense + ("-pdl" if spec.dense_pdl is not False else "")
    return f"profile-{spec.preset}-{moe}-{dense}{mode}-{spec.prompt_tokens}t"


def write_profile(
    spec: ProfileSpec,
    out: str | Path,
    kernels: pd.DataFrame,
    extra_tables: dict[str, pd.DataFrame],
    extra_meta: dict,
    kept_trace: Path | None,
    begun: float | None = None,
) -> ProfileResult:
    """Write the run directory atomically and return the result as loaded back.

    With `begun` (the perf_counter the profile began at) and `extra_meta["phases"]`, the
    tables and the write are timed into the phases and `wall_s` ends as run.json is written.
    """
    meta = {
        "kind": "profile",
        "params": asdict(spec),
        "preset_shapes": spec.model_preset().to_dict(),
        "device": "cuda" if spec.device.startswith("cuda") else "cpu",
        **extra_meta,
        "environment": describe(),
    }
    run_id = f"{run_name(spec)}-{run_stamp()}"
    phases = meta.get("phases") if begun is not None else None
    made = time.perf_counter()
    tables = {"kernels": kernels, **profile_tables(kernels), **extra_tables}
    # What prefill(), decode(), decode_caption() and text() answer, so that reading the run
    # does not parse its kernel table again (`analysis.profile_store`).
    answers, meta[SUMMARY] = stored_answers(kernels, tables.get)
    tables.update(answers)
    written = time.perf_counter()

    def finished() -> dict:
        """run.json's content once the tables are on disk: the phases and wall time end here."""
        if phases is None:
            return meta
        now = time.perf_counter()
        phases.update(tables=written - made, write=now - written)
        meta["phases"] = {p: round(phases[p], 4) for p in TIMED_PHASES if p in phases}
        meta["wall_s"] = round(now - begun, 3)
        return meta

    # The final hidden state is a row of 17-digit floats a stream (thousands of columns) that
    # nobody reads in a diff: packed, it takes about a fifth of the room under the 40 MB cap
    path = write_run(out, run_id, finished, tables, extra_files=[kept_trace],
                     packed=("final_hidden",))  # fmt: skip
    # The metadata as written (with run id, schema and file list): captured == loaded.
    return ProfileResult(meta=read_meta(path), kernels=kernels, path=path)


def gzip_copy(src: Path, dst: Path) -> Path:
    with src.open("rb") as f_in, gzip.open(dst, "wb", compresslevel=9) as f_out:
        shutil.copyfileobj(f_in, f_out)
    return dst


def run_profile(
    spec: ProfileSpec,
    out: str | Path = "raw",
    progress: bool = True,
    keep_trace: bool = False,
    *,
    begun: float | None = None,
    import_s: float | None = None,
) -> ProfileResult:
    """One process: this rank of the preset's simulated TP, no collectives.

    `begun`: the perf_counter at which the caller's profile() began (its wall time counts from
    there; default now); `import_s`: the seconds that call spent importing the capture modules.
    """
    begun = time.perf_counter() if begun is None else begun
    for line in remove_leftovers(Path(out)):
        print(line)
    bar = Progress(spec, progress)
    with tempfile.TemporaryDirectory(prefix=owned_prefix(TEMP_PREFIX + "profile")) as tmp:
        try:
            capture = capture_rank(
                spec,
                Shard(tp=spec.model_preset().simulated_tp),
                torch.device(spec.device),
                Path(tmp) / "trace.json",
                bar,
            )
            phases = {"import": import_s} if import_s else {}
            phases.update(capture.phases)
            bar.phase("parsing")
            with timed(phases, "parse"):
                kernels, matching = attributed_kernels(capture)
        finally:
            bar.close()
        kept = None
        if keep_trace:
            with timed(phases, "export"):
                kept = gzip_copy(capture.trace, Path(tmp) / "trace.json.gz")
        extra = {"tokens": capture.tokens, "final_hidden": capture.final_hidden}
        if capture.signature is not None:
            extra["graph_signature"] = capture.signature
        meta = {
            "kernels_run": capture.kernels_run,
            "notes": notes(spec, capture.kernels_run, kernels),
            "graph_matching": matching,
            "wall_s": None,  # set as run.json is written, with the tables' and write's phases
            "profiled_s": round(capture.profiled_s, 3),
            "peak_gpu_memory_gib": capture.peak_gpu_memory_gib,
            "phases": phases,
            "compiles": capture.compiles,
        }
        return write_profile(spec, out, kernels, extra, meta, kept, begun)
