"""What one process of a profile does (`capture_rank`): build the model for its rank, compile
its Triton kernels ahead in parallel, warm up, capture the decode graph, and trace the plan; and
the kernel table of that trace (`attributed_kernels`). `profile_run` checks the parameters,
calls it once (or `tensor_parallel` once per rank) and writes the run directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch
import torch.distributed as dist

from workbench.analysis.graphs import attribute_graph_replays
from workbench.analysis.trace import kernel_table, read_chrome_trace
from workbench.capture.compile_log import compile_log
from workbench.capture.cuda_graphs import capture_decode_graph, learn_signature
from workbench.capture.memory import out_of_memory_error
from workbench.capture.precompile import precompile, start_workers, worker_count
from workbench.capture.profile_progress import Progress, timed
from workbench.capture.profile_settings import PEER_DENSE_BASE
from workbench.capture.torch_trace import trace_to_file
from workbench.peers import PEERS
from workbench.workloads.model import Plan, Shard, SyntheticModel
from workbench.workloads.model_backends import use_dense_peer, use_moe_peer
from workbench.workloads.model_state import DecodeState

if TYPE_CHECKING:
    from workbench.capture.profile_run import ProfileSpec


@dataclass
class RankCapture:
    """What one process brings back: its trace, graph signature, outputs and timings."""

    trace: Path
    signature: pd.DataFrame | None
    tokens: pd.DataFrame
    final_hidden: pd.DataFrame
    profiled_s: float
    peak_gpu_memory_gib: float | None
    kernels_run: dict
    phases: dict = field(default_factory=dict)  # seconds per phase (TIMED_PHASES)
    compiles: dict = field(default_factory=dict)  # Triton's compiles (`compile_log`)


@contextmanager
def first_layers(model: SyntheticModel) -> Iterator[None]:
    """Run only the model's first layers inside the block, as many as it takes to meet every
    weight set and every kind of attention layer (`Preset.attention_layers`): enough for a
    dry run to see every kernel specialisation, since layers of one kind have the same
    shapes (a launch it misses is compiled by the warm-up)."""
    kept = model.layers
    kinds = [model.preset.attention_kind(i) for i in range(kept)]
    count = max(len(model.weights), *(kinds.index(kind) + 1 for kind in set(kinds)))
    model.layers = min(kept, count)
    try:
        yield
    finally:
        model.layers = kept


def dry_run_of(model: SyntheticModel, warmup: Plan, state: DecodeState) -> Callable[[], None]:
    """What the parallel compile runs with no kernel launched (`capture.precompile`): the
    warm-up plan over the first layers, then a decode step of the profiled context."""

    @torch.inference_mode()
    def dry_run() -> None:
        with first_layers(model):
            model.run(warmup, model.inputs(warmup))
            model.decode_step(state)  # the profiled context's decode shapes
        torch.cuda.synchronize(model.device)

    return dry_run


def capture_rank(
    spec: ProfileSpec,
    shard: Shard,
    device: torch.device,
    trace: Path,
    progress: bool | Progress,
) -> RankCapture:
    """Build the model for `shard`, warm up, and profile the plan into `trace`.

    `progress`: show a bar (closed on return), or the caller's bar to describe (left open).
    """
    plan = spec.plan
    bar = progress if isinstance(progress, Progress) else Progress(spec, progress)
    phases: dict[str, float] = {}
    dense_peer, moe_peer = PEERS.get(spec.dense), PEERS.get(spec.moe)
    # Started first: they import Triton and torch while the model is built. Not with a peer:
    # the dry run would feed its third-party kernels what the skipped kernels left, and a
    # peer's kernel may index memory with it.
    ahead = device.type == "cuda" and not (dense_peer or moe_peer)
    ranks = dist.get_world_size(shard.group) if shard.group is not None else 1
    workers, precompiled = start_workers(worker_count(ranks) if ahead else 0), {}
    with compile_log() as compiles:
        try:
            bar.phase("building")
            with timed(phases, "build"):
                model = SyntheticModel(
                    spec.model_preset(),
                    moe="stock" if moe_peer else spec.moe,
                    dense=PEER_DENSE_BASE if dense_peer else spec.dense,
                    attention=spec.attention,
                    moe_format=spec.moe_format,  # bf16 with a peer (resolve refuses the others)
                    routing=spec.routing,
                    seed=spec.seed,
                    device=device,
                    shard=shard,
                    hybrid_m=spec.hybrid_m,
                    dense_pdl=spec.dense_pdl,
                )
                if dense_peer:
                    use_dense_peer(model, dense_peer.name, dense_peer.prepare)
                if moe_peer:
                    use_moe_peer(model, moe_peer.name, moe_peer.prepare_moe)
            bar.phase("preparing inputs")
            with timed(phases, "inputs"):
                inputs = model.inputs(plan)
                state = model.new_state(plan)
            if device.type == "cuda":
                warmup = plan.warmup()
                warmup_inputs = model.inputs(warmup)
                if workers is not None:
                    bar.phase(f"compiling kernels in {workers.count} processes")
                    with timed(phases, "precompile"):
                        precompiled = precompile(dry_run_of(model, warmup, state), workers)
                bar.phase("warming up")
                with timed(phases, "warm-up"):
                    model.run(warmup, warmup_inputs)
                    torch.cuda.synchronize(device)
            replay, signature = None, None
            if spec.cuda_graphs:
                bar.phase("capturing the decode graph")
                with timed(phases, "graphs"):
                    graph = capture_decode_graph(model, state)
                    signature = learn_signature(model, state)
                    replay = graph.replay
            ran: dict[str, float] = {}

            def profiled() -> object:
                if shard.group is not None:  # ranks start their profilers apart: line them up
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    dist.barrier(group=shard.group)
                bar.phase(bar.position())
                tokens = model.run(plan, inputs, bar.tick, state, replay)
                ran["until"] = time.perf_counter()
                bar.phase("exporting trace")
                return tokens

            started = time.perf_counter()
            tokens = trace_to_file(profiled, trace)
            phases["profiled"] = ran["until"] - started  # with the profiler's start and barrier
            phases["export"] = time.perf_counter() - ran["until"]
        except torch.OutOfMemoryError:
            free, _ = torch.cuda.mem_get_info(device)
            raise out_of_memory_error(
                spec.model_preset(),
                plan.prompt_tokens,
                plan.prefill_chunk,
                free + torch.cuda.memory_reserved(device),
                plan.streams,
            ) from None
        finally:
            if workers is not None:
                workers.close()
            if bar is not progress:
                bar.close()
    on_gpu = device.type == "cuda"
    return RankCapture(
        trace=trace,
        signature=signature,
        tokens=pd.DataFrame(
            tokens, columns=[f"stream{i}" for i in range(plan.streams)]
        ).rename_axis("step"),
        final_hidden=pd.DataFrame(state.hidden.float().cpu().numpy()).rename_axis("stream"),
        profiled_s=phases["profiled"],
        peak_gpu_memory_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        if on_gpu
        else None,
        kernels_run=model.kernels_run,
        phases=phases,
        compiles={**compiles.summary(), **precompiled},
    )


def attributed_kernels(capture: RankCapture, origin_us: float | None = None):
    """The kernel table of one rank's trace, graph replays attributed by position."""
    kernels = kernel_table(read_chrome_trace(capture.trace), origin_us=origin_us)
    if capture.signature is None:
        return kernels, None
    return attribute_graph_replays(kernels, capture.signature)
