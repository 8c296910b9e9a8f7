"""Decode steps as CUDA graph replays, and the eager signature that attributes their kernels.

When a graph captured with `record_function` scopes inside is replayed under torch.profiler,
every replayed kernel carries the correlation id of the one `cudaGraphLaunch`: the scopes are
gone (measured on the H200 with torch 2.11). So before profiling, one eager run of the very
same step is traced on its own; its kernel sequence, with the category and layer of each
position, is the graph's *signature*, and `analysis.graphs` labels replayed kernels by position.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import torch

from workbench.analysis.graphs import signature_of
from workbench.analysis.trace import kernel_table, read_chrome_trace
from workbench.capture.debris import TEMP_PREFIX, owned_prefix
from workbench.capture.torch_trace import trace_to_file
from workbench.workloads.model import DecodeState, SyntheticModel


@torch.inference_mode()
def capture_decode_graph(model: SyntheticModel, state: DecodeState) -> torch.cuda.CUDAGraph:
    """Capture one decode step on `state`'s static buffers (after warm-up on a side stream)."""
    current = torch.cuda.current_stream(model.device)
    side = torch.cuda.Stream(model.device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(2):
            model.decode_step(state)
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.decode_step(state)
    torch.cuda.synchronize(model.device)
    return graph


@torch.inference_mode()
def learn_signature(model: SyntheticModel, state: DecodeState) -> pd.DataFrame:
    """The kernel sequence of one eager decode step: position, name, category, layer."""

    def one_step() -> None:
        model.decode_step(state)
        torch.cuda.synchronize(model.device)

    with tempfile.TemporaryDirectory(prefix=owned_prefix(TEMP_PREFIX + "signature")) as tmp:
        path = Path(tmp) / "signature.json"
        trace_to_file(one_step, path)
        return signature_of(kernel_table(read_chrome_trace(path)))
