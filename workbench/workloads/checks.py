"""One reference check for every workload: the relative error and the tolerance table.

A kernel's output is compared with its fp32 reference before it is timed; a wrong kernel is
reported `wrong` and never timed. The bounds: bf16 arithmetic lands near 1e-3 to 1e-2; FP8
weights checked against the dequantised weights they hold stay inside 2e-2 (W*A16) and W8A8
(activations quantised too) inside 5e-2; the interpreter's fp32 CPU runs are held to 1e-4
where a kernel computes in fp32 throughout.
"""

from __future__ import annotations

import torch

from kernels.moe import W8A8_VARIANTS
from workbench.errors import WorkbenchError

# (workload, variant or weight format) -> the largest relative error that passes.
TOLERANCE: dict[tuple[str, str], float] = {
    ("moe", "bf16"): 2e-2,
    ("moe", "fp8"): 2e-2,
    ("moe", "int4"): 2e-2,
    ("moe", "w8a16"): 2e-2,  # a peer's FP8 weights with bf16 activations: as fp8
    # A peer that quantises x and h to E4M3 (3 mantissa bits) against a reference that quantises
    # neither: DeepGEMM measured 0.046-0.047 on the H200 at E=384, the rounding of E4M3 alone.
    ("moe", "w8a8"): 8e-2,
    ("dense", "bf16"): 1e-2,
    ("dense", "w8a16"): 1e-2,
    ("dense", "w4a16"): 1e-2,  # a peer's INT4 weights against the dequantised INT4 it holds
    ("dense", "w8a8"): 5e-2,
    ("dense", "hybrid"): 5e-2,
    ("attention", "bf16"): 1e-2,
}


def tolerance(workload: str, key: str) -> float:
    """The bound for `workload` run as `key` (a weight format or a dense variant)."""
    try:
        return TOLERANCE[(workload, key)]
    except KeyError:
        known = ", ".join(f"{w}/{k}" for w, k in TOLERANCE)
        raise WorkbenchError(f"no tolerance for {workload}/{key}; known: {known}") from None


def moe_check_key(variant: str, fmt: str) -> str:
    """The tolerance key of MoE `variant` on `fmt` experts: its format, except for the variants
    that quantise the activations too (`kernels.moe.W8A8_VARIANTS`), held to W8A8's bound."""
    return "w8a8" if variant in W8A8_VARIANTS else fmt


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN when out has a NaN or inf, so it never passes."""
    out64, ref64 = out.double(), ref.double()
    if not bool(torch.isfinite(out64).all()):
        return float("nan")
    return (out64 - ref64).norm().item() / max(ref64.norm().item(), 1e-30)


def passes(error: float, workload: str, key: str) -> bool:
    """Whether `error` is within the bound (NaN never is)."""
    return error <= tolerance(workload, key)
