"""Fused glue: RMSNorm (with the residual add before it), SiLU-and-multiply, the router's
top-k with its softmax, and RoPE on every query and key head of a layer, one launch each.

Serving engines fuse the elementwise work between GEMMs because, at decode sizes, each torch op
is a launch of a few microseconds that moves almost nothing: the torch `rms_norm` reference is
nine launches (casts, square, mean, rsqrt, two multiplies), the residual add another, the
shared expert's SiLU five. These kernels do each in one pass over a row, rounding where the
references round (the residual sum is stored in the activation dtype and normalised from that
stored value; SiLU is computed in fp32 and stored in the activation dtype), so they agree with
`kernels.norm.rms_norm` and the torch SiLU to the last bit up to fp32 summation order. The
router's top-k (`kernels.moe.router_topk`: a cast, torch.topk's two kernels, a softmax and an
index cast, five launches) is one program per token that keeps its experts' logits in registers.
"""

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch
from kernels.rope import ROPE_THETA

SILU_BLOCK = 1024  # columns of the SiLU-and-multiply per program


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, N, stride_x, stride_r, stride_y, stride_s, eps,
    BLOCK: tl.constexpr, RESIDUAL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(s_ptr + row * stride_s + cols, x, mask=mask)
    x = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (x * inv_rms * w).to(y_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


def _rows(x: Tensor) -> Tensor:
    """x as (rows, last dim) with unit stride along the last dim."""
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(-1) == 1 else flat.contiguous()


def rms_norm_fused(
    x: Tensor, weight: Tensor, eps: float = 1e-6, residual: Tensor | None = None
) -> Tensor | tuple[Tensor, Tensor]:
    """RMSNorm of x's last dimension scaled by `weight`, in x's dtype, in one launch.

    With `residual`, first s = x + residual (stored in x's dtype), and returns (s, norm(s)):
    the residual stream and the next block's input, as `x = x + attn; xn = rms_norm(x)`.
    """
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight of shape {tuple(weight.shape)} does not match x's last "
                         f"dimension {x.shape[-1]}; pass the norm's own weight.")  # fmt: skip
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} and x {tuple(x.shape)} differ.")
    rows = _rows(x)
    m, n = rows.shape
    y = torch.empty_like(rows)
    r = _rows(residual) if residual is not None else rows
    s = torch.empty_like(rows) if residual is not None else y
    block = triton.next_power_of_2(n)
    warps = max(1, min(16, block // 512))
    launch(
        _rms_norm_kernel, (m,), rows, r, weight, y, s, n, rows.stride(0), r.stride(0),
        y.stride(0), s.stride(0), eps, BLOCK=block, RESIDUAL=residual is not None,
        num_warps=warps,
    )  # fmt: skip
    y = y.view(x.shape)
    return (s.view(x.shape), y) if residual is not None else y


@triton.jit
def _silu_mul_kernel(g_ptr, h_ptr, N, stride_g, stride_h, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(g_ptr + row * stride_g + N + cols, mask=mask, other=0.0).to(tl.float32)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + row * stride_h + cols, h.to(h_ptr.dtype.element_ty), mask=mask)


def silu_mul_fused(gate_up: Tensor) -> Tensor:
    """silu(gate) * up for gate_up (M, 2I) = [gate | up], in fp32 and stored in gate_up's
    dtype, in one launch: (M, I)."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be (M, 2I), got {tuple(gate_up.shape)}.")
    rows = _rows(gate_up)
    m, inter = rows.shape[0], rows.shape[1] // 2
    h = torch.empty(m, inter, dtype=gate_up.dtype, device=gate_up.device)
    grid = (m, triton.cdiv(inter, SILU_BLOCK))
    launch(_silu_mul_kernel, grid, rows, h, inter, rows.stride(0), h.stride(0), BLOCK=SILU_BLOCK)
    return h


@triton.jit
def _router_topk_kernel(
    logits_ptr, ids_ptr, w_ptr, experts, stride_l, stride_i, stride_w,
    TOP_K: tl.constexpr, K_P: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * stride_l + e, mask=e < experts, other=float("-inf"))
    x = x.to(tl.float32)
    k = tl.arange(0, K_P)
    values = tl.full((K_P,), float("-inf"), tl.float32)
    ids = tl.zeros((K_P,), tl.int32)
    for j in tl.static_range(TOP_K):  # the best left, lowest expert id among equals
        best = tl.max(x, axis=0)
        at = tl.min(tl.where(x == best, e, BLOCK), axis=0)
        values = tl.where(k == j, best, values)
        ids = tl.where(k == j, at, ids)
        x = tl.where(e == at, float("-inf"), x)
    p = tl.exp(values - tl.max(values, axis=0))  # unused slots are -inf: weight 0
    tl.store(ids_ptr + row * stride_i + k, ids, mask=k < TOP_K)
    tl.store(w_ptr + row * stride_w + k, p / tl.sum(p, axis=0), mask=k < TOP_K)


def router_topk_fused(logits: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """`kernels.moe.router_topk` in one launch: (ids int32 (T, K), weights fp32 (T, K)), each
    token's K best experts best first and a softmax over their logits (fp32)."""
    if logits.dim() != 2 or not 1 <= top_k <= logits.shape[1]:
        raise ValueError(f"router_topk_fused expects logits (T, E) and 1 <= top_k <= E; got "
                         f"{tuple(logits.shape)} and top_k={top_k}.")  # fmt: skip
    rows = _rows(logits)
    tokens, experts = rows.shape
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=logits.device)
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    block = triton.next_power_of_2(experts)
    launch(
        _router_topk_kernel, (tokens,), rows, ids, weights, experts, rows.stride(0),
        ids.stride(0), weights.stride(0), TOP_K=top_k, K_P=triton.next_power_of_2(top_k),
        BLOCK=block, num_warps=max(1, min(8, block // 256)),
    )  # fmt: skip
    return ids, weights


@triton.jit
def _rotate(base_ptr, heads, head_stride, cos, sin, HEADS_P: tl.constexpr, HALF: tl.constexpr):
    """Turn the rotary halves at base_ptr + h * head_stride (h < heads) by (cos, sin)."""
    h = tl.arange(0, HEADS_P)[:, None]
    first = base_ptr + h * head_stride + tl.arange(0, HALF)[None, :]
    mask = h < heads  # broadcast over the HALF columns
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    out = base_ptr.dtype.element_ty
    tl.store(first, (x1 * cos - x2 * sin).to(out), mask=mask)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(out), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, kv_ptr, ik_ptr, pos_ptr, first_pos, stride_q, stride_kv, stride_ik, q_heads,
    index_heads, neg_log2_theta_per_dim,
    HEAD: tl.constexpr, IDX: tl.constexpr, ROPE: tl.constexpr, Q_HEADS_P: tl.constexpr,
    I_HEADS_P: tl.constexpr, POSITIONS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + row) if POSITIONS else first_pos + row
    pos = pos.to(tl.float32)
    HALF: tl.constexpr = ROPE // 2
    i = tl.arange(0, HALF)[None, :].to(tl.float32)
    angle = pos * tl.exp2(i * neg_log2_theta_per_dim)  # kernels.rope.rope_angles (ex2.approx)
    cos, sin = tl.cos(angle), tl.sin(angle)
    q_row = q_ptr + row * stride_q
    _rotate(q_row + HEAD - ROPE, q_heads, HEAD, cos, sin, Q_HEADS_P, HALF)
    _rotate(q_row + q_heads * HEAD + IDX - ROPE, index_heads, IDX, cos, sin, I_HEADS_P, HALF)
    _rotate(kv_ptr + row * stride_kv + HEAD - ROPE, 1, 0, cos, sin, 1, HALF)
    _rotate(ik_ptr + row * stride_ik + IDX - ROPE, 1, 0, cos, sin, 1, HALF)


def rope_fused(
    q_all: Tensor, heads: tuple[int, int], kv: Tensor, index_k: Tensor,
    positions: Tensor | int, rope_dim: int, theta: float = ROPE_THETA,
) -> None:  # fmt: skip
    """`kernels.rope.rope_` on every head attention reads, in place, in one launch: the query
    heads and the indexer's query heads, side by side in each row of `q_all` (the query
    up-projection's output, `heads` = (query heads, indexer heads) of kv's and index_k's
    widths), the latent key `kv` (T, head dim) and the indexer key `index_k` (T, index dim).
    `positions`: the tokens' positions, (T,) integers on the device, or the first of T
    consecutive ones (a prefill chunk)."""
    rows, head, idx = kv.shape[0], kv.shape[-1], index_k.shape[-1]
    q_heads, index_heads = heads
    if q_all.shape != (rows, q_heads * head + index_heads * idx) or index_k.shape[0] != rows:
        raise ValueError(
            f"q_all {tuple(q_all.shape)}, kv {tuple(kv.shape)} and index_k "
            f"{tuple(index_k.shape)} do not hold {heads} heads of T rows; pass the projections "
            "of one batch of tokens."
        )
    if rope_dim & (rope_dim - 1) or not 2 <= rope_dim <= min(head, idx):
        raise ValueError(f"rope_dim={rope_dim} must be a power of two from 2 to the head widths "
                         f"({head}, {idx}).")  # fmt: skip
    if any(t.stride(-1) != 1 for t in (q_all, kv, index_k)):
        raise ValueError("q_all, kv and index_k need unit stride in their last dimension; "
                         "pass the GEMMs' outputs or views of whole columns.")  # fmt: skip
    on_device = isinstance(positions, Tensor)
    if on_device and positions.shape != (rows,):
        raise ValueError(f"positions {tuple(positions.shape)} do not match the {rows} rows.")
    if rows == 0:
        return
    launch(
        _rope_kernel, (rows,), q_all, kv, index_k, positions if on_device else q_all,
        0 if on_device else positions, q_all.stride(0), kv.stride(0), index_k.stride(0),
        q_heads, index_heads, -2.0 * math.log2(theta) / rope_dim, HEAD=head, IDX=idx,
        ROPE=rope_dim, Q_HEADS_P=triton.next_power_of_2(q_heads),
        I_HEADS_P=triton.next_power_of_2(index_heads), POSITIONS=on_device,
    )  # fmt: skip
