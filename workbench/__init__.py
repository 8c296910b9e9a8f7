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
    from collections.abc import Sequence
    from pathlib import Path

    from workbench.analysis.ncu import NcuReport

__all__ = [
    "ArtifactError",
    "Comparison",
    "ProfileResult",
    "WorkbenchError",
    "load",
    "load_ncu",
    "load_trace",
    "ab",
    "load_ab",
    "load_sweep",
    "ncu",
    "profile",
    "sweep",
]


def sweep(kernel: str, param: str, values, tokens, **options):
    """Time `kernel` at each value of `param` x tokens, each configuration in its own worker
    process under a watchdog (see `workbench.capture.experiments.sweep`)."""
    from workbench.capture.experiments import sweep as _sweep

    return _sweep(kernel, param, values, tokens, **options)


def ab(a: dict, b: dict, tokens, **options):
    """Two settings of the same workload, with the ratio b/a and its 95% interval per size
    (see `workbench.capture.experiments.ab`)."""
    from workbench.capture.experiments import ab as _ab

    return _ab(a, b, tokens, **options)


def load_sweep(run_dir: str | Path):
    """A sweep from its run directory, without a GPU or torch."""
    from workbench.capture.experiments import load_sweep as _load_sweep

    return _load_sweep(run_dir)


def load_ab(run_dir: str | Path):
    """An A/B run from its run directory, without a GPU or torch."""
    from workbench.capture.experiments import load_ab as _load_ab

    return _load_ab(run_dir)


def load_ncu(path: str | Path) -> NcuReport:
    """An Nsight Compute report (the workbench's or anyone's) as tables and figures.

    Imported on use: it needs NVIDIA's `ncu_report` module, which a bare GPU box may lack
    (ncu ships one under its `extras/python`).
    """
    from workbench.analysis.ncu import load_ncu as _load_ncu

    return _load_ncu(path)


def ncu(
    kernel: str = "moe",
    variant: str = "stock",
    tokens: int | Sequence[int] = (6, 4096),
    out: str | Path = "ncu",
    **params: object,
) -> NcuReport:
    """Capture Nsight Compute reports of one launch per token count and load them.

    `kernel="moe"` profiles a MoE scheduler at the TP2-rank shape, `kernel="dense"` a dense
    backend; `kernel="model-decode-step"` profiles every kernel of one decode step of the
    synthetic model (`tokens` are then the streams). `ncu_set="full"` (the default) collects
    what stalls and hot spots need; "detailed" makes smaller reports of many kernels.
    Relaunches a small target under ncu in a subprocess (ncu 2025.3 cannot attach), writes
    `out/<name>.ncu-rep` with `<name>.json` and `<name>.summary.txt`.
    """
    from workbench.capture.ncu import DECODE_STEP, capture, capture_decode_step

    if kernel == DECODE_STEP:
        return load_ncu(capture_decode_step(variant, tokens, out, **params))
    return load_ncu(capture(kernel, variant, tokens, out, **params))


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
    tp: int | None = None,
    out: str | Path = "raw",
    progress: bool = True,
    keep_trace: bool = False,
    cuda_graphs: bool | None = None,
    hybrid_m: int | None = None,
    **shape_overrides: int,
) -> ProfileResult:
    """Profile a prefill of `prompt_tokens` then `decode_tokens` decode steps of the model.

    On a GPU the default preset is `dsv4-flash-tp2` and times are GPU kernel times; without one
    it is `tiny`, the Triton kernels are replaced by their torch references, and times are CPU
    op times (the result's notes say so). `dense` is `bf16` (cuBLAS), `w8a16`, `w8a8` or
    `hybrid` (W8A16 up to `hybrid_m` rows, default $DENSE_HYBRID_M or 128, W8A8 above), the FP8
    ones on weights quantised once; `attention` is `torch` or `triton`. `prefill_chunk=None`
    prefills in one pass; `streams` tokens are decoded per step. `shape_overrides` change preset
    fields (e.g. `top_k=8`, `layers=2`). `cuda_graphs` (default: on a GPU) replays each decode
    step as a CUDA graph, as serving engines do; replayed kernels are attributed by their
    position in an eager run of the same step. Without `tp`, one process profiles one rank of
    the preset's tensor parallelism alone; `tp=N` runs N ranks through torch.distributed (NCCL
    on GPUs, gloo on CPUs) with their all-reduces, merged with a `rank` column and a rank-skew
    table (under torchrun, rank 0 returns the result and the other ranks None). Writes
    `out/<run-id>/` (with the gzipped Chrome trace too when `keep_trace`).
    """
    from workbench.capture.profile_run import resolve, run_profile
    from workbench.capture.tensor_parallel import run_profile_tp

    spec = resolve(
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
        cuda_graphs=cuda_graphs,
        tp=tp,
        shape_overrides=shape_overrides,
        hybrid_m=hybrid_m,
    )
    if tp is None:
        return run_profile(spec, out, progress, keep_trace)
    return run_profile_tp(spec, out, progress)
