"""Run a callable under `torch.profiler` and export its Chrome trace."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from torch.profiler import ProfilerActivity, profile

T = TypeVar("T")


def trace_to_file(fn: Callable[[], T], path: Path) -> T:
    """Profile `fn()` (CPU ops, and CUDA kernels when a GPU is present); write the trace.

    Shapes and Python stacks are not recorded: they multiply the trace's size, and the
    category scopes already say where each kernel came from.
    """
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
        result = fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return result
