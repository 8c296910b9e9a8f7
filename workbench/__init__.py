"""A profiling workbench for mixture-of-experts and dense GEMM kernels.

The facade. Analysis entry points (`load`, `load_trace`) import neither torch nor triton, so
artifacts captured on a GPU box are read anywhere; capture entry points (`profile`) import
them only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.errors import ArtifactError, WorkbenchError
from workbench.results import Comparison, ProfileResult, load, load_trace

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "ArtifactError",
    "Comparison",
    "ProfileResult",
    "WorkbenchError",
    "load",
    "load_trace",
    "profile",
]


def profile(
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
    """Profile a prefill of `prompt_tokens` then `decode_tokens` decode steps of the model.

    On a GPU the default preset is `dsv4-flash-tp2` and times are GPU kernel times; without
    one it is `tiny`, the Triton kernels are replaced by their torch references, and times are
    CPU op times (the result's notes say so). `prefill_chunk=None` prefills in one pass;
    `streams` tokens are decoded per step. `shape_overrides` change preset fields (e.g.
    `top_k=8`, `layers=2`). `cuda_graphs` (default: on a GPU) replays each decode step as a
    CUDA graph, as serving engines do; replayed kernels are attributed by their position in an
    eager run of the same step. Writes `out/<run-id>/` (with the gzipped Chrome trace too when
    `keep_trace`) and returns the result.
    """
    from workbench.capture.profile_run import run_profile

    return run_profile(
        prompt_tokens,
        decode_tokens,
        preset=preset,
        moe=moe,
        dense=dense,
        attention=attention,
        routing=routing,
        streams=streams,
        prefill_chunk=prefill_chunk,
        seed=seed,
        device=device,
        out=out,
        progress=progress,
        keep_trace=keep_trace,
        cuda_graphs=cuda_graphs,
        **shape_overrides,
    )
