"""deepgemm: DeepSeek's FP8 GEMMs (DeepGEMM), the kernels DeepSeek serves its checkpoints with.

Dense: `deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d)`, W8A8 with the checkpoint's blocks
(activations per token and 128-wide K block, weights per 128x128 block, fp32 scales on SM90),
the activation quantiser timed with it, as for `cublas_fp8`.

MoE: the two grouped GEMMs of the routed experts, in the two forms a server uses.
`m_grouped_fp8_gemm_nt_masked` (decode): every expert owns `max_m` rows of an (E, max_m, K)
buffer and a count of the valid ones; `m_grouped_fp8_gemm_nt_contiguous` (prefill): the
experts' rows one after another, each expert's run padded to DeepGEMM's M alignment, and a
row-to-expert map (-1 on padding rows, which it skips block by block). What DeepGEMM does not
do is torch inside the timed call, so the row is a whole MoE layer: quantise x (the
workbench's Triton quantiser), sort slots by expert and scatter them into the layout, GEMM,
SiLU-and-multiply in fp32 rounded to bf16 (where the reference rounds), quantise, scatter,
GEMM, weight by the routing weight and sum over top-k. A server fuses that glue (DeepEP's
dispatch writes the masked layout directly); the row's `variant` says it is there.

Nothing in the call syncs with the host, so a decode step with it replays as a CUDA graph.
Buffer sizes need no sync: an expert gets at most T rows of T tokens (a token picks an
expert once), so the masked buffer has max_m = T rounded up to 128, and the contiguous layout
has at most T*top_k + E*(alignment-1) rows. Every shape JIT-compiles through nvcc on its first
call (seconds): `prepare` runs one, the bench's check runs the rest before anything is timed.

DeepGEMM ships inside vLLM's wheel (`vllm/third_party/deep_gemm`, with its compiled
`_C_extension.abi3.so` on torch's stable ABI); `scripts/fetch_peer_wheels.py` cuts that folder
out into `.whl/deep_gemm.tgz` for the GPU box.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.dense import DenseWeights, quantize_activations
from kernels.moe import MoeWeights
from workbench.peers.availability import jit_peer_available

BLOCK = 128
MASKED_MAX_T = 48  # up to here the masked (decode) form, above it the contiguous one
MASKED_ROWS = 128  # the masked buffer's rows per expert: T rounded up to this
INSTALL = (
    "DeepGEMM ships in vLLM's wheel (vllm/third_party/deep_gemm): python3 "
    "scripts/fetch_peer_wheels.py cuts it into .whl/deep_gemm.tgz, which the peer plans unpack "
    "onto PYTHONPATH (docs/peers.md); it needs SM90+ and nvcc for its JIT"
)

MoeCall = Callable[[Tensor, Tensor, Tensor], Tensor]


def available() -> tuple[bool, str]:
    """Whether deep_gemm imports and there is a Hopper (or newer) GPU to JIT-compile for."""
    return jit_peer_available("DeepGEMM", ("deep_gemm",), INSTALL, 9, "DeepGEMM's FP8 GEMMs")


def _check(fmt: str, block: int, kind: str, build: str) -> None:
    if fmt != "fp8" or block != BLOCK:
        raise ValueError(
            f"deepgemm takes FP8 {kind} in {BLOCK}x{BLOCK} blocks, got {fmt} with block "
            f"{block}; quantise with {build}."
        )


def _scales_outer_major(rows: int, blocks: int, device: torch.device, lead: int = 0) -> Tensor:
    """fp32 scales (lead?, rows, blocks) stored row-fastest: DeepGEMM's SM90 layout for the
    activations' scales, so it need not transpose them (rows a multiple of 4 keeps TMA's
    16-byte alignment)."""
    shape = (blocks, rows) if not lead else (lead, blocks, rows)
    return torch.empty(shape, dtype=torch.float32, device=device).transpose(-1, -2)


def _dense_linear(values: Tensor, scales: Tensor, x: Tensor) -> Tensor:
    import deep_gemm

    # Scales row-fastest when that keeps TMA's 16-byte alignment; else DeepGEMM lays them out.
    q, scale_a = quantize_activations(x, BLOCK, outer_major=x.shape[0] % 4 == 0)
    y = torch.empty(x.shape[0], values.shape[0], dtype=torch.bfloat16, device=x.device)
    deep_gemm.fp8_gemm_nt((q, scale_a), (values, scales), y, disable_ue8m0_cast=True)
    return y


def prepare(weights: DenseWeights) -> Callable[[Tensor], Tensor]:
    """The peer's linear(x) for one dense weight; one call compiles it for this shape."""
    _check(weights.fmt, weights.block, "weights", "DenseWeights.quantize(w, 'fp8', 128)")
    values = weights.values
    linear = partial(_dense_linear, values, weights.scales.contiguous())
    for m in (1, 4):  # both activation-scale layouts, compiled now
        linear(torch.zeros(m, values.shape[1], dtype=torch.bfloat16, device=values.device))
    return linear


def _counts(flat: Tensor, experts: int) -> Tensor:
    """Slots per expert; a scatter-add, not torch.bincount, which syncs with the host on the
    GPU (it sizes its output from the input) and so breaks CUDA-graph capture."""
    return torch.zeros(experts, dtype=torch.long, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat)
    )


def slot_positions(ids: Tensor, experts: int, align: int) -> tuple[Tensor, Tensor, Tensor]:
    """Where each routed slot goes in a per-expert layout, without a host sync.

    Returns (order, rank, start): `order` lists the slots (flattened (T, top_k)) sorted by
    expert, stably; `rank[i]` is the i-th sorted slot's row within its expert; `start[e]` is
    the first row of expert e when each expert's rows are padded to a multiple of `align`.
    """
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = _counts(flat, experts)
    first = torch.cumsum(counts, 0) - counts
    expert = flat[order]
    rank = torch.arange(flat.numel(), device=ids.device) - first[expert]
    padded = (counts + align - 1) // align * align
    return order, rank, torch.cumsum(padded, 0) - padded


def _silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) * up in fp32, rounded to bf16 where the reference rounds it."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(torch.bfloat16)


def _combine(rows: Tensor, route: Tensor, token: Tensor, out_shape: tuple[int, int]) -> Tensor:
    out = torch.zeros(out_shape, dtype=torch.float32, device=rows.device)
    out.index_add_(0, token, rows.float() * route[:, None])
    return out.to(torch.bfloat16)


def _moe_masked(w: MoeWeights, x: Tensor, ids: Tensor, route: Tensor) -> Tensor:
    import deep_gemm

    (tokens, top_k), experts = ids.shape, w.gate_up.shape[0]
    max_m = -(-tokens // MASKED_ROWS) * MASKED_ROWS
    order, rank, _ = slot_positions(ids, experts, 1)
    expert, token = ids.reshape(-1).long()[order], order // top_k
    masked_m = _counts(expert, experts).to(torch.int32)
    expected_m = max(1, -(-tokens * top_k // experts))

    def grouped(values: Tensor, scales: Tensor, b: Tensor, sfb: Tensor) -> Tensor:
        k = values.shape[1]
        a = torch.empty(experts, max_m, k, dtype=torch.float8_e4m3fn, device=x.device)
        sfa = _scales_outer_major(max_m, k // BLOCK, x.device, experts).zero_()
        a[expert, rank], sfa[expert, rank] = values, scales
        d = torch.empty(experts, max_m, b.shape[1], dtype=torch.bfloat16, device=x.device)
        deep_gemm.m_grouped_fp8_gemm_nt_masked(
            (a, sfa), (b, sfb), d, masked_m, expected_m, disable_ue8m0_cast=True
        )
        return d[expert, rank]

    q, s = quantize_activations(x, BLOCK)
    h = _silu_mul(grouped(q[token], s[token], w.gate_up, w.gate_up_scale))
    y = grouped(*quantize_activations(h, BLOCK), w.down, w.down_scale)
    return _combine(y, route.reshape(-1)[order], token, tuple(x.shape))


def _moe_contiguous(w: MoeWeights, x: Tensor, ids: Tensor, route: Tensor) -> Tensor:
    import deep_gemm

    (tokens, top_k), experts = ids.shape, w.gate_up.shape[0]
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    rows = -(-(tokens * top_k + experts * (align - 1)) // align) * align
    order, rank, start = slot_positions(ids, experts, align)
    expert, token = ids.reshape(-1).long()[order], order // top_k
    position = start[expert] + rank
    layout = torch.full((rows,), -1, dtype=torch.int32, device=x.device)
    layout[position] = expert.to(torch.int32)

    def grouped(values: Tensor, scales: Tensor, b: Tensor, sfb: Tensor) -> Tensor:
        k = values.shape[1]
        a = torch.zeros(rows, k, dtype=torch.float8_e4m3fn, device=x.device)
        sfa = _scales_outer_major(rows, k // BLOCK, x.device).fill_(1.0)
        a[position], sfa[position] = values, scales
        d = torch.empty(rows, b.shape[1], dtype=torch.bfloat16, device=x.device)
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(
            (a, sfa), (b, sfb), d, layout, disable_ue8m0_cast=True
        )
        return d[position]

    q, s = quantize_activations(x, BLOCK)
    h = _silu_mul(grouped(q[token], s[token], w.gate_up, w.gate_up_scale))
    y = grouped(*quantize_activations(h, BLOCK), w.down, w.down_scale)
    return _combine(y, route.reshape(-1)[order], token, tuple(x.shape))


def moe_layer(w: MoeWeights, x: Tensor, ids: Tensor, route: Tensor) -> Tensor:
    """The routed experts' output (T, H) in bf16: the masked form up to MASKED_MAX_T tokens,
    the contiguous one above, as a server switches between decode and prefill."""
    form = _moe_masked if x.shape[0] <= MASKED_MAX_T else _moe_contiguous
    return form(w, x, ids, route)


def prepare_moe(weights: MoeWeights) -> MoeCall:
    """The peer's moe(x, ids, route) for FP8 experts in 128x128 blocks; the weights are used
    as stored (E, N, K), K-major, with their (E, N/128, K/128) fp32 scales."""
    _check(weights.fmt, weights.block, "experts",
           "MoeWeights.quantize(w_gate_up, w_down, 'fp8', 128)")  # fmt: skip
    w = MoeWeights(
        "fp8", weights.gate_up, weights.down, weights.gate_up_scale.contiguous(),
        weights.down_scale.contiguous(), BLOCK,
    )  # fmt: skip
    device = weights.gate_up.device
    for tokens in (1, MASKED_MAX_T + 1):  # compile both forms now, outside any timed region
        x = torch.zeros(tokens, w.hidden, dtype=torch.bfloat16, device=device)
        ids = torch.zeros(tokens, 1, dtype=torch.int32, device=device)
        moe_layer(w, x, ids, torch.ones(tokens, 1, device=device))
    return partial(moe_layer, w)
