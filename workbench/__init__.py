"""A profiling workbench for mixture-of-experts and dense GEMM kernels.

The facade. Analysis entry points (`load`, `load_trace`) import neither torch nor triton, so
artifacts captured on a GPU box are read anywhere; capture entry points (`profile`) import
them only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.errors import ArtifactError, WorkbenchError
from workbench.views.profile import Comparison, ProfileResult, load, load_trace

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from workbench.views.ncu import NcuResult

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
    from workbench.views.experiments import view_sweep

    return view_sweep(_sweep(kernel, param, values, tokens, **options))


def ab(a: dict, b: dict, tokens, **options):
    """Two settings of the same workload, with the ratio b/a and its 95% interval per size
    (see `workbench.capture.experiments.ab`)."""
    from workbench.capture.experiments import ab as _ab

    return _ab(a, b, tokens, **options)


def load_sweep(run_dir: str | Path):
    """A sweep from its run directory, without a GPU or torch."""
    from workbench.views.experiments import load_sweep as _load_sweep

    return _load_sweep(run_dir)


def load_ab(run_dir: str | Path):
    """An A/B run from its run directory, without a GPU or torch."""
    from workbench.analysis.experiments import load_ab as _load_ab

    return _load_ab(run_dir)


def load_ncu(path: str | Path) -> NcuResult:
    """An Nsight Compute report (the workbench's or anyone's) as tables and figures.

    Imported on use: it needs NVIDIA's `ncu_report` module, which a bare GPU box may lack
    (ncu ships one under its `extras/python`).
    """
    from workbench.views.ncu import load_ncu as _load_ncu

    return _load_ncu(path)


def ncu(
    kernel: str = "moe",
    variant: str = "stock",
    tokens: int | Sequence[int] = (6, 4096),
    out: str | Path = "ncu",
    **params: object,
) -> NcuResult:
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
    out: str | Path = "raw",
    progress: bool = True,
    keep_trace: bool = False,
    **settings: object,
) -> ProfileResult:
    """Profile a prefill of `prompt_tokens` then `decode_tokens` decode steps of the model.

    On a GPU the default preset is `dsv4-flash-tp2` and times are GPU kernel times; without one
    it is `tiny`, the Triton kernels are replaced by their torch references, and times are CPU
    op times (the result's notes say so). `settings` are the profile parameters below (one
    table, `workbench.workloads.profile_params`, which the CLI reads too) and preset fields as
    shape overrides (e.g. `top_k=8`, `layers=2`). With CUDA graphs (the GPU default) each decode
    step is replayed as a graph, as serving engines do, and replayed kernels are attributed by
    their position in an eager run of the same step. Without `tp`, one process profiles one
    rank of the preset's tensor parallelism alone; `tp=N` runs N ranks through
    torch.distributed (NCCL on GPUs, gloo on CPUs) with their all-reduces, merged with a `rank`
    column and a rank-skew table (under torchrun, rank 0 returns the result and the other ranks
    None). Writes `out/<run-id>/` (with the gzipped Chrome trace too when `keep_trace`).

    Parameters (name=default: meaning):
    """
    import sys
    import time

    begun = time.perf_counter()
    first = "workbench.capture.profile_run" not in sys.modules  # torch, triton, the kernels
    from workbench.artifacts import check_output_dir
    from workbench.capture.profile_run import resolve, run_profile
    from workbench.capture.tensor_parallel import run_profile_tp
    from workbench.views.profile import view
    from workbench.workloads.profile_params import split_settings

    import_s = time.perf_counter() - begun if first else None
    check_output_dir(out)
    params, overrides = split_settings(settings)
    spec = resolve(prompt_tokens, decode_tokens, **params, shape_overrides=overrides)
    if spec.tp is None:
        return view(run_profile(spec, out, progress, keep_trace, begun=begun, import_s=import_s))
    result = run_profile_tp(spec, out, progress)
    return None if result is None else view(result)


def _document_profile_parameters() -> None:
    from workbench.workloads.profile_params import describe

    profile.__doc__ = (profile.__doc__ or "") + describe().replace("\n", "\n    ") + "\n"


_document_profile_parameters()
