"""Triton building blocks shared by the MoE schedulers: one output tile of gate/up or of down.

A scheduler decides which tile a program computes (expert, rows, column tile, K range); these
functions compute it, so stock, multirow, flat and padded differ only in their schedule and
numbers stay comparable. Tiles are written for any weight format (FMT) and orientation:

- FMT_PLAIN weights are loaded as stored. FMT_FP8 values are loaded as float8_e4m3fn (the
  interpreter loads them too, exactly for every finite code) and converted to the activation
  dtype, which is exact; FMT_INT4 bytes are split into their two nibbles, and the low and
  high nibbles of a K tile each meet their own activation tile (`_act_k`, the run layout of
  kernels.moe.formats). One scale covers a K tile's column, so a K tile must not straddle two
  scale blocks (the host checks block_k divides the quantisation block): it multiplies the
  tile's fp32 product, or, in INT4 tiles of FOLD_ROWS rows or more, the weights themselves.
- SWAP computes the transposed tile W @ X^T: the weight becomes the MMA's first operand and the
  (few) token rows its N dim, the usual trick when decode has fewer rows than an MMA's M.

Rows are addressed by slot (s = token * K + k): gate/up gathers x[s // K] and writes h[s], down
reads h[s] and writes y[split, s]. Split-K programs write fp32 partial sums instead, which
`silu_reduce_kernel` (gate/up) and routing_kernels.combine (down) add up.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from kernels.dequant import E4M3_BITS_SCALE, e4m3_as_bf16, int4_nibbles_as_bf16

FMT_PLAIN = tl.constexpr(0)
FMT_FP8 = tl.constexpr(1)
FMT_INT4 = tl.constexpr(2)
HALF_RUN = tl.constexpr(8)  # kernels.moe.formats.INT4_RUN // 2: a low nibble's k + 8 is its high's
# INT4 tiles of this many rows or more scale the weights before the MMA (_mma). On the H200 at
# T=33,863 (raw/logs/h200-tune-moe-int4-df8f8b5-20261201T1947.csv, scaled after; ...-1d7d385-
# 20261201T1953.csv, folded at 64 rows and more), 128-row tiles took 35.4 to 44.3 ms folded
# against 46.5 to 113 scaled after (the second accumulator spilled); 64-row tiles were within
# 10% either way (best 44.3 ms scaled after, 45.8 folded); at T=6 16-row tiles lost to the
# fold (0.303 ms to 0.336): the multiply per weight value is only paid back by many rows.
FOLD_ROWS = tl.constexpr(128)
# Tiles of at most this many rows load a K tile's scales one K tile before using them: a
# decode tile's MMA is too short to hide their L2 round trip (Nsight Compute on flat FP8 at
# T=6 put 7% of gate/up's stall samples on that load and 16% on the loop around it). On the
# H200 (raw/logs/h200-moe-scales-ahead-3cf25bc-20261202T1150.csv, outputs bit-identical),
# flat FP8 took 14% less time at T=16 and 64 and INT4 3-6%; T=1 and 6 were within the
# spread between runs. Prefill tiles keep loading them in the step, after issuing the MMA
# (`_step_scales` says why).
SCALES_AHEAD_ROWS = tl.constexpr(32)


@triton.jit
def find_expert(tile_offsets_ptr, tile, num_experts, STEPS: tl.constexpr):
    """The expert owning global row tile `tile` (scalar or block), by binary search.

    tile_offsets is the (E + 1,) exclusive scan of row tiles per expert; the answer is the
    largest e with tile_offsets[e] <= tile, which skips experts with no tiles. STEPS must be
    ceil(log2(E)), so the search is unrolled and needs no data-dependent loop.
    """
    lo = tile * 0
    hi = lo + num_experts
    for _ in tl.static_range(STEPS):
        mid = (lo + hi) // 2
        go_right = tl.load(tile_offsets_ptr + mid) <= tile
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    return lo


@triton.jit
def _dot(w, act, acc, PRECISION: tl.constexpr, SWAP: tl.constexpr):
    """acc + act @ w (w @ act when SWAP); acc may be None."""
    if SWAP:
        out = tl.dot(w, act, acc, input_precision=PRECISION)
    else:
        out = tl.dot(act, w, acc, input_precision=PRECISION)
    return out


@triton.jit
def _mma(
    acc,
    act,
    act_hi,
    w_ptrs,
    w_mask,
    scale_ptrs,
    col_ok,
    scale,
    FMT: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SWAP: tl.constexpr,
    AHEAD: tl.constexpr,
):
    """acc + act @ W.T for one K tile (W @ act when SWAP), W dequantised on the fly. Its
    column scales are `scale` when they were loaded AHEAD (SCALES_AHEAD_ROWS), else loaded
    here from `scale_ptrs` (masked by col_ok), after the MMA is issued.

    An int4 tile is read as packed bytes; its low nibbles multiply `act` and its high nibbles
    `act_hi`, the activations 8 k further on (`_act_k`), so the two unpacked halves go to the
    MMA as they come out of the conversion, in the layout the bytes were loaded in: no
    interleaving, hence no layout conversion, and the byte loads stay pipelined. Masked
    bytes are zero (code 0, the value -8 times the scale), which is harmless: a masked byte's
    k meets a masked (zero) activation, or its column is never stored. A fill of 0x88 (two
    zero values) cost a select after the load, and with it Triton staged every packed tile
    through shared memory a second time to reach the MMA's layout (compiled for sm_90:
    local_load, select, local_alloc, local_load; with zeros, one local_load): on the H200
    flat INT4 took 0.176 ms at T=6 against 0.226 (raw/logs/h200-moe-int4-zero-fill-ab-*).
    On the GPU, bf16 activations take the integer-instruction conversions of
    `kernels.dequant` (FP8's 2**-120 goes into the scale). One scale covers a
    K tile's column (the host checks). Tiles of FOLD_ROWS rows or more fold an INT4 scale
    into the weights in bf16 before the MMA, as Marlin does, so the products accumulate
    straight into `acc`; the value multiplied is then q * s rounded to bf16, within half a
    bf16 step of `formats.dequantize_int4`'s exact one. Smaller tiles, and FP8, scale the K
    tile's product per column after the MMA, in fp32, exactly: it needs a second
    accumulator, but a fold costs a multiply per weight value, which a decode tile's few
    rows do not pay back.
    UPCAST (interpreter only, see routing.dot_options) widens bf16 operands to fp32 first.
    """
    bits: tl.constexpr = act.dtype == tl.bfloat16 and not UPCAST  # on the GPU, into bf16
    if FMT == FMT_INT4:
        packed = tl.load(w_ptrs, mask=w_mask, other=0)
        if bits:
            w, w_hi = int4_nibbles_as_bf16(packed)
        else:
            w = ((packed & 15).to(tl.int16) - 8).to(tl.float32).to(tl.bfloat16)
            w_hi = ((packed >> 4).to(tl.int16) - 8).to(tl.float32).to(tl.bfloat16)
        if not AHEAD:
            scale = tl.load(scale_ptrs, mask=col_ok, other=0.0)  # bf16, one per column
        scale = scale[:, None] if SWAP else scale[None, :]
        rows: tl.constexpr = act.shape[1] if SWAP else act.shape[0]
        if rows >= FOLD_ROWS:
            w = _scaled(w, scale, bits)
            w_hi = _scaled(w_hi, scale, bits)
            acc = _dot(_operand(w, act, UPCAST), _operand(act, act, UPCAST), acc, PRECISION,
                       SWAP)  # fmt: skip
            acc = _dot(_operand(w_hi, act, UPCAST), _operand(act_hi, act, UPCAST), acc,
                       PRECISION, SWAP)  # fmt: skip
        else:
            product = _dot(_operand(w, act, UPCAST), _operand(act, act, UPCAST), None,
                           PRECISION, SWAP)  # fmt: skip
            product = _dot(_operand(w_hi, act, UPCAST), _operand(act_hi, act, UPCAST), product,
                           PRECISION, SWAP)  # fmt: skip
            acc += product * scale.to(tl.float32)
    else:
        scale_bits = 1.0
        if FMT == FMT_FP8 and bits:
            w = e4m3_as_bf16(tl.load(w_ptrs, mask=w_mask, other=0.0))
            scale_bits = E4M3_BITS_SCALE
        else:
            w = tl.load(w_ptrs, mask=w_mask, other=0.0).to(act.dtype)
        w = _operand(w, act, UPCAST)
        if FMT == FMT_PLAIN:
            acc = _dot(w, _operand(act, act, UPCAST), acc, PRECISION, SWAP)
        else:
            product = _dot(w, _operand(act, act, UPCAST), None, PRECISION, SWAP)
            if not AHEAD:
                scale = tl.load(scale_ptrs, mask=col_ok, other=0.0)
            scale = scale.to(tl.float32) * scale_bits
            if SWAP:
                acc += product * scale[:, None]
            else:
                acc += product * scale[None, :]
    return acc


@triton.jit
def _scaled(w, scale, BF16_MUL: tl.constexpr):
    """bf16 w * scale rounded to nearest bf16: by bf16 multiplies on the GPU (two values an
    instruction); elsewhere in fp32, rounded by integer ops because the interpreter's
    fp32-to-bf16 cast truncates, which biased every INT4 product toward zero (1.5% error)."""
    if BF16_MUL:
        out = w * scale
    else:
        bits = (w.to(tl.float32) * scale.to(tl.float32)).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # to nearest, ties to even
        out = bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    return out


@triton.jit
def _operand(v, act, UPCAST: tl.constexpr):
    """v as an MMA operand beside activations `act`: in act's dtype, or fp32 under UPCAST."""
    return v.to(tl.float32) if UPCAST else v.to(act.dtype)


@triton.jit
def _act_k(BLOCK_K: tl.constexpr, FMT: tl.constexpr):
    """K offsets within a K tile of the activation tile `_mma` multiplies first: all BLOCK_K
    for plain and FP8 weights; for INT4, the k of the tile's low nibbles (the first 8 of each
    16-value run), the high nibbles' being these plus HALF_RUN."""
    if FMT == FMT_INT4:
        j = tl.arange(0, BLOCK_K // 2)
        offsets = (j // HALF_RUN) * (2 * HALF_RUN) + j % HALF_RUN
    else:
        offsets = tl.arange(0, BLOCK_K)
    return offsets


@triton.jit
def _load_act(act_ptrs, act_mask, hi_mask, hi_step, FMT: tl.constexpr):
    """(activation tile, tile of the high nibbles' k) of a K tile; the second is the first
    unless FMT is INT4."""
    act = tl.load(act_ptrs, mask=act_mask, other=0.0)
    act_hi = act
    if FMT == FMT_INT4:
        act_hi = tl.load(act_ptrs + hi_step, mask=hi_mask, other=0.0)
    return act, act_hi


@triton.jit
def _operand_ptrs(row_ptrs, k_offsets, K_FIRST: tl.constexpr):
    """Pointer tile row_ptrs[r] + k_offsets[k], laid out (K, R) when K_FIRST, else (R, K)."""
    if K_FIRST:
        ptrs = row_ptrs[None, :] + k_offsets[:, None]
    else:
        ptrs = row_ptrs[:, None] + k_offsets[None, :]
    return ptrs


@triton.jit
def _weight_k(k_lo, stride_wk, BLOCK_K: tl.constexpr, FMT: tl.constexpr):
    """(k offsets of the first weight tile, offset step per K tile): int4 packs two k per
    byte, so its tile is the BLOCK_K // 2 bytes from k_lo // 2 (k_lo is a multiple of BLOCK_K,
    so of a whole number of runs)."""
    if FMT == FMT_INT4:  # k_lo // 2: whole K tiles of bytes, so 16-byte copies can align
        first = tl.multiple_of(k_lo // 2, BLOCK_K // 2)
        k_offsets = (first + tl.arange(0, BLOCK_K // 2)) * stride_wk
        step = (BLOCK_K // 2) * stride_wk
    else:
        k_offsets = (k_lo + tl.arange(0, BLOCK_K)) * stride_wk
        step = BLOCK_K * stride_wk
    return k_offsets, step


@triton.jit
def _scale_ptrs(s_e, cols, stride_sn, FMT: tl.constexpr, QBLOCK: tl.constexpr):
    """Scale row pointers per column: fp8 has one per QBLOCK rows, int4 one per row."""
    rows = cols // QBLOCK if FMT == FMT_FP8 else cols
    return s_e + rows * stride_sn


@triton.jit
def _column_scales(scale_ptrs, col_ok, k0, k_hi, stride_sk, QBLOCK: tl.constexpr,
                   FMT: tl.constexpr):  # fmt: skip
    """The column scales of the K tile from k0 (0 from k_hi on; none for plain weights)."""
    if FMT == FMT_PLAIN:
        scale = col_ok.to(tl.float32)  # a placeholder _mma does not read
    else:
        scale = tl.load(scale_ptrs + (k0 // QBLOCK) * stride_sk, mask=col_ok & (k0 < k_hi),
                        other=0.0)  # fmt: skip
    return scale


@triton.jit
def _first_scales(scale_ptrs, col_ok, k_lo, k_hi, stride_sk, QBLOCK: tl.constexpr,
                  FMT: tl.constexpr, LEAD: tl.constexpr):  # fmt: skip
    """What a tile loop carries into its first step (`_step_scales`): the first K tile's
    column scales when it loads them ahead (LEAD > 0), else a placeholder nothing reads."""
    if LEAD > 0:
        out = _column_scales(scale_ptrs, col_ok, k_lo, k_hi, stride_sk, QBLOCK, FMT)
    else:
        out = col_ok
    return out


@triton.jit
def _step_scales(carried, scale_ptrs, col_ok, k0, k_hi, stride_sk, QBLOCK: tl.constexpr,
                 FMT: tl.constexpr, LEAD: tl.constexpr):  # fmt: skip
    """(the column scales of the K tile from k0, what to carry to the next step) with LEAD > 0
    (SCALES_AHEAD_ROWS): the scales loaded a step before, and the next tile's. Without a
    lead, nothing: `_mma` loads them after issuing the MMA, as before the lead existed (loaded
    before the MMA, they took the 64-row FP8 padded gate/up from 180 to 230 registers and it
    ran 11% slower at T=33,863, raw/bench-moe-dsv4-flash-tp2-20261202T130331)."""
    now = carried
    if LEAD > 0:
        carried = _column_scales(scale_ptrs, col_ok, k0 + LEAD, k_hi, stride_sk, QBLOCK, FMT)
    return now, carried


@triton.jit
def _masks(
    row_ok, col_ok, k0, offs_k, limit, FMT: tl.constexpr, SWAP: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """(activation mask, high-nibble activation mask, weight mask) of the K tile from k0, in
    the operand layouts of _mma. An int4 byte is read when its low value's k is in range; a
    high value past the limit is padding (code 8, zero) and meets a masked activation.

    EVEN_K (the host knows every K tile lies inside K): no K mask at all. Why: an INT4 K mask
    follows the low nibbles' k, which come in runs of 8, so Triton could not copy more than 8
    packed bytes at once (cp.async of 8 bytes, through L1); without it the copies are 16
    bytes (compiled for sm_90: 12 copies of 16 bytes a K tile of gate/up for a thread, in
    place of 24 of 8). On the H200 flat INT4 took 0.159 ms at T=6 against 0.174, 0.377
    against 0.404 at T=16 and 1.37 against 1.56 at T=64; FP8 1-2% less, bf16 the same
    (raw/logs/h200-moe-even-k-ab-*.csv); padded INT4 0.168 against 0.174 ms at T=6 and 1.34
    against 1.50 at T=64, stock INT4 0.54 against 0.63 at T=6
    (raw/logs/h200-moe-even-k-padded-stock-ab-*.csv). The masks of rows and columns stay."""
    if EVEN_K:
        k_ok = tl.full(offs_k.shape, 1, tl.int1)
        hi_ok = k_ok
    else:
        k_ok = k0 + offs_k < limit
        hi_ok = k0 + offs_k + HALF_RUN < limit
    if SWAP:
        act_mask = k_ok[:, None] & row_ok[None, :]
        hi_mask = hi_ok[:, None] & row_ok[None, :]
        w_mask = col_ok[:, None] & k_ok[None, :]
    else:
        act_mask = row_ok[:, None] & k_ok[None, :]
        hi_mask = row_ok[:, None] & hi_ok[None, :]
        w_mask = k_ok[:, None] & col_ok[None, :]
    return act_mask, hi_mask, w_mask


@triton.jit
def gate_up_tile(
    x_ptr,
    tokens,
    row_ok,
    w_e,
    s_e,
    cols,
    col_ok,
    inter,
    hidden,
    k_lo,
    k_hi,
    stride_xt,
    stride_xh,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FMT: tl.constexpr,
    QBLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SWAP: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """fp32 (gate, up) sums over K in [k_lo, k_hi) for x[tokens] and gate/up columns `cols`.

    One activation tile feeds both products; up's weight rows sit `inter` rows below gate's.
    Pointer tiles are built once and stepped by one K tile per iteration, which keeps 64-bit
    address arithmetic out of the loop. EVEN_K: every K tile lies inside K (`_masks`).
    """
    if SWAP:
        gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros_like(gate)
    offs_k = _act_k(BLOCK_K, FMT)
    act_ptrs = _operand_ptrs(x_ptr + tokens * stride_xt, (k_lo + offs_k) * stride_xh, SWAP)
    w_k, w_step = _weight_k(k_lo, stride_wk, BLOCK_K, FMT)
    gate_ptrs = _operand_ptrs(w_e + cols * stride_wn, w_k, not SWAP)
    up_ptrs = gate_ptrs + inter * stride_wn
    gate_scales = _scale_ptrs(s_e, cols, stride_sn, FMT, QBLOCK)
    up_scales = _scale_ptrs(s_e, cols + inter, stride_sn, FMT, QBLOCK)
    # k between loading a K tile's scales and using them (SCALES_AHEAD_ROWS)
    LEAD: tl.constexpr = BLOCK_K if BLOCK_M <= SCALES_AHEAD_ROWS else 0
    gate_s = _first_scales(gate_scales, col_ok, k_lo, k_hi, stride_sk, QBLOCK, FMT, LEAD)
    up_s = _first_scales(up_scales, col_ok, k_lo, k_hi, stride_sk, QBLOCK, FMT, LEAD)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        act_mask, hi_mask, w_mask = _masks(row_ok, col_ok, k0, offs_k, hidden, FMT, SWAP, EVEN_K)
        act, act_hi = _load_act(act_ptrs, act_mask, hi_mask, HALF_RUN * stride_xh, FMT)
        scale_k = (k0 // QBLOCK) * stride_sk
        gate_now, gate_s = _step_scales(gate_s, gate_scales, col_ok, k0, k_hi, stride_sk, QBLOCK,
                                        FMT, LEAD)  # fmt: skip
        up_now, up_s = _step_scales(up_s, up_scales, col_ok, k0, k_hi, stride_sk, QBLOCK, FMT,
                                    LEAD)  # fmt: skip
        gate = _mma(
            gate, act, act_hi, gate_ptrs, w_mask, gate_scales + scale_k, col_ok, gate_now, FMT,
            PRECISION, UPCAST, SWAP, LEAD > 0,
        )  # fmt: skip
        up = _mma(
            up, act, act_hi, up_ptrs, w_mask, up_scales + scale_k, col_ok, up_now, FMT,
            PRECISION, UPCAST, SWAP, LEAD > 0,
        )  # fmt: skip
        act_ptrs += BLOCK_K * stride_xh
        gate_ptrs += w_step
        up_ptrs += w_step
    return gate, up


@triton.jit
def down_tile(
    h_ptr,
    slots,
    row_ok,
    w_e,
    s_e,
    cols,
    col_ok,
    inter,
    k_lo,
    k_hi,
    stride_hr,
    stride_wn,
    stride_wk,
    stride_sn,
    stride_sk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FMT: tl.constexpr,
    QBLOCK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SWAP: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """fp32 sums over K in [k_lo, k_hi) of h[slots] @ down[cols].T (no routing weight yet);
    EVEN_K as gate_up_tile takes it."""
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offs_k = _act_k(BLOCK_K, FMT)
    act_ptrs = _operand_ptrs(h_ptr + slots * stride_hr, k_lo + offs_k, SWAP)
    w_k, w_step = _weight_k(k_lo, stride_wk, BLOCK_K, FMT)
    w_ptrs = _operand_ptrs(w_e + cols * stride_wn, w_k, not SWAP)
    scales = _scale_ptrs(s_e, cols, stride_sn, FMT, QBLOCK)
    LEAD: tl.constexpr = BLOCK_K if BLOCK_M <= SCALES_AHEAD_ROWS else 0  # as gate_up_tile
    scale = _first_scales(scales, col_ok, k_lo, k_hi, stride_sk, QBLOCK, FMT, LEAD)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        act_mask, hi_mask, w_mask = _masks(row_ok, col_ok, k0, offs_k, inter, FMT, SWAP, EVEN_K)
        act, act_hi = _load_act(act_ptrs, act_mask, hi_mask, HALF_RUN, FMT)
        now, scale = _step_scales(scale, scales, col_ok, k0, k_hi, stride_sk, QBLOCK, FMT, LEAD)
        acc = _mma(
            acc, act, act_hi, w_ptrs, w_mask, scales + (k0 // QBLOCK) * stride_sk, col_ok, now,
            FMT, PRECISION, UPCAST, SWAP, LEAD > 0,
        )  # fmt: skip
        act_ptrs += BLOCK_K
        w_ptrs += w_step
    return acc


@triton.jit
def _out_index(slots, row_ok, cols, col_ok, SWAP: tl.constexpr):
    """(slot, column, mask) broadcast to the accumulator's orientation."""
    if SWAP:
        r = slots[None, :]
        c = cols[:, None]
        mask = row_ok[None, :] & col_ok[:, None]
    else:
        r = slots[:, None]
        c = cols[None, :]
        mask = row_ok[:, None] & col_ok[None, :]
    return r, c, mask


@triton.jit
def store_gate_up(
    h_ptr,
    part_ptr,
    split,
    slots,
    row_ok,
    cols,
    col_ok,
    gate,
    up,
    inter,
    stride_hr,
    stride_ps,
    stride_pr,
    SPLIT: tl.constexpr,
    SWAP: tl.constexpr,
):
    """h[slot, col] = silu(gate) * up; with SPLIT, raw sums to part[split, slot, col | I + col]."""
    r, c, mask = _out_index(slots, row_ok, cols, col_ok, SWAP)
    if SPLIT:
        p = part_ptr + tl.cast(split, tl.int64) * stride_ps + r * stride_pr + c
        tl.store(p, gate, mask=mask)
        tl.store(p + inter, up, mask=mask)
    else:
        h = gate * tl.sigmoid(gate) * up
        tl.store(h_ptr + r * stride_hr + c, h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_down(
    y_ptr,
    slot_weights_ptr,
    split,
    slots,
    row_ok,
    cols,
    col_ok,
    acc,
    stride_ys,
    stride_yr,
    SWAP: tl.constexpr,
):
    """y[split, slot, col] = routing weight of the slot * acc, in y's dtype (fp32 partials when
    K is split, else the activations') for combine to sum in fp32."""
    weight = tl.load(slot_weights_ptr + slots, mask=row_ok, other=0.0)
    acc = acc * weight[None, :] if SWAP else acc * weight[:, None]
    r, c, mask = _out_index(slots, row_ok, cols, col_ok, SWAP)
    tl.store(y_ptr + tl.cast(split, tl.int64) * stride_ys + r * stride_yr + c, acc, mask=mask)


@triton.jit
def silu_reduce_kernel(
    part_ptr,
    h_ptr,
    num_rows,
    inter,
    splits,
    stride_ps,
    stride_pr,
    stride_hr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr = False,
):
    """h = silu(sum of gate partials) * (sum of up partials) for split-K gate/up. With
    LAUNCH_DEPENDENTS (sm_90 on) the next grid, where it launches with PDL, may launch as soon
    as every program of this one has started (`kernels.pdl`): down then fills its weight ring
    while this runs, and waits for h."""
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < num_rows)[:, None] & (cols < inter)[None, :]
    p = part_ptr + rows[:, None] * stride_pr + cols[None, :]
    gate = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    up = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for _ in range(0, splits):
        gate += tl.load(p, mask=mask, other=0.0)
        up += tl.load(p + inter, mask=mask, other=0.0)
        p += stride_ps
    h = gate * tl.sigmoid(gate) * up
    tl.store(h_ptr + rows[:, None] * stride_hr + cols[None, :], h.to(h_ptr.dtype.element_ty), mask)


@triton.jit
def locate_rows(
    item, splits, col_tiles, tile_offsets_ptr, offsets_ptr, counts_ptr, num_experts,
    BLOCK_M: tl.constexpr, STEPS: tl.constexpr,
):  # fmt: skip
    """(expert, sorted positions int64, row_ok, column tile, split) of a work item: its rows'
    places in the slots sorted by expert."""
    split = item % splits
    col_tile = (item // splits) % col_tiles
    row_tile = item // (splits * col_tiles)
    expert = find_expert(tile_offsets_ptr, row_tile, num_experts, STEPS)
    rows = (row_tile - tl.load(tile_offsets_ptr + expert)) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < tl.load(counts_ptr + expert)
    positions = tl.load(offsets_ptr + expert) + rows
    return expert, positions.to(tl.int64), row_ok, col_tile, split


@triton.jit
def write_tile_info(row_tile, expert, rows, row_ok, slots, slot_weights_ptr, row_weights_ptr,
                    tile_info_ptr):  # fmt: skip
    """What the Gluon kernels read per row tile and sorted row in place of a search:
    tile_info[row_tile] = (expert, first sorted row, rows it owns) and row_weights[rows] =
    their slots' routing weights (rows, row_ok and slots as `locate_rows` and the sorted
    slots give them)."""
    weight = tl.load(slot_weights_ptr + slots, mask=row_ok, other=0.0)
    tl.store(row_weights_ptr + rows, weight, mask=row_ok)
    fields = tl.arange(0, 4)
    info = tl.where(
        fields == 0,
        expert,
        tl.where(fields == 1, tl.min(rows, axis=0), tl.sum(row_ok.to(tl.int32), axis=0)),
    )
    tl.store(tile_info_ptr + row_tile * 4 + fields, info, mask=fields < 3)
