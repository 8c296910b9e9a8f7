"""MoE grouped GEMM scheduled like the exl3 "stock" kernel.

Each program owns one N tile and a round-robin share of the experts (expert e goes to group
e % groups), and finds its experts' rows by walking ALL expert counts serially with a running
offset. That serial scan is the point of this variant: it is the stock kernel's schedule, and the
profiler should show its cost against the multirow/flat/padded schedulers.

Two launches: gate/up with a SiLU epilogue into a sorted intermediate h_sorted (T*K, I), then
down from h_sorted into per-slot fp32 outputs y_slots (T*K, H) scaled by the routing weight,
which torch sums over the K slots of each token. y_slots stays fp32 so the only roundings to
x.dtype are h (as in moe_reference) and the final sum.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.moe.routing import default_groups, dot_options, sort_slots, validate_moe_inputs


@triton.jit
def _mma(acc, a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b; UPCAST (interpreter only, see routing.dot_options) widens bf16 first."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    h_ptr,
    sorted_slots_ptr,
    counts_ptr,
    num_experts,
    hidden,
    inter,
    stride_xt,
    stride_xh,
    stride_we,
    stride_wn,
    stride_wh,
    stride_hr,
    stride_hi,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    group = tl.program_id(0)
    groups = tl.num_programs(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < inter
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)

    row_start = group * 0  # first sorted row of the current expert
    w_expert = w_ptr  # advanced by one expert per step: no 32-bit overflow of e * stride_we
    for expert in range(0, num_experts):
        count = tl.load(counts_ptr + expert)
        own_count = tl.where(expert % groups == group, count, 0)  # 0 rows: skip the expert
        w_gate = w_expert + offs_n[None, :] * stride_wn
        w_up = w_gate + inter * stride_wn
        for m0 in range(0, own_count, BLOCK_M):
            rows = m0 + offs_m
            row_mask = rows < count
            sorted_rows = (row_start + rows).to(tl.int64)
            slots = tl.load(sorted_slots_ptr + sorted_rows, mask=row_mask, other=0)
            x_rows = x_ptr + (slots // TOP_K).to(tl.int64)[:, None] * stride_xt
            gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, hidden, BLOCK_K):
                ks = k0 + offs_k
                k_mask = ks < hidden
                a = tl.load(
                    x_rows + ks[None, :] * stride_xh,
                    mask=row_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                w_mask = k_mask[:, None] & n_mask[None, :]
                wg = tl.load(w_gate + ks[:, None] * stride_wh, mask=w_mask, other=0.0)
                wu = tl.load(w_up + ks[:, None] * stride_wh, mask=w_mask, other=0.0)
                gate = _mma(gate, a, wg, PRECISION, UPCAST)
                up = _mma(up, a, wu, PRECISION, UPCAST)
            h = gate * tl.sigmoid(gate) * up
            tl.store(
                h_ptr + sorted_rows[:, None] * stride_hr + offs_n[None, :] * stride_hi,
                h.to(h_ptr.dtype.element_ty),
                mask=row_mask[:, None] & n_mask[None, :],
            )
        row_start += count
        w_expert += stride_we


@triton.jit
def _down_kernel(
    h_ptr,
    w_ptr,
    y_ptr,
    sorted_slots_ptr,
    counts_ptr,
    slot_weights_ptr,
    num_experts,
    hidden,
    inter,
    stride_hr,
    stride_hi,
    stride_we,
    stride_wn,
    stride_wi,
    stride_ys,
    stride_yh,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    group = tl.program_id(0)
    groups = tl.num_programs(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < hidden
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)

    row_start = group * 0
    w_expert = w_ptr
    for expert in range(0, num_experts):
        count = tl.load(counts_ptr + expert)
        own_count = tl.where(expert % groups == group, count, 0)
        w_tile = w_expert + offs_n[None, :] * stride_wn
        for m0 in range(0, own_count, BLOCK_M):
            rows = m0 + offs_m
            row_mask = rows < count
            sorted_rows = (row_start + rows).to(tl.int64)
            h_rows = h_ptr + sorted_rows[:, None] * stride_hr
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, inter, BLOCK_K):
                ks = k0 + offs_k
                k_mask = ks < inter
                a = tl.load(
                    h_rows + ks[None, :] * stride_hi,
                    mask=row_mask[:, None] & k_mask[None, :],
                    other=0.0,
                )
                w = tl.load(
                    w_tile + ks[:, None] * stride_wi,
                    mask=k_mask[:, None] & n_mask[None, :],
                    other=0.0,
                )
                acc = _mma(acc, a, w, PRECISION, UPCAST)
            slots = tl.load(sorted_slots_ptr + sorted_rows, mask=row_mask, other=0).to(tl.int64)
            acc *= tl.load(slot_weights_ptr + slots, mask=row_mask, other=0.0)[:, None]
            tl.store(
                y_ptr + slots[:, None] * stride_ys + offs_n[None, :] * stride_yh,
                acc.to(y_ptr.dtype.element_ty),
                mask=row_mask[:, None] & n_mask[None, :],
            )
        row_start += count
        w_expert += stride_we


def _check_blocks(block_m: int, block_n: int, block_k: int) -> None:
    for name, size in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        if size < 16 or size & (size - 1):
            raise ValueError(
                f"{name}={size} must be a power of two >= 16 (tl.arange and tl.dot need it)."
            )


def moe_stock(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    *,
    groups: int | None = None,
    block_m: int = 16,
    block_n: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
    num_stages: int = 3,
) -> Tensor:
    """Routed-expert output (T, H) in x.dtype; same contract as moe_reference.

    `groups` is the number of programs sharing each N tile (experts dealt round-robin); it
    defaults to one per 8 SMs. The routing prep (sort, counts) runs in torch and is part of what
    this variant costs.
    """
    shape = validate_moe_inputs(x, topk_ids, topk_weights, w_gate_up, w_down)
    _check_blocks(block_m, block_n, block_k)
    groups = default_groups(x.device) if groups is None else groups
    if groups < 1:
        raise ValueError(f"groups={groups} must be >= 1 (or None for the default).")
    sorted_slots, counts = sort_slots(topk_ids, shape.experts)
    slot_weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    precision, upcast = dot_options(x.dtype)
    num_slots = shape.tokens * shape.top_k

    h_sorted = torch.empty(num_slots, shape.inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(groups, triton.cdiv(shape.inter, block_n))](
        x,
        w_gate_up,
        h_sorted,
        sorted_slots,
        counts,
        shape.experts,
        shape.hidden,
        shape.inter,
        *x.stride(),
        *w_gate_up.stride(),
        *h_sorted.stride(),
        TOP_K=shape.top_k,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PRECISION=precision,
        UPCAST=upcast,
        num_warps=num_warps,
        num_stages=num_stages,
    )

    y_slots = torch.empty(num_slots, shape.hidden, dtype=torch.float32, device=x.device)
    _down_kernel[(groups, triton.cdiv(shape.hidden, block_n))](
        h_sorted,
        w_down,
        y_slots,
        sorted_slots,
        counts,
        slot_weights,
        shape.experts,
        shape.hidden,
        shape.inter,
        *h_sorted.stride(),
        *w_down.stride(),
        *y_slots.stride(),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PRECISION=precision,
        UPCAST=upcast,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return y_slots.view(shape.tokens, shape.top_k, shape.hidden).sum(1).to(x.dtype)
