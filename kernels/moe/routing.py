"""Launch prep shared by the Triton MoE schedulers: input validation and the slot sort.

Every scheduler consumes the same routing layout: the T*K (token, slot) pairs flattened, sorted
by expert with a stable argsort, plus the number of slots per expert. Slot s belongs to token
s // K, so the sort needs no separate token index.
"""

import os
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MoeShape:
    """Problem sizes read off validated inputs: tokens, hidden, experts, intermediate, top-k."""

    tokens: int
    hidden: int
    experts: int
    inter: int
    top_k: int


def validate_moe_inputs(
    x: Tensor, topk_ids: Tensor, topk_weights: Tensor, w_gate_up: Tensor, w_down: Tensor
) -> MoeShape:
    """Check the MoE operands agree with each other and return their sizes.

    Bad shapes would otherwise surface as out-of-bounds reads inside a kernel, so each message
    names the mismatch and what to pass instead. Checking the expert-id range costs one sync.
    """
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating tensor (bf16/fp16/fp32), got {x.dtype}; cast it.")
    if x.dim() != 2:
        raise ValueError(f"x must be (T, H), got shape {tuple(x.shape)}; flatten the batch dims.")
    tokens, hidden = x.shape
    if tokens == 0:
        raise ValueError("x has no tokens (T == 0); skip the MoE call for an empty batch.")
    if w_gate_up.dim() != 3 or w_gate_up.shape[2] != hidden or w_gate_up.shape[1] % 2:
        raise ValueError(
            f"w_gate_up must be (E, 2I, H={hidden}) with gate rows above up rows, got "
            f"{tuple(w_gate_up.shape)}; check H matches x and the weight is not transposed."
        )
    experts, inter = w_gate_up.shape[0], w_gate_up.shape[1] // 2
    if tuple(w_down.shape) != (experts, hidden, inter):
        raise ValueError(
            f"w_down must be (E, H, I) = ({experts}, {hidden}, {inter}) to match x and "
            f"w_gate_up, got {tuple(w_down.shape)}; check it is not transposed."
        )
    if x.dtype != w_gate_up.dtype or x.dtype != w_down.dtype:
        raise ValueError(
            f"x, w_gate_up and w_down must share a dtype, got {x.dtype}, {w_gate_up.dtype}, "
            f"{w_down.dtype}; cast the weights to x.dtype."
        )
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens:
        raise ValueError(
            f"topk_ids must be (T={tokens}, K), got {tuple(topk_ids.shape)}; one row per token."
        )
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights shape {tuple(topk_weights.shape)} differs from topk_ids shape "
            f"{tuple(topk_ids.shape)}; pass the weights returned with the ids by the router."
        )
    if topk_ids.is_floating_point() or topk_ids.dtype == torch.bool:
        raise ValueError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}.")
    if not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be floating, got {topk_weights.dtype}.")
    # The range check reads a device value back (a sync), which a CUDA graph capture forbids.
    capturing = topk_ids.is_cuda and torch.cuda.is_current_stream_capturing()
    if not capturing and bool(((topk_ids < 0) | (topk_ids >= experts)).any()):
        raise ValueError(
            f"topk_ids has values outside [0, E={experts}); route only to existing experts "
            "(w_gate_up.shape[0] sets E)."
        )
    return MoeShape(tokens, hidden, experts, inter, topk_ids.shape[1])


def sort_slots(topk_ids: Tensor, experts: int) -> tuple[Tensor, Tensor]:
    """Group the T*K slots by expert: (sorted_slots int32 (T*K,), counts int32 (E,)).

    The stable sort keeps each expert's slots in token order, so its rows gather x in order.
    """
    flat = topk_ids.reshape(-1).long()
    sorted_slots = torch.argsort(flat, stable=True).to(torch.int32)
    # scatter_add_ rather than bincount: bincount sizes its output from the data (a device
    # sync on CUDA), which makes the routing prep impossible to capture in a CUDA graph.
    counts = torch.zeros(experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return sorted_slots, counts


def default_groups(device: torch.device) -> int:
    """Programs per N-tile column: one per 8 SMs on a GPU, a handful under the CPU interpreter."""
    if device.type == "cuda":
        return max(1, torch.cuda.get_device_properties(device).multi_processor_count // 8)
    return 4


def dot_options(dtype: torch.dtype) -> tuple[str, bool]:
    """(input_precision, upcast) for tl.dot on operands of `dtype`.

    fp32 asks for "ieee" so results do not silently drop to TF32 on the GPU. Upcast is True only
    for bf16 under TRITON_INTERPRET, whose tl.dot multiplies bf16 bit patterns instead of values
    (triton-lang/triton#11584); upcasting bf16 to fp32 is exact, so results match the tensor cores.
    """
    precision = "ieee" if dtype == torch.float32 else "tf32"
    interpreted = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
    return precision, interpreted and dtype == torch.bfloat16
