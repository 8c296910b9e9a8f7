"""Top-k sparse attention over one shared latent KV head, as one Triton kernel (plus a combine
for the decode form).

Every query attends to the cache rows its index names (its top-k picks and its sliding
window; -1 marks an unused slot), with keys and values the same latent row, as in MLA. All
heads of a query share those rows, so a program takes a block of heads of one query and
gathers each selected row once for all of them, with a flash-attention online softmax in fp32.

Prefill has thousands of queries, so one program per (query, head block) fills the GPU.
Decode has one to a few queries: the selected slots are then split across programs that
each write an unnormalised partial (sum, max, denominator), and a second kernel combines
them (flash-decoding). A query with no valid slot gets zeros, never NaN; the -inf of masked
slots never meets another -inf in a subtraction.
"""

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch, recording
from kernels.moe.routing import dot_options, planned_sms

LOG2E = 1 / math.log(2)  # the kernel works in powers of two: exp(x) = exp2(x * LOG2E)


@triton.jit
def _sparse_attention_kernel(
    q_ptr, kv_ptr, index_ptr, out_ptr, part_ptr, stats_ptr, Q, heads, n_sel, per_split,
    scale_log2, stride_qq, stride_qh, stride_kv, stride_iq, stride_oq, stride_oh,
    DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One (query, head block, split): scores.T = kv @ q.T and out.T = kv.T @ p.T, transposed
    so the gathered rows (BLOCK_N, then D) are the MMA's M side and the heads its N side.

    With 32 heads a rank, heads as the M side (q @ kv.T) is below Hopper's 64-row wgmma and
    both products compiled to mma.sync (PTX, Triton 3.6); transposed, the output product (D =
    512 rows) compiles to wgmma, and so does the score product from 64 rows a step (at the
    default 32 it stays on mma.sync). On the H200 a 4096-query chunk at 46K context took 1.18
    ms against 1.54 for the untransposed kernel at its defaults, and a decode query 10.7 us
    against 11.3 (one run, raw/logs/h200-tune-attention-20261201T0616.csv)."""
    query = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    h_ok = h < heads
    d = tl.arange(0, BLOCK_D)
    d_ok = d < DIM
    q_t = tl.load(q_ptr + query * stride_qq + h[None, :] * stride_qh + d[:, None],
                  mask=h_ok[None, :] & d_ok[:, None], other=0.0)  # fmt: skip
    if UPCAST:
        q_t = q_t.to(tl.float32)
    m = tl.full((BLOCK_H,), float("-inf"), tl.float32)  # running max, log2 units
    l = tl.zeros((BLOCK_H,), tl.float32)  # noqa: E741 (the softmax denominator, as in papers)
    acc_t = tl.zeros((BLOCK_D, BLOCK_H), tl.float32)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, n_sel)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        idx = tl.load(index_ptr + query * stride_iq + n, mask=n < hi, other=-1)
        valid = idx >= 0
        kv = tl.load(kv_ptr + idx.to(tl.int64)[:, None] * stride_kv + d[None, :],
                     mask=valid[:, None] & d_ok[None, :], other=0.0)  # fmt: skip
        if UPCAST:
            kv = kv.to(tl.float32)
        s_t = tl.dot(kv, q_t, input_precision=PRECISION) * scale_log2
        s_t = tl.where(valid[:, None], s_t, float("-inf"))
        m_new = tl.maximum(m, tl.max(s_t, axis=0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: any finite
        alpha = tl.exp2(m - m_ref)
        p_t = tl.exp2(s_t - m_ref[None, :])
        l = l * alpha + tl.sum(p_t, axis=0)  # noqa: E741
        acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(kv), p_t.to(kv.dtype),
                                                input_precision=PRECISION)  # fmt: skip
        m = m_new
    if SPLIT:
        row = (split * Q + query) * heads + h  # part (splits, Q, heads, D), stats (..., 2)
        tl.store(part_ptr + row[None, :] * DIM + d[:, None], acc_t,
                 mask=h_ok[None, :] & d_ok[:, None])  # fmt: skip
        tl.store(stats_ptr + row * 2, m, mask=h_ok)
        tl.store(stats_ptr + row * 2 + 1, l, mask=h_ok)
    else:
        out_t = acc_t / tl.where(l > 0, l, 1.0)[None, :]  # no valid slot: acc is 0, so is out
        tl.store(out_ptr + query * stride_oq + h[None, :] * stride_oh + d[:, None],
                 out_t.to(out_ptr.dtype.element_ty),
                 mask=h_ok[None, :] & d_ok[:, None])  # fmt: skip


@triton.jit
def _sparse_combine_kernel(
    part_ptr, stats_ptr, out_ptr, Q, heads, splits, stride_oq, stride_oh,
    DIM: tl.constexpr, SPLITS_P: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One (query, head) a program, every split's partial loaded at once: a loop over splits
    in a few programs made one dependent load after another (10.9 us for one decode query on
    the H200, ncu/attention-fp8-T1-partattend, 65% of its stalls waiting on memory)."""
    query = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    split = tl.arange(0, SPLITS_P)
    split_ok = split < splits
    row = (split * Q + query) * heads + h  # part (splits, Q, heads, D), stats (..., 2)
    m_s = tl.load(stats_ptr + row * 2, mask=split_ok, other=float("-inf"))
    l_s = tl.load(stats_ptr + row * 2 + 1, mask=split_ok, other=0.0)
    m = tl.max(m_s, axis=0)
    weight = tl.exp2(m_s - tl.where(m == float("-inf"), 0.0, m))  # empty splits: 0
    l = tl.sum(l_s * weight, axis=0)  # noqa: E741 (the softmax denominator, as in papers)
    d = tl.arange(0, BLOCK_D)
    part = tl.load(part_ptr + row[:, None] * DIM + d[None, :],
                   mask=split_ok[:, None] & (d < DIM)[None, :], other=0.0)  # fmt: skip
    out = tl.sum(part * weight[:, None], axis=0) / tl.where(l > 0, l, 1.0)
    tl.store(out_ptr + query * stride_oq + h * stride_oh + d,
             out.to(out_ptr.dtype.element_ty), mask=d < DIM)  # fmt: skip


def _check(q: Tensor, kv: Tensor, index: Tensor) -> None:
    if (
        q.dim() != 3
        or kv.dim() != 2
        or kv.shape[1] != q.shape[2]
        or index.dim() != 2
        or index.shape[0] != q.shape[0]
    ):
        raise ValueError(
            f"sparse_attention expects q (Q, heads, D), kv (N, D), index (Q, n_sel); got "
            f"{tuple(q.shape)}, {tuple(kv.shape)}, {tuple(index.shape)}"
        )
    if 0 in q.shape or index.shape[1] == 0:
        raise ValueError("sparse_attention needs at least one query, head and selected slot.")
    if q.dtype != kv.dtype or q.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"q and kv must both be bf16 or fp32, got {q.dtype} and {kv.dtype}.")
    if index.is_floating_point():
        raise ValueError(f"index must be an integer tensor of cache rows, got {index.dtype}.")
    if q.stride(2) != 1 or kv.stride(1) != 1 or index.stride(1) != 1:
        raise ValueError("q, kv and index must be contiguous in their last dim.")


def default_splits(queries: int, head_blocks: int, n_blocks: int, device: torch.device) -> int:
    """Splits of the selected slots: 1 when queries fill the GPU (prefill), else enough for
    about two programs per SM, down to one slot block a split (decode: one query's 640 slots
    in 10 splits took 11.3 us on the H200 against 14.5 in 5 of two blocks each,
    raw/logs/h200-tune-attention.csv)."""
    programs = queries * head_blocks
    sms = planned_sms(device)
    if programs >= 2 * sms:
        return 1
    return max(1, min(n_blocks, triton.cdiv(2 * sms, programs)))


def sparse_attention_triton(
    q: Tensor,
    kv: Tensor,
    index: Tensor,
    scale: float | None = None,
    block_h: int | None = None,
    block_n: int = 32,
    splits: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> Tensor:
    """Attention of each query over the kv rows named by `index` (-1 = unused), (Q, heads, D),
    as `reference.sparse_attention` defines it (scale defaults to D**-0.5). Index values must
    be -1 or rows of kv (not checked: that would read the index back, a sync).

    `splits` of the selected slots default to `default_splits`. 32 rows a step and 4 warps:
    on the H200 a 4096-query chunk at 46K context took 1.18 ms so, 1.26 at 8 warps and 1.27
    at 64 rows a step (raw/logs/h200-tune-attention-20261201T0616.csv); the (D, block_h)
    fp32 accumulator then takes 128 registers a thread at D=512, without spills. `block_h`
    defaults to 32 heads where queries fill the GPU (each gathered row
    then serves twice the heads: 1.39 ms against 2.24 at 16 for a 4096-query chunk at 46K
    context on the H200, raw/logs/h200-tune-attention.csv) and to 16 for decode, where 32
    spilled and took 32 us against 18."""
    _check(q, kv, index)
    (num_q, heads, dim), n_sel = q.shape, index.shape[1]
    scale = dim**-0.5 if scale is None else scale
    if block_h is None:
        sms = planned_sms(q.device)
        block_h = 32 if num_q * triton.cdiv(heads, 32) >= 2 * sms else 16
    block_h = min(block_h, max(16, triton.next_power_of_2(heads)))
    head_blocks, n_blocks = triton.cdiv(heads, block_h), triton.cdiv(n_sel, block_n)
    splits = splits or default_splits(num_q, head_blocks, n_blocks, q.device)
    per_split = triton.cdiv(n_blocks, min(splits, n_blocks)) * block_n
    splits = triton.cdiv(n_sel, per_split)  # no split left empty
    out = torch.empty_like(q)
    part = stats = out  # stand-ins the unsplit kernel never writes
    if splits > 1:
        part = torch.empty(splits, num_q, heads, dim, dtype=torch.float32, device=q.device)
        stats = torch.empty(splits, num_q, heads, 2, dtype=torch.float32, device=q.device)
    precision, upcast = dot_options(q.dtype)
    block_d = max(16, triton.next_power_of_2(dim))
    with recording():
        launch(
            _sparse_attention_kernel, (num_q, head_blocks, splits), q, kv, index, out, part,
            stats, num_q, heads, n_sel, per_split, scale * LOG2E, q.stride(0), q.stride(1),
            kv.stride(0), index.stride(0), out.stride(0), out.stride(1), DIM=dim,
            BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_D=block_d, SPLIT=splits > 1,
            PRECISION=precision, UPCAST=upcast, num_warps=num_warps, num_stages=num_stages,
        )  # fmt: skip
        if splits > 1:
            launch(
                _sparse_combine_kernel, (num_q, heads), part, stats, out, num_q, heads, splits,
                out.stride(0), out.stride(1), DIM=dim,
                SPLITS_P=triton.next_power_of_2(splits), BLOCK_D=block_d,
            )  # fmt: skip
    return out
