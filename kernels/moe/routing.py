"""Launch prep shared by the Triton MoE schedulers: input validation, device facts, and the
torch references of the routing layout that kernels.moe.routing_kernels builds on the device.

Every scheduler consumes the same routing layout: the T*K (token, slot) pairs flattened, sorted
by expert, plus the number of slots per expert and their prefix offsets. Slot s belongs to token
s // K, so the sort needs no separate token index. Per-slot outputs are summed over a token's K
slots (and over split-K partials) by combine.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import Tensor

from kernels.compiled import interpreting
from kernels.moe.formats import INT4_RUN, MoeWeights

# Whether topk_ids' range is taken on trust (`trusted_routing`): reading it back is a host sync.
_TRUSTED_ROUTING: ContextVar[bool] = ContextVar("trusted_routing", default=False)


@contextmanager
def trusted_routing() -> Iterator[None]:
    """Within it, the MoE calls do not read topk_ids back to check its range.

    Why: that check is a host sync. In a served step it stalls the CPU at every MoE layer, so
    the GPU idles while the next kernels are launched; in a benchmark sample the CPU then
    launches the call's kernels only after the cache flush before it has run, and the GPU
    waits on the launches. On the H200 at T=33,863, moe_w8a8 read 10.2-10.3 ms timed eagerly
    with the check and 9.7-9.8 replayed from a CUDA graph, where no check runs (bf16 flat
    15.0-15.1 and 14.3; raw/logs/h200-moe-w8a8-quantiser-side-stream-ab-*.txt); eagerly
    without it, 9.70-9.78 (bf16 flat 14.2-14.3; raw/logs/h200-moe-w8a8-next-item-ahead-ab-*).
    Back-to-back calls, as a served prefill makes them, took 8.93 ms a call without it and
    9.78 with it (raw/logs/h200-moe-served-loop-range-check-*.txt, scripts/moe_served_loop.py).
    For routing known to be in range: the model's forward (drawn over the experts) and the
    timed calls of bench moe, sweep, ab and the MoE tuning script (each call checked untimed
    first). Shapes and dtypes, read off the host, are checked regardless. Ids out of range
    under it are undefined behaviour, as in any MoE kernel that trusts its router."""
    token = _TRUSTED_ROUTING.set(True)
    try:
        yield
    finally:
        _TRUSTED_ROUTING.reset(token)


@dataclass(frozen=True)
class MoeShape:
    """Problem sizes read off validated inputs: tokens, hidden, experts, intermediate, top-k."""

    tokens: int
    hidden: int
    experts: int
    inter: int
    top_k: int


def _packed_k(k: int) -> int:
    """Bytes a packed INT4 row of k values takes: whole runs of INT4_RUN values, two a byte."""
    return -(-k // INT4_RUN) * (INT4_RUN // 2)


def validate_moe_inputs(
    x: Tensor, topk_ids: Tensor, topk_weights: Tensor, weights: MoeWeights
) -> MoeShape:
    """Check the MoE operands agree with each other and return their sizes.

    Bad shapes would otherwise surface as out-of-bounds reads inside a kernel, so each message
    names the mismatch and what to pass instead. Checking the expert-id range costs one host
    sync, which a CUDA graph capture and `trusted_routing` skip.
    """
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating tensor (bf16/fp16/fp32), got {x.dtype}; cast it.")
    if x.dim() != 2:
        raise ValueError(f"x must be (T, H), got shape {tuple(x.shape)}; flatten the batch dims.")
    tokens, hidden = x.shape
    if tokens == 0:
        raise ValueError("x has no tokens (T == 0); skip the MoE call for an empty batch.")
    packed = weights.fmt == "int4"  # two values a byte along K, in whole runs
    gate_up, down = weights.gate_up, weights.down
    stored_h = _packed_k(hidden) if packed else hidden
    if gate_up.shape[2] != stored_h or gate_up.shape[1] % 2:
        raise ValueError(
            f"w_gate_up must be (E, 2I, {'8 * cdiv(H, 16)' if packed else 'H'}={stored_h}) "
            f"with gate rows above up rows, got {tuple(gate_up.shape)}; check H matches x and "
            "the weight is not transposed."
        )
    experts, inter = gate_up.shape[0], gate_up.shape[1] // 2
    stored_i = _packed_k(inter) if packed else inter
    if tuple(down.shape) != (experts, hidden, stored_i):
        raise ValueError(
            f"w_down must be (E, H, {'8 * cdiv(I, 16)' if packed else 'I'}) = ({experts}, "
            f"{hidden}, {stored_i}) to match x and w_gate_up, got {tuple(down.shape)}; check it "
            "is not transposed."
        )
    if weights.fmt == "bf16" and (x.dtype != gate_up.dtype or x.dtype != down.dtype):
        raise ValueError(
            f"x, w_gate_up and w_down must share a dtype, got {x.dtype}, {gate_up.dtype}, "
            f"{down.dtype}; cast the weights to x.dtype."
        )
    if weights.fmt != "bf16":
        _check_scales(weights, experts, hidden, inter)
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
    # The range check reads a device value back (a sync), which a CUDA graph capture forbids
    # and `trusted_routing` skips.
    capturing = topk_ids.is_cuda and torch.cuda.is_current_stream_capturing()
    checked = not capturing and not _TRUSTED_ROUTING.get()
    if checked and bool(((topk_ids < 0) | (topk_ids >= experts)).any()):
        raise ValueError(
            f"topk_ids has values outside [0, E={experts}); route only to existing experts "
            "(w_gate_up.shape[0] sets E)."
        )
    return MoeShape(tokens, hidden, experts, inter, topk_ids.shape[1])


def _check_scales(weights: MoeWeights, experts: int, hidden: int, inter: int) -> None:
    """Scale shapes follow from the weight shapes and the block (see kernels.moe.formats)."""
    b = weights.block
    if weights.fmt == "fp8":
        want_gu = (experts, -(-2 * inter // b), -(-hidden // b))
        want_d = (experts, -(-hidden // b), -(-inter // b))
    else:
        want_gu = (experts, 2 * inter, -(-hidden // b))
        want_d = (experts, hidden, -(-inter // b))
    got_gu, got_d = tuple(weights.gate_up_scale.shape), tuple(weights.down_scale.shape)
    if got_gu != want_gu or got_d != want_d:
        raise ValueError(
            f"{weights.fmt} scales must be {want_gu} and {want_d} for block={b}, got {got_gu} "
            f"and {got_d}; quantise with MoeWeights.quantize(..., block={b})."
        )


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


def expert_offsets_reference(counts: Tensor, tile: int = 1) -> Tensor:
    """Exclusive prefix sums of cdiv(counts, tile), with the total appended: int32 (E + 1,).

    tile=1 gives each expert's first sorted slot; tile=BLOCK_M gives its first row tile.
    """
    tiles = (counts.long() + tile - 1) // tile
    return torch.cat([tiles.new_zeros(1), tiles.cumsum(0)]).to(torch.int32)


def combine_reference(y_slots: Tensor, tokens: int, top_k: int, dtype: torch.dtype) -> Tensor:
    """(T, H) in dtype: slot rows (T*K, H), or split-K partials (S, T*K, H), summed per token."""
    y = y_slots.reshape(-1, tokens, top_k, y_slots.shape[-1]).float()
    return y.sum(dim=(0, 2)).to(dtype)


def sm_count(device: torch.device) -> int | None:
    """Streaming multiprocessors of a CUDA device; None off the GPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


OFF_GPU_SMS = 4  # what launch plans assume under the CPU interpreter: a few programs


def planned_sms(device: torch.device) -> int:
    """The SMs a launch plan fills: the device's, or OFF_GPU_SMS under the interpreter."""
    return sm_count(device) or OFF_GPU_SMS


def default_groups(device: torch.device) -> int:
    """Programs per N-tile column: one per 8 SMs on a GPU, a handful under the CPU interpreter."""
    sms = sm_count(device)
    return 4 if sms is None else max(1, sms // 8)


def dot_options(dtype: torch.dtype) -> tuple[str, bool]:
    """(input_precision, upcast) for tl.dot on operands of `dtype`.

    fp32 asks for "ieee" so results do not silently drop to TF32 on the GPU. Upcast is True only
    for bf16 under TRITON_INTERPRET, whose tl.dot multiplies bf16 bit patterns instead of values
    (triton-lang/triton#11584); upcasting bf16 to fp32 is exact, so results match the tensor cores.
    """
    precision = "ieee" if dtype == torch.float32 else "tf32"
    return precision, interpreting() and dtype == torch.bfloat16
