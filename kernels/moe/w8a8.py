"""Routed experts in W8A8 for prefill: FP8 activations times FP8 weights on the FP8 tensor cores.

The W*A16 schedulers convert FP8 weights to bf16 in registers and multiply in bf16, so at
prefill, where the tensor cores are the limit, FP8 weights buy nothing. Here the activations
are FP8 too, as DeepSeek serves its experts: x is quantised per token and 128-wide K block
(`fp8_quant.quantize_activations`, power-of-two scales), every 128-wide K step is one FP8 MMA
whose fp32 product is scaled by its rows' activation scales and the tile's weight scale on the
CUDA cores and added to the accumulator (promote and rescale, as DeepGEMM does), and the
gate/up epilogue quantises silu(gate) * up the same way before it is stored: a 128-column
output tile is one K block of the down projection, so its per-row absmax is known in
registers, and h goes to memory in FP8 with its scales, half the bytes of bf16 and no
quantising pass of its own.

Why promote: Hopper's FP8 MMA adds into its accumulator with fewer bits than fp32. Keeping the
running sum in the current step's units and handing it to the MMA as its accumulator (rescaled
before each step) saves the product's registers, but on the H200 at the TP2-rank shape it was
both less exact, 1.6e-2 from the W8A8 reference at T=4,096 against 4.2e-3, and slower, 16.1 ms
at T=33,863 against 14.2 (one run, raw/logs/h200-moe-w8a8-tiles-20261201T1656.csv): each
step's MMA then waits for the last one's sum. The price is registers: the Triton gate/up at
128 x 128 on 8 warps (the defaults) takes 255 and spills 6 bytes, one program an SM; 64-row
tiles spill nothing but took 16.5-16.7 ms. The Gluon kernels hold each warpgroup's two
accumulators and product in 224 to 232 registers without spills.

Work is the flat scheduler's (`flat`): the same routing layout (slots sorted by expert, row
tiles numbered globally), one persistent program per SM walking (row tile, column tile) items,
without split-K (prefill has rows enough). Gate/up gathers x8[slot // K] and writes h8 in
sorted order (row r of h8 is the r-th sorted slot), so an expert's rows lie together; down
reads them as tiles and writes each slot's weighted row in the activations' dtype, which
`combine` sums per token in fp32. On sm_90 both projections are Gluon kernels, after a small
kernel writes the row table they read (`w8a8_wgmma.row_table`): down (`w8a8_wgmma`: 1.13
times as fast as this module's Triton one at T=33,863 on the H200) and gate/up
(`w8a8_gate_up_wgmma`, its rows gathered by cp.async: the call 9.72 ms against 10.88 with the
Triton gate/up in one run, raw/logs/h200-moe-w8a8-gluon-gate-up-probe-6f5efc6-*.csv, no
spills); elsewhere, and with wgmma=False, the Triton ones. With h in sorted order the Triton
down kernel reads whole rows of one expert: 12.05 ms a call at T=33,863 against 12.43 before,
in two runs, not one (raw/logs/h200-tune-moe-w8a8-8c652c9-20261202T0420.csv and
h200-tune-moe-w8a8-ece554c-*; the Gluon kernel's probe had the Triton one at 12.40 in a third).
The slots' output rows are T * top_k * H values, 4.2 GB in fp32 at T=33,863: in bf16 the path
took 12.4 ms there against 14.3, with 4.6689e-2 of error against 4.6660e-2 (one run,
raw/logs/h200-tune-moe-w8a8-d1d882d-*.csv). In the same run, running the K loop across items
(`tl.range(flatten=True)`) made both kernels slower: 13.6 ms with it on down, 17.9 on both
(gate/up then spills 18 bytes).

Tiles are 128 columns wide, one weight block, so each K step has one weight scale per tile
(gate's and up's); the weights must be FP8 in 128 x 128 blocks and H and I multiples of 128.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch, recording
from kernels.dense.w8a8_wgmma import supported
from kernels.fp8_quant import pow2_scale, quantize_activations, round_to_e4m3
from kernels.moe.flat import CPU_PROGRAMS, FlatLayout, moe_flat, prefill_sized
from kernels.moe.formats import MoeWeights, as_moe_weights
from kernels.moe.routing import MoeShape, sm_count, validate_moe_inputs
from kernels.moe.routing_kernels import combine
from kernels.moe.tiles import locate_rows, store_down
from kernels.moe.w8a8_gate_up_wgmma import gate_up_wgmma
from kernels.moe.w8a8_wgmma import ROWS as DOWN_ROWS
from kernels.moe.w8a8_wgmma import WIDE as DOWN_WIDE
from kernels.moe.w8a8_wgmma import down_wgmma, row_table
from kernels.moe.w8a8_wgmma import runs_on as down_runs_on

BLOCK = 128  # the weight block, a tile's width and a K step
DEFAULT_ROWS = 128
DEFAULT_WARPS = 8
DEFAULT_STAGES = 3


@triton.jit
def _k_step(acc, a_ptrs, row_ok, w_ptrs, scale):
    """acc + one 128-wide K step's FP8 product, scaled by `scale` (each row's activation scale
    times the tile's weight scale) on the CUDA cores (module docstring: why not in the MMA)."""
    a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
    return acc + tl.dot(a, tl.load(w_ptrs)) * scale[:, None]


@triton.jit
def _w8a8_gate_up_kernel(
    x8_ptr, xs_ptr, h8_ptr, hs_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr,
    tile_offsets_ptr, w_ptr, s_ptr, stride_we, stride_wn, stride_se, stride_sn, stride_sk,
    num_experts, hidden, inter,
    stride_xt, stride_xst, stride_hr, stride_hsk, TOP_K: tl.constexpr, STEPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """h8[row, cols], hs[col tile, row] = FP8 silu(gate) * up of each item's rows and one
    128-column tile, quantised per row as `quantize_activations` quantises; a row is the
    slot's place in sorted order, so an expert's rows lie together (the down kernels read
    them as tiles)."""
    col_tiles = inter // BLOCK_K
    num_items = tl.load(tile_offsets_ptr + num_experts) * col_tiles
    k = tl.arange(0, BLOCK_K)
    for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
        expert, rows, row_ok, col_tile, _ = locate_rows(
            item, 1, col_tiles, tile_offsets_ptr, offsets_ptr, counts_ptr, num_experts,
            BLOCK_M, STEPS,
        )  # fmt: skip
        slots = tl.load(sorted_slots_ptr + rows, mask=row_ok, other=0)
        tokens = (slots // TOP_K).to(tl.int64)
        cols = col_tile * BLOCK_K + k
        w_e = w_ptr + expert.to(tl.int64) * stride_we
        s_e = s_ptr + expert.to(tl.int64) * stride_se
        a_ptrs = x8_ptr + tokens[:, None] * stride_xt + k[None, :]
        gate_ptrs = w_e + cols[None, :] * stride_wn + k[:, None]  # (K, N): W's rows as columns
        up_ptrs = gate_ptrs + inter * stride_wn
        gate_scales = s_e + col_tile * stride_sn
        up_scales = gate_scales + (inter // BLOCK_K) * stride_sn
        gate = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for step in range(0, hidden // BLOCK_K):
            a_scales = tl.load(xs_ptr + tokens * stride_xst + step, mask=row_ok, other=0.0)
            gate = _k_step(gate, a_ptrs, row_ok, gate_ptrs,
                           a_scales * tl.load(gate_scales + step * stride_sk))  # fmt: skip
            up = _k_step(up, a_ptrs, row_ok, up_ptrs,
                         a_scales * tl.load(up_scales + step * stride_sk))  # fmt: skip
            a_ptrs += BLOCK_K
            gate_ptrs += BLOCK_K
            up_ptrs += BLOCK_K
        h = gate * tl.sigmoid(gate) * up
        scale, inverse = pow2_scale(tl.max(tl.abs(h), axis=1))
        h8 = round_to_e4m3(h * inverse[:, None]).to(tl.float8e4nv)  # the scaling is exact
        tl.store(h8_ptr + rows[:, None] * stride_hr + cols[None, :], h8, mask=row_ok[:, None])
        tl.store(hs_ptr + col_tile * stride_hsk + rows, scale, mask=row_ok)


@triton.jit
def _w8a8_down_kernel(
    h8_ptr, hs_ptr, y_ptr, sorted_slots_ptr, counts_ptr, offsets_ptr, tile_offsets_ptr,
    slot_weights_ptr, w_ptr, s_ptr, stride_we, stride_wn, stride_se, stride_sn, stride_sk,
    num_experts, hidden, inter, stride_hr, stride_hsk, stride_yr,
    STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y[slot, cols] = routing weight * h8[row] @ down[cols].T for each item's rows (their
    sorted places) and one 128-column tile of H, in y's dtype (the activations') for
    `combine` to sum in fp32."""
    col_tiles = hidden // BLOCK_K
    num_items = tl.load(tile_offsets_ptr + num_experts) * col_tiles
    k = tl.arange(0, BLOCK_K)
    for item in range(tl.program_id(0), num_items, tl.num_programs(0)):
        expert, rows, row_ok, col_tile, _ = locate_rows(
            item, 1, col_tiles, tile_offsets_ptr, offsets_ptr, counts_ptr, num_experts,
            BLOCK_M, STEPS,
        )  # fmt: skip
        slots = tl.load(sorted_slots_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        cols = col_tile * BLOCK_K + k
        w_ptrs = (w_ptr + expert.to(tl.int64) * stride_we + cols[None, :] * stride_wn
                  + k[:, None])  # fmt: skip
        w_scales = s_ptr + expert.to(tl.int64) * stride_se + col_tile * stride_sn
        a_ptrs = h8_ptr + rows[:, None] * stride_hr + k[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for step in range(0, inter // BLOCK_K):
            scale = tl.load(hs_ptr + step * stride_hsk + rows, mask=row_ok, other=0.0)
            acc = _k_step(acc, a_ptrs, row_ok, w_ptrs,
                          scale * tl.load(w_scales + step * stride_sk))  # fmt: skip
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        store_down(y_ptr, slot_weights_ptr, 0, slots, row_ok, cols, cols < hidden, acc, 0,
                   stride_yr, False)  # fmt: skip


def _check_weights(weights: MoeWeights) -> None:
    if weights.fmt != "fp8" or weights.block != BLOCK:
        raise ValueError(f"moe_w8a8 multiplies FP8 experts in {BLOCK}x{BLOCK} blocks; got "
                         f"{weights.fmt} weights in blocks of {weights.block}: build them with "
                         f"MoeWeights.quantize(w_gate_up, w_down, 'fp8', {BLOCK}).")  # fmt: skip


def _check(weights: MoeWeights, shape: MoeShape, block_m: int, num_warps: int) -> None:
    _check_weights(weights)
    if shape.hidden % BLOCK or shape.inter % BLOCK:
        raise ValueError(f"moe_w8a8 takes H and I in whole {BLOCK}-wide blocks; got "
                         f"H={shape.hidden}, I={shape.inter}. Use the flat scheduler "
                         "(W8A16) for these shapes.")  # fmt: skip
    if block_m not in (16, 32, 64, 128, 256) or num_warps not in (4, 8):
        raise ValueError(f"block_m must be a power of two from 16 to 256 and num_warps 4 or 8; "
                         f"got block_m={block_m}, num_warps={num_warps}.")  # fmt: skip


def moe_w8a8(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor,
    w_down: Tensor | None = None,
    *,
    block_m: int = DEFAULT_ROWS,
    num_warps: int = DEFAULT_WARPS,
    num_stages: int = DEFAULT_STAGES,
    num_programs: int | None = None,
    wgmma: bool | None = None,
) -> Tensor:
    """Routed-expert output (T, H) in x.dtype, as `reference.moe_w8a8_reference` defines it
    (moe_reference with x and h quantised to FP8 per token and 128-wide block). FP8 weights in
    128 x 128 blocks only. Five launches: x's quantiser, the routing layout (three), gate/up,
    down, combine; num_programs defaults to the SM count (4 on the CPU). `wgmma` runs gate/up
    and down on the Gluon kernels (`w8a8_gate_up_wgmma`, `w8a8_wgmma`, after the row table
    they read, `w8a8_wgmma.row_table`): None where they run (sm_90, 128-row tiles, H a
    multiple of 256), True or an error, False never."""
    with recording():
        weights = as_moe_weights(weights, w_down)
        shape = validate_moe_inputs(x, topk_ids, topk_weights, weights)
        _check(weights, shape, block_m, num_warps)
        gluon = _gluon(wgmma, x.device, block_m, shape)
        programs = num_programs or sm_count(x.device) or CPU_PROGRAMS
        slots = shape.tokens * shape.top_k
        layout = FlatLayout.of(topk_ids, topk_weights, shape, block_m)
        counts, offsets, tile_offsets, sorted_slots, slot_weights, row_tiles = layout
        x8, xs = quantize_activations(x, BLOCK)
        h8 = torch.empty(slots, shape.inter, dtype=torch.float8_e4m3fn, device=x.device)
        hs = torch.empty(shape.inter // BLOCK, slots, dtype=torch.float32, device=x.device)
        y = torch.empty(slots, shape.hidden, dtype=x.dtype, device=x.device)
        common = {"STEPS": max(shape.experts - 1, 0).bit_length(), "BLOCK_M": block_m,
                  "BLOCK_K": BLOCK, "num_warps": num_warps, "num_stages": num_stages}  # fmt: skip
        gate_up, down = weights.gate_up, weights.down
        gs, ds = weights.gate_up_scale, weights.down_scale
        if gluon:
            row_weights, tile_info = row_table(layout, shape)
            gate_up_wgmma(x8, xs, h8, hs, gate_up, gs, layout, tile_info, shape.top_k, programs)
        else:
            launch(
                _w8a8_gate_up_kernel, (min(programs, row_tiles * (shape.inter // BLOCK)),), x8,
                xs, h8, hs, sorted_slots, counts, offsets, tile_offsets, gate_up, gs,
                gate_up.stride(0), gate_up.stride(1), *gs.stride(), shape.experts, shape.hidden,
                shape.inter, x8.stride(0), xs.stride(0), h8.stride(0), hs.stride(0),
                TOP_K=shape.top_k, **common,
            )  # fmt: skip
        if gluon:
            down_wgmma(h8, hs, y, down, ds, sorted_slots, row_weights, tile_info, tile_offsets,
                       programs)  # fmt: skip
            return combine(y, shape.tokens, shape.top_k, x.dtype)
        launch(
            _w8a8_down_kernel, (min(programs, row_tiles * (shape.hidden // BLOCK)),), h8, hs, y,
            sorted_slots, counts, offsets, tile_offsets, slot_weights, down, ds, down.stride(0),
            down.stride(1), *ds.stride(), shape.experts, shape.hidden, shape.inter,
            h8.stride(0), hs.stride(0), y.stride(0), **common,
        )  # fmt: skip
        return combine(y, shape.tokens, shape.top_k, x.dtype)


def _gluon(wgmma: bool | None, device: torch.device, block_m: int, shape: MoeShape) -> bool:
    """Whether gate/up and down run on the Gluon kernels (`moe_w8a8`'s `wgmma`)."""
    if wgmma is not None and not isinstance(wgmma, bool):
        raise ValueError(f"wgmma={wgmma!r} must be True, False or None (where it runs).")
    runs = supported(device) and block_m == DOWN_ROWS and down_runs_on(shape.hidden, shape.inter)
    if wgmma and not runs:
        raise ValueError(f"wgmma=True needs an sm_90 (Hopper) GPU, block_m={DOWN_ROWS} and H a "
                         f"multiple of {DOWN_WIDE}; got {device}, block_m={block_m} and "
                         f"H={shape.hidden}. Pass wgmma=None to use them where they "
                         "run.")  # fmt: skip
    return runs if wgmma is None else wgmma


def moe_flat_w8a8(
    x: Tensor,
    topk_ids: Tensor,
    topk_weights: Tensor,
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor,
    w_down: Tensor | None = None,
) -> Tensor:
    """FP8 experts as a server runs them: `moe_w8a8` where the mean rows per active expert
    reach `flat.PREFILL_ROWS` (`flat.prefill_sized`: the tensor cores are the limit), else
    `moe_flat` (decode: bf16 activations, streaming the weights with split-K)."""
    weights = as_moe_weights(weights, w_down)
    _check_weights(weights)  # at every size, not only where W8A8 runs
    if prefill_sized(topk_ids.numel(), weights.gate_up.shape[0]):
        return moe_w8a8(x, topk_ids, topk_weights, weights)
    return moe_flat(x, topk_ids, topk_weights, weights)
