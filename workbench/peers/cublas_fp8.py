"""cublas_fp8: dense W8A8 with DeepSeek's blocks through cuBLAS, as `torch` exposes it.

What a server without DeepGEMM runs for a DeepSeek-style FP8 checkpoint: activations quantised
per token and 128-wide K block (scale_a, 1x128), weights in 128x128 blocks (scale_b), one
cuBLASLt GEMM that applies both (`torch.nn.functional.scaled_mm` with
`ScalingType.BlockWise1x128` x `BlockWise128x128`; cuBLAS >= 12.9, SM90 only). The timed call
includes the activation quantiser, as a served step does: the workbench's one-launch Triton
quantiser (`kernels.dense.quantize_activations`, power-of-two scales), which writes scale_a
token-fastest, the layout cuBLAS reads, so no transpose copy runs.

Layouts torch checks (`_scaled_mm_v2`, aten ScaledBlas.cpp): scale_a is (M, K/128) with
strides (1, M); scale_b is (L4, N/128) with strides (1, L4), L4 = K/128 rounded up to a
multiple of 4 (cuBLAS's rule, which `scaled_mm` checks since pytorch#166752; the older
`torch._scaled_mm`, which infers the recipe from the scales' shapes, took the unpadded layout
and answered silently wrong when (K/128) % 4 != 0, as three of the layer's K do). cuBLAS
answers NOT_SUPPORTED below 16 rows and wants the scale_a stride M 16-byte aligned, so M is
padded to at least 16 and a multiple of 4 (a zero-row pad inside the timed call, as vLLM pads)
and the result sliced back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.dense import DenseWeights, quantize_activations
from workbench.errors import WorkbenchError

BLOCK = 128
MIN_ROWS = 16  # cuBLAS's blockwise FP8 GEMM: NOT_SUPPORTED below this
ROW_ALIGN = 4  # fp32 scale_a's stride M in whole 16-byte units


def _blockwise_api() -> str | None:
    """None when this torch has the blockwise scaled_mm; else why not, naming the version."""
    scaling = getattr(F, "ScalingType", None)
    if not hasattr(F, "scaled_mm") or not hasattr(scaling, "BlockWise128x128"):
        return (
            f"torch {torch.__version__} has no torch.nn.functional.scaled_mm with "
            "ScalingType.BlockWise1x128/BlockWise128x128 (added after torch 2.9)"
        )
    return None


def available() -> tuple[bool, str]:
    """Whether cuBLAS's DeepSeek-style FP8 GEMM can run here (torch API, GPU, CUDA build)."""
    missing = _blockwise_api()
    if missing:
        return False, missing
    if not torch.cuda.is_available():
        return False, "no CUDA GPU: cuBLAS's blockwise FP8 GEMM runs on SM90 (Hopper) only"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return False, f"cuBLAS's blockwise FP8 GEMM runs on SM90 only, not sm_{major}{minor}"
    cuda = tuple(int(p) for p in (torch.version.cuda or "0.0").split(".")[:2])
    if cuda < (12, 9):
        why = f"torch {torch.__version__} is built with CUDA {torch.version.cuda}"
        return False, f"{why}; blockwise FP8 scaling needs cuBLAS >= 12.9"
    return True, f"torch {torch.__version__}, CUDA {torch.version.cuda}"


def padded_rows(m: int) -> int:
    """Rows the GEMM runs for M tokens: at least MIN_ROWS, a multiple of ROW_ALIGN."""
    return max(MIN_ROWS, -(-m // ROW_ALIGN) * ROW_ALIGN)


def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """(values fp8 (R, K), scale_a fp32 (R, K/128) strides (1, R)) of x (M, K), R =
    padded_rows(M); padded rows are zeros (scale 1), so they add nothing to real rows."""
    m = x.shape[0]
    rows = padded_rows(m)
    if rows != m:
        x = F.pad(x, (0, 0, 0, rows - m))
    return quantize_activations(x, BLOCK, outer_major=True)


def weight_scales(scales: Tensor) -> Tensor:
    """scale_b from DenseWeights' (N/128, K/128) block scales: K blocks padded to L4 (a
    multiple of 4) and read K-fastest, shape (L4, N/128), strides (1, L4)."""
    return F.pad(scales, (0, -scales.shape[1] % 4)).contiguous().t()


def _check_weights(weights: DenseWeights) -> None:
    if weights.fmt != "fp8" or weights.block != BLOCK:
        raise ValueError(
            f"cublas_fp8 takes FP8 weights in {BLOCK}x{BLOCK} blocks, got {weights.fmt} with "
            f"block {weights.block}; quantise with DenseWeights.quantize(w, 'fp8', {BLOCK})."
        )
    n, k = weights.values.shape
    if n % 16 or k % 16:
        raise ValueError(f"cuBLAS FP8 GEMMs need N and K divisible by 16, got N={n}, K={k}.")


def prepare(weights: DenseWeights) -> Callable[[Tensor], Tensor]:
    """The peer's linear(x) for one weight; runs it once on zeros, so a torch or cuBLAS that
    refuses the blockwise form fails here, with its version named, not inside a timed call."""
    _check_weights(weights)
    missing = _blockwise_api()
    if missing:
        raise WorkbenchError(missing)
    values, scale_b = weights.values, weight_scales(weights.scales)

    def linear(x: Tensor) -> Tensor:
        q, scale_a = quantize(x)
        y = F.scaled_mm(
            q, values.t(), scale_a, F.ScalingType.BlockWise1x128, scale_b,
            F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16,
        )  # fmt: skip
        return y[: x.shape[0]]

    probe = torch.zeros(1, values.shape[1], dtype=torch.bfloat16, device=values.device)
    try:
        linear(probe)
    except (RuntimeError, NotImplementedError, ValueError) as err:
        raise WorkbenchError(
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot run cuBLAS's "
            f"blockwise FP8 GEMM (1x128 x 128x128): {type(err).__name__}: {err}"
        ) from err
    return linear
