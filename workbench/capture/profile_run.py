"""`profile()`: run the synthetic model under torch.profiler and write `raw/<run-id>/`.

Order of work: check every parameter and the memory first (nothing is written for bad input),
build the model, warm up (Triton compiles and cuBLAS handles stay out of the trace), profile
the prefill and decode steps, attribute the trace, and only then write the run directory in
one atomic rename.
"""

from __future__ import annotations

import datetime as dt
import gzip
import shutil
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench.analysis.graphs import attribute_graph_replays
from workbench.analysis.trace import kernel_table, read_chrome_trace
from workbench.artifacts import read_meta, write_run
from workbench.capture.cuda_graphs import capture_decode_graph, learn_signature
from workbench.capture.environment import describe
from workbench.capture.memory import estimate_bytes, out_of_memory_error
from workbench.capture.torch_trace import trace_to_file
from workbench.errors import WorkbenchError
from workbench.model import Plan, SyntheticModel
from workbench.presets import ROUTINGS, get_preset, with_overrides
from workbench.results import ProfileResult, profile_tables

DEFAULT_GPU_PRESET, DEFAULT_CPU_PRESET = "dsv4-flash-tp2", "tiny"


def _device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise WorkbenchError(
            "device='cuda' was asked for but no CUDA GPU is visible (torch.cuda.is_available() "
            "is False); run on the GPU machine or drop device= to use the CPU."
        )
    return torch.device(device)


def _check_memory(preset, plan: Plan, device: torch.device) -> None:
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    chunk = min(plan.prefill_chunk or plan.prompt_tokens, plan.prompt_tokens)
    if estimate_bytes(preset, plan.prompt_tokens, chunk, plan.streams) > free:
        raise out_of_memory_error(
            preset, plan.prompt_tokens, plan.prefill_chunk, free, plan.streams
        )


def _meta(params, preset, model, dev, wall_s: float, profiled_s: float) -> dict:
    return {
        "kind": "profile",
        "params": params,
        "preset_shapes": preset.to_dict(),
        "kernels_run": model.kernels_run,
        "device": dev.type,
        "wall_s": round(wall_s, 3),
        "profiled_s": round(profiled_s, 3),
        "notes": _notes(dev, model),
        "peak_gpu_memory_gib": (
            round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None
        ),
        "environment": describe(),
    }


def _gzip_copy(src: Path, dst: Path) -> Path:
    with src.open("rb") as f_in, gzip.open(dst, "wb", compresslevel=9) as f_out:
        shutil.copyfileobj(f_in, f_out)
    return dst


def _notes(device: torch.device, model: SyntheticModel) -> list[str]:
    if device.type == "cuda":
        return [f"GPU run: times are summed GPU kernel time on {torch.cuda.get_device_name(0)}."]
    return [
        "CPU run (no GPU found): preset "
        f"'{model.preset.name}'; Triton kernels replaced by their torch references "
        f"({', '.join(f'{k}={v}' for k, v in model.kernels_run.items())}), computing in "
        f"{str(model.dtype).removeprefix('torch.')}; rows are CPU ops and times are CPU op "
        "times, not GPU kernel times."
    ]


def run_profile(
    prompt_tokens: int = 33863,
    decode_tokens: int = 64,
    *,
    preset: str | None = None,
    moe: str = "stock",
    dense: str = "bf16",
    attention: str = "torch",
    routing: str = "uniform",
    streams: int = 1,
    prefill_chunk: int | None = 4096,
    seed: int = 0,
    device: str | None = None,
    out: str | Path = "raw",
    progress: bool = True,
    keep_trace: bool = False,
    cuda_graphs: bool | None = None,
    **shape_overrides: int,
) -> ProfileResult:
    """Profile a prefill of `prompt_tokens` and `decode_tokens` decode steps; see the facade."""
    begun = time.perf_counter()
    dev = _device(device)
    graphs = dev.type == "cuda" if cuda_graphs is None else cuda_graphs
    if graphs and dev.type != "cuda":
        raise WorkbenchError(
            "cuda_graphs=True needs a GPU (decode steps are replayed as CUDA graphs); "
            "drop it or pass cuda_graphs=False on the CPU."
        )
    base = get_preset(preset or (DEFAULT_GPU_PRESET if dev.type == "cuda" else DEFAULT_CPU_PRESET))
    chosen = with_overrides(base, **shape_overrides) if shape_overrides else base
    chosen.validate()
    if routing not in ROUTINGS:
        raise WorkbenchError(f"unknown routing '{routing}'; known: {', '.join(ROUTINGS)}")
    plan = Plan(prompt_tokens, decode_tokens, streams, prefill_chunk)
    _check_memory(chosen, plan, dev)
    params = {
        "prompt_tokens": prompt_tokens,
        "decode_tokens": decode_tokens,
        "preset": chosen.name,
        "moe": moe,
        "dense": dense,
        "attention": attention,
        "routing": routing,
        "streams": streams,
        "prefill_chunk": prefill_chunk,
        "seed": seed,
        "shape_overrides": shape_overrides,
        "cuda_graphs": graphs,
    }
    try:
        model = SyntheticModel(
            chosen,
            moe=moe,
            dense=dense,
            attention=attention,
            routing=routing,
            seed=seed,
            device=dev,
        )
        if dev.type == "cuda":
            warmup = plan.warmup()
            model.run(warmup, model.inputs(warmup))
            torch.cuda.synchronize(dev)
        inputs = model.inputs(plan)
        state = model.new_state(plan)
        replay, signature = None, None
        if graphs:
            graph = capture_decode_graph(model, state)
            signature = learn_signature(model, state)
            replay = graph.replay
        bar = tqdm(
            total=(len(plan.chunks()) + plan.decode_tokens) * model.layers,
            unit="layer",
            desc=f"profile {chosen.name}",
            disable=not progress,
        )
        with tempfile.TemporaryDirectory() as tmp, bar:
            trace_path = Path(tmp) / "trace.json"
            started = time.perf_counter()
            trace_to_file(lambda: model.run(plan, inputs, bar.update, state, replay), trace_path)
            profiled_s = time.perf_counter() - started
            kernels = kernel_table(read_chrome_trace(trace_path))
            extra_tables, matching = {}, None
            if signature is not None:
                kernels, matching = attribute_graph_replays(kernels, signature)
                extra_tables["graph_signature"] = signature
            kept = _gzip_copy(trace_path, Path(tmp) / "trace.json.gz") if keep_trace else None
            meta = _meta(params, chosen, model, dev, time.perf_counter() - begun, profiled_s)
            meta["graph_matching"] = matching
            stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
            run_id = f"profile-{chosen.name}-{moe}-{dense}-{prompt_tokens}t-{stamp}"
            tables = {"kernels": kernels, **profile_tables(kernels), **extra_tables}
            path = write_run(out, run_id, meta, tables, extra_files=[kept])
    except torch.OutOfMemoryError:
        free, _ = torch.cuda.mem_get_info(dev)
        raise out_of_memory_error(
            chosen, prompt_tokens, prefill_chunk, free + torch.cuda.memory_reserved(dev), streams
        ) from None
    # The metadata as written (with run id, schema and file list): captured == loaded.
    return ProfileResult(meta=read_meta(path), kernels=kernels, path=path)
