"""The device's ceilings, measured in the same run as the kernels they judge.

A kernel's time is reported against its physical floor: the bytes it must move at the copy
bandwidth measured here, or its FLOPs at the cuBLAS rate measured here.
Datasheet numbers are leads; these are readings. They are taken by the workbench's one timer
(capture.timing), so a ceiling and the kernels judged by it start from the same warm GPU:
the ceilings used to be timed apart, 3 calls and 20 samples straight after the GPU had idled,
inside the slow period the timer now waits out (whether a copy or a large GEMM slows in it as
the MoE decode kernels did has not been measured).
"""

from __future__ import annotations

import torch

from workbench.capture.timing import time_launch


def _median_ms(fn, device: torch.device) -> float:
    """Median ms of `fn` by the one timer, launched eagerly (each call is one large kernel)."""
    return time_launch(fn, device, tokens=0, graph=False).median_ms


@torch.inference_mode()
def measure_ceilings(device: str | torch.device = "cuda", copy_gib: float = 2.0, n: int = 8192):
    """Copy bandwidth (bytes read + written per second), bf16 and FP8 GEMM rates (FLOP/s).

    Inputs are random (zeros run faster than real data and would flatter the ceilings).
    """
    dev = torch.device(device)
    elements = int(copy_gib * 2**30) // 2
    src = torch.randn(elements, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), dev)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    bf16_ms = _median_ms(lambda: a @ b, dev)
    result = {
        "copy_bytes_per_s": 2 * src.numel() * 2 / (copy_ms / 1e3),
        "bf16_flops": 2 * n**3 / (bf16_ms / 1e3),
        "gemm_size": n,
        "copy_gib": copy_gib,
    }
    if hasattr(torch, "_scaled_mm"):
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major second operand
        one = torch.ones((), device=dev)
        fp8_ms = _median_ms(
            lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            dev,
        )
        result["fp8_flops"] = 2 * n**3 / (fp8_ms / 1e3)
    return result
