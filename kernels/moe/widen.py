"""Quantised expert weights widened to bf16 on the GPU, one projection at a time, so that the
Gluon bf16 prefill kernels (`bf16_wgmma`) can multiply FP8 and INT4 experts (W8A16, W4A16).

At prefill sizes the experts are compute-bound, and there the flat scheduler's Triton kernels,
which dequantise every weight tile inside the K loop, ran FP8 and INT4 experts at about 200
TFLOP/s on the H200 at T=33,863, against 490 for bf16 experts on the Gluon kernels
(raw/bench-moe-dsv4-flash-tp2-20261202T062755). Widening a projection's weights once is one
pass over them (at the TP2 rank's shape, gate/up's 4.5 GB of FP8 or 2.3 GB of INT4 read and
9 GB of bf16 written: 3.8 and 4.0 ms, down's 1.9 and 2.0), after which the bf16 kernels run as
on bf16 weights: in the newest bench at T=33,863 flat took 19.4 ms on FP8 and 20.1 on INT4
experts (INT4 0.73 of the TFLOP/s of flat on bf16 experts, 14.7 ms) against 35.4 and 35.6 ms
on the Triton kernels (raw/bench-moe-dsv4-flash-tp2-20261202T091055 and …T062755). The copy
lives for one projection: gate/up's is freed before down's is made, so the call holds at most
gate/up's bf16 weights (9 GB there) on top of its activations; where that memory is not free
the error says so and names wgmma=False. `flat.moe_flat` takes this path from `WIDEN_MIN_ROWS`
rows an expert. A served prefill in 4,096-token chunks (64 rows an expert here) stays on the
Triton kernels.

The values are the kernels' own: an FP8 value times its block's scale, or an INT4 code minus 8
times its group's scale, each rounded once to bf16. The Triton INT4 prefill tiles round the same
way; the Triton W8A16 tiles scale fp32 products instead, within half a bf16 step of these.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch
from kernels.moe.formats import INT4_RUN, MoeWeights

# Rows a program: on the H200 128 rows and 4 warps widened FP8 gate/up in 3.77 ms (3.6 TB/s),
# against 4.16 at 64 rows, and INT4's in 3.98 against 4.39; 256 rows or 8 warps gained nothing
# more (raw/logs/h200-moe-widen-rows-probe-df6f855-*.csv).
ROWS_PER_PROGRAM = 128
_HALF_RUN = tl.constexpr(INT4_RUN // 2)  # bytes a run of INT4 values
# From this mean of rows an active expert, moe_flat widens FP8 and INT4 experts for the Gluon
# kernels. On the H200 (uniform routing; raw/logs/h200-moe-widen-probe-023a535-*.csv and
# h200-moe-widen-crossing-probe-*.csv) the Triton kernels were 1% (FP8) and 3% (INT4) faster at
# 128 rows an expert, the widened experts 7% and 10% faster at 144, 21% and 14% at 192, 31%
# and 26% at 256.
WIDEN_MIN_ROWS = 144


@triton.jit
def _rounded(weight):
    """fp32 weights to bf16, to nearest (the interpreter truncates: within a bf16 step)."""
    return weight.to(tl.bfloat16, fp_downcast_rounding="rtne")


@triton.jit
def _widen_kernel(
    values_ptr, scales_ptr, out_ptr, counts_ptr, rows, n, k, stored_k, stride_ve, stride_vn,
    stride_se, stride_sn, stride_sk, stride_oe, stride_on, INT4: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, ACTIVE_ONLY: tl.constexpr,
):  # fmt: skip
    """Rows program_id(0) * BLOCK_R + [0, BLOCK_R) of the (E * N) weight rows, columns of the
    K block program_id(1) (BLOCK wide: one FP8 block or INT4 group), widened to bf16; with
    ACTIVE_ONLY, only the rows of experts whose count (counts_ptr) is not 0."""
    row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = row < rows
    expert = (row // n).to(tl.int64)
    if ACTIVE_ONLY:
        row_ok = row_ok & (tl.load(counts_ptr + expert, mask=row_ok, other=0) > 0)
    within = row % n
    block = tl.program_id(1)
    values = values_ptr + expert * stride_ve + within.to(tl.int64) * stride_vn
    out = out_ptr + expert * stride_oe + within.to(tl.int64) * stride_on
    if INT4:
        # a run of 16 values is 8 bytes: byte i holds value i (low nibble) and i + 8 (high);
        # the nibbles are put in K order in registers, so the stores are whole rows
        byte = block * (BLOCK // 2) + tl.arange(0, BLOCK // 2)
        packed = tl.load(values[:, None] + byte[None, :],
                         mask=row_ok[:, None] & (byte < stored_k)[None, :], other=0)  # fmt: skip
        RUNS: tl.constexpr = BLOCK // (2 * _HALF_RUN)
        nibbles = tl.join(tl.reshape(packed & 15, (BLOCK_R, RUNS, _HALF_RUN)),
                          tl.reshape(packed >> 4, (BLOCK_R, RUNS, _HALF_RUN)))  # fmt: skip
        codes = tl.reshape(tl.permute(nibbles, (0, 1, 3, 2)), (BLOCK_R, BLOCK))
        scale = tl.load(scales_ptr + expert * stride_se + within * stride_sn + block * stride_sk,
                        mask=row_ok, other=0.0).to(tl.float32)  # fmt: skip
        column = block * BLOCK + tl.arange(0, BLOCK)
        weight = (codes.to(tl.int32) - 8).to(tl.float32) * scale[:, None]
        tl.store(out[:, None] + column[None, :], _rounded(weight),
                 mask=row_ok[:, None] & (column < k)[None, :])  # fmt: skip
    else:
        column = block * BLOCK + tl.arange(0, BLOCK)
        ok = row_ok[:, None] & (column < k)[None, :]
        value = tl.load(values[:, None] + column[None, :], mask=ok, other=0.0).to(tl.float32)
        scale = tl.load(scales_ptr + expert * stride_se + within // BLOCK * stride_sn
                        + block * stride_sk, mask=row_ok, other=0.0)  # fmt: skip
        tl.store(out[:, None] + column[None, :], _rounded(value * scale[:, None]), ok)


def widened(weights: MoeWeights, projection: str, counts: Tensor | None = None) -> Tensor:
    """The `projection`'s ("gate_up" or "down") weights (E, N, K) in bf16: as stored for bf16
    experts, else a new tensor of the values the kernels multiply by (module docstring). Given
    the rows an expert (`counts`, on the device), the experts with none, which no tile reads,
    are left unwritten. On the H200 every expert had rows under both the bench's routings from
    16,384 tokens, and the check cost nothing measurable there (3.79 against 3.77 ms for FP8
    gate/up, raw/logs/h200-moe-widen-skewed-probe-*.csv)."""
    values = getattr(weights, projection)
    if weights.fmt == "bf16":
        return values
    scales = getattr(weights, f"{projection}_scale")
    experts, n, stored_k = values.shape
    k = weights.hidden if projection == "gate_up" else weights.inter
    try:
        out = torch.empty(experts, n, k, dtype=torch.bfloat16, device=values.device)
    except torch.OutOfMemoryError as error:
        raise torch.OutOfMemoryError(
            f"widening the experts' {projection} weights to bf16 for the Gluon prefill kernels "
            f"needs {experts * n * k * 2 / 2**30:.1f} GiB more GPU memory than is free; pass "
            "wgmma=False to dequantise them inside the Triton kernels instead."
        ) from error
    grid = (triton.cdiv(experts * n, ROWS_PER_PROGRAM), triton.cdiv(k, weights.block))
    launch(
        _widen_kernel, grid, values, scales, out, values if counts is None else counts,
        experts * n, n, k, stored_k, values.stride(0), values.stride(1), *scales.stride(),
        out.stride(0), out.stride(1), INT4=weights.fmt == "int4", BLOCK=weights.block,
        BLOCK_R=ROWS_PER_PROGRAM, ACTIVE_ONLY=counts is not None, num_warps=4,
    )  # fmt: skip
    return out
