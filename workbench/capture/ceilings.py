"""The device's ceilings, measured in the same run as the kernels they judge.

A kernel's time is reported against its physical floor: the bytes it must move at the copy
bandwidth measured here, or its FLOPs at the cuBLAS rate measured here.
Datasheet numbers are leads; these are readings. They are taken by the workbench's one timer
(capture.timing), in turns with each other as a benchmark's rows are, so a ceiling and the
kernels judged by it are sampled the same way. Timed alone, each after its warm period, the
8192-square bf16 GEMM read 687 TFLOP/s in a bench where cuBLAS's own bf16 layer, timed in
turns with the other backends, then ran at 0.96-0.99 of the floor that rate gave it at
4,096-16,384 rows (raw/bench-dense-dsv4-flash-tp2-20261204T025138): a floor the kernel beat.
With the ceilings in turns the layer ran at 1.11-1.17 of its floor
(raw/bench-dense-dsv4-flash-tp2-20261204T031004). Alternated in one process, in turns read
higher than alone in five of six rounds for FP8 (median 1,328 against 1,223 TFLOP/s) and four
of six for bf16 (704 against 682), but one way's readings spread by up to 20% within a
process (raw/logs/h200-ceilings-alone-vs-turns-*; scripts/ceilings_alone_vs_turns.py). So a
compute floor is good to about a tenth: a prefill row's ratio to it between 0.9 and 1.1 does
not say whether the row is below or above what the GEMM ceiling allows, and cuBLAS's layer at
1.11-1.17 is just outside that. The GEMMs take their turns with the copy, a memory-bound
kernel that draws less power, where a prefill row's turns are with other GEMMs; how much
that lifts the GEMM rates has not been measured apart.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workbench.capture.timing import Launch, time_launches


def ceiling_work(
    device: torch.device, copy_gib: float = 2.0, n: int = 8192
) -> dict[str, tuple[Callable[[], object], float]]:
    """Each ceiling's launch and the work one call does: "copy" (bytes read + written),
    "bf16" and, where torch has `_scaled_mm`, "fp8" (FLOPs of an n-square GEMM).

    Inputs are random (zeros run faster than real data and would flatter the ceilings).
    """
    elements = int(copy_gib * 2**30) // 2
    src = torch.randn(elements, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    flops = 2.0 * n**3
    work = {"copy": (lambda: dst.copy_(src), 2.0 * src.numel() * 2), "bf16": (lambda: a @ b, flops)}
    if hasattr(torch, "_scaled_mm"):
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major second operand
        one = torch.ones((), device=device)
        work["fp8"] = (
            lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            flops,
        )
    return work


@torch.inference_mode()
def measure_ceilings(
    device: str | torch.device = "cuda",
    copy_gib: float = 2.0,
    n: int = 8192,
    on_rounds: Callable[[], object] | None = None,
):
    """Copy bandwidth (bytes read + written per second), bf16 and FP8 GEMM rates (FLOP/s),
    timed in turns by the one timer, launched eagerly (each call is one large kernel);
    `on_rounds` as `time_launches` takes it."""
    dev = torch.device(device)
    work = ceiling_work(dev, copy_gib, n)
    launches = [Launch(fn, 0, graph=False) for fn, _ in work.values()]
    timings = time_launches(launches, dev, on_rounds=on_rounds)
    rates = {}
    for (name, (_, amount)), timing in zip(work.items(), timings, strict=True):
        if isinstance(timing, Exception):
            raise RuntimeError(f"the {name} ceiling could not be measured: {timing}") from timing
        rates[name] = amount / (timing.median_ms / 1e3)
    result = {"copy_bytes_per_s": rates["copy"], "bf16_flops": rates["bf16"], "gemm_size": n,
              "copy_gib": copy_gib}  # fmt: skip
    if "fp8" in rates:
        result["fp8_flops"] = rates["fp8"]
    return result
