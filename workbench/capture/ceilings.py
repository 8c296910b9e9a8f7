"""The device's ceilings, measured in the same run as the kernels they judge.

A kernel's time is reported against its physical floor: the bytes it must move at the copy
bandwidth measured here, or its FLOPs at the cuBLAS rate measured here.
Datasheet numbers are leads; these are readings. They are taken by the workbench's one timer
(capture.timing), in turns with each other as a benchmark's rows are, so a ceiling and the
kernels judged by it are sampled the same way. Timed alone, each after its warm period, the
8192-square GEMMs ran in the power-limited state of back-to-back large GEMMs: bf16 read
640-684 TFLOP/s and FP8 1222-1237 on the H200, against 684-730 and 1347-1420 in turns in
the same process (raw/logs/h200-ceilings-alone-vs-turns-*). With the rates taken alone,
cuBLAS's own bf16 layer, timed in turns with the other backends, ran at 0.96-0.99 of its
floor at 4,096-16,384 rows (raw/bench-dense-dsv4-flash-tp2-20261204T025138): a floor the
kernel beat. In turns it ran at 1.11-1.17 (raw/bench-dense-dsv4-flash-tp2-20261204T031004).
A floor must be a bound, so its rates come from the same turns-taking state as the rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workbench.capture.timing import Launch, time_launches


def _medians_ms(fns: dict[str, Callable[[], object]], device: torch.device) -> dict[str, float]:
    """Median ms of each of `fns` by the one timer, in turns, launched eagerly (each call is
    one large kernel)."""
    timings = time_launches([Launch(fn, 0, graph=False) for fn in fns.values()], device)
    for name, timing in zip(fns, timings, strict=True):
        if isinstance(timing, Exception):
            raise RuntimeError(f"the {name} ceiling could not be measured: {timing}") from timing
    return {name: timing.median_ms for name, timing in zip(fns, timings, strict=True)}


@torch.inference_mode()
def measure_ceilings(device: str | torch.device = "cuda", copy_gib: float = 2.0, n: int = 8192):
    """Copy bandwidth (bytes read + written per second), bf16 and FP8 GEMM rates (FLOP/s).

    Inputs are random (zeros run faster than real data and would flatter the ceilings).
    """
    dev = torch.device(device)
    elements = int(copy_gib * 2**30) // 2
    src = torch.randn(elements, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    fns = {"copy": lambda: dst.copy_(src), "bf16": lambda: a @ b}
    if hasattr(torch, "_scaled_mm"):
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major second operand
        one = torch.ones((), device=dev)
        fns["fp8"] = lambda: torch._scaled_mm(
            a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16
        )
    ms = _medians_ms(fns, dev)
    result = {
        "copy_bytes_per_s": 2 * src.numel() * 2 / (ms["copy"] / 1e3),
        "bf16_flops": 2 * n**3 / (ms["bf16"] / 1e3),
        "gemm_size": n,
        "copy_gib": copy_gib,
    }
    if "fp8" in ms:
        result["fp8_flops"] = 2 * n**3 / (ms["fp8"] / 1e3)
    return result
