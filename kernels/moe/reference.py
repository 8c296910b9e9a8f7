"""Torch references for the routed and shared experts of a MoE layer.

These define the numbers every MoE GEMM scheduler is checked against, so they favour clarity and
fp32 accumulation over speed, while rounding at the same point a kernel does (the SiLU output is
stored in the activation dtype before the down projection).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.dense.reference import linear as dense_linear
from kernels.dense.reference import quantize_activations_reference
from kernels.moe.formats import MoeWeights, as_moe_weights


def router_topk(logits: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """Pick the top_k experts of each token: (topk_ids int32 (T, K), topk_weights float32 (T, K)).

    The weights are a softmax over the selected logits only, so each token's weights sum to 1.
    """
    values, ids = logits.float().topk(top_k, dim=-1)
    return ids.to(torch.int32), torch.softmax(values, dim=-1)


def moe_reference(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor,
    w_down: Tensor | None = None,
) -> Tensor:
    """Routed-expert output (T, H) in x.dtype.

    For each token t and slot k with e = topk_ids[t, k]: h = silu(x[t] @ gate_e.T) * (x[t] @
    up_e.T), y = h @ w_down[e].T, out[t] += topk_weights[t, k] * y, where w_gate_up[e] stacks
    gate_e (first I rows) over up_e. Loops over the experts that received tokens. Weights are
    taken like the Triton variants take them; quantised ones are dequantised first, so the
    reference shows what the kernels should compute from the stored values.
    """
    w_gate_up, w_down = as_moe_weights(weights, w_down).dequantize()
    num_tokens, top_k = topk_ids.shape
    num_experts, two_i, _ = w_gate_up.shape
    inter = two_i // 2
    flat_ids = topk_ids.reshape(-1).long()
    flat_weights = topk_weights.reshape(-1).float()
    slot_token = torch.arange(num_tokens * top_k, device=x.device) // top_k
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()

    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    for expert, slots in enumerate(order.split(counts)):
        if slots.numel() == 0:
            continue
        tokens = slot_token.index_select(0, slots)
        gate_up = x.index_select(0, tokens).float() @ w_gate_up[expert].float().T
        h = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]).to(x.dtype)
        y = h.float() @ w_down[expert].float().T
        # index_put_ rather than index_add_: torch 2.13's multithreaded CPU index_add_ takes
        # milliseconds per call at any size, which would swamp a CPU profile.
        out.index_put_((tokens,), y * flat_weights.index_select(0, slots)[:, None], accumulate=True)
    return out.to(x.dtype)


def moe_w8a8_reference(
    x: Tensor, topk_ids: Tensor, topk_weights: Tensor, weights: MoeWeights
) -> Tensor:
    """W8A8's exact answer, (T, H) in x.dtype: `moe_reference` on the dequantised FP8
    weights with x, and then each slot's silu(gate) * up, quantised to FP8 per row and
    weight-block-wide K block (`dense.reference.quantize_activations_reference`) and
    dequantised, in fp32 throughout."""
    block = weights.block

    def fp8_rounded(a: Tensor) -> Tensor:
        values, scales = quantize_activations_reference(a, block)
        return values.float() * scales.repeat_interleave(block, dim=1)[:, : a.shape[1]]

    w_gate_up, w_down = weights.dequantize()
    inter = w_gate_up.shape[1] // 2
    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1).long()
    slot_token = torch.arange(num_tokens * top_k, device=x.device) // top_k
    x_q = fp8_rounded(x)
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    for expert in flat_ids.unique().tolist():
        slots = (flat_ids == expert).nonzero()[:, 0]
        tokens = slot_token.index_select(0, slots)
        gate_up = x_q.index_select(0, tokens) @ w_gate_up[expert].float().T
        h_q = fp8_rounded(F.silu(gate_up[:, :inter]) * gate_up[:, inter:])
        y = h_q @ w_down[expert].float().T
        weight = topk_weights.reshape(-1).float().index_select(0, slots)[:, None]
        out.index_put_((tokens,), y * weight, accumulate=True)
    return out.to(x.dtype)


def silu_mul_reference(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of gate_up = [gate | up] on the last dimension, in fp32, stored in
    gate_up's dtype (where a kernel rounds it before the down projection)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(gate_up.dtype)


def shared_expert(
    x: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    linear: Callable[[Tensor, Tensor], Tensor] = dense_linear,
    act: Callable[[Tensor], Tensor] = silu_mul_reference,
) -> Tensor:
    """Always-on expert: linear(silu(g) * u, w_down) with g, u the halves of linear(x, w_gate_up).

    `linear` and `act` are injectable so the shared expert can run any dense GEMM variant and
    the fused SiLU-and-multiply.
    """
    return linear(act(linear(x, w_gate_up)), w_down)
