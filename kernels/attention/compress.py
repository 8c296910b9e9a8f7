"""DeepSeek-V4's compressor: each group of `ratio` tokens pooled into one cache entry, per
channel the tokens' values weighted by a softmax of their gates over the group.

`pool_groups` is the torch definition and `pool_groups_triton` its kernel, for a prefill
chunk's complete groups. A decode step (`compress_step`) writes each stream's raw latent row,
puts the step's values and gates into the stream's open group (`pending`, by slot), pools the
whole group and writes the entry at its row (the scratch row unless the step completes the
group), so a CUDA graph replays the same work every step. `compress_step_triton` does that in
one launch, with a CSA layer's indexer key quantised to the FP8 cache format on the way, as
`write_cache` stores it. `csa_rows` puts a CSA query's picked entries and its window into the
one row list the sparse attention reads (seven torch launches, one in `csa_rows_triton`).

On the H200, in the V4 preset at 33,863 tokens: in torch a compressed layer's decode step was
a dozen launches, and torch's softmax over a group's 128 rows (not the last dim) alone took
65 us in each HCA layer; a step's sparse attention took 3.30 ms in 770 launches (the preset's
first profile, committed in 80aedba and since superseded). With these kernels, 0.866 ms in
213 (b79273d's profile, committed in 61d5f10 and since superseded), and 0.836 ms in 192 with
the CSA rows written by the select (`indexer_select.entry_select_fp8`): 29 us a CSA layer in
6 launches, 10.5 us an HCA layer in 3
(raw/profile-dsv4-flash-v4-tp2-stock-fp8-w8a16-graphs-33863t-20261201T221552).
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.attention.formats import QuantizedKeys
from kernels.attention.key_cache import quantize_keys
from kernels.compiled import launch
from kernels.fp8_quant import pow2_scale, round_to_e4m3

TILE_ELEMENTS = 4096  # values a program pools at once: ratio rows x channels


def pool_groups(values: Tensor, gates: Tensor, ratio: int) -> Tensor:
    """(n * ratio, w) rows and gates -> (n, w) entries: per channel the softmax(gates)-weighted
    sum over each group of `ratio` rows, in fp32, returned in the values' dtype."""
    width = values.shape[-1]
    weights = torch.softmax(gates.reshape(-1, ratio, width).float(), dim=1)
    return (values.reshape(-1, ratio, width).float() * weights).sum(1).to(values.dtype)


def compress_step(
    kv_cache: Tensor,
    keys: Tensor | QuantizedKeys | None,
    pending: tuple[Tensor, Tensor],
    raw_rows: Tensor,
    slot: Tensor,
    entry_rows: Tensor,
    entry_offset: int,
    kv: Tensor,
    index_k: Tensor | None,
    gates: Tensor,
) -> None:
    """One decode step of S streams, in torch: kv (S, D) to kv_cache[raw_rows]; the values
    (kv, and index_k where the layer caches keys) and their gates to pending (S, ratio, width)
    at each stream's slot; each stream's pooled group to kv_cache[entry_offset + entry_rows]
    and keys[entry_rows] (FP8 keys quantised as `quantize_keys` does)."""
    kv_cache.index_copy_(0, raw_rows, kv)
    values = kv if index_k is None else torch.cat([kv, index_k], 1)
    pending_values, pending_gates = pending
    streams = torch.arange(kv.shape[0], device=kv.device)
    pending_values[streams, slot] = values
    pending_gates[streams, slot] = gates[:, : values.shape[1]]
    entry = pool_groups(pending_values.flatten(0, 1), pending_gates.flatten(0, 1),
                        pending_values.shape[1])  # fmt: skip
    kv_cache.index_copy_(0, entry_rows + entry_offset, entry[:, : kv.shape[1]])
    if isinstance(keys, QuantizedKeys):
        quantized = quantize_keys(entry[:, kv.shape[1] :])
        as_bytes = keys.values.view(torch.uint8)  # index_copy_ has no float8 on the CPU
        as_bytes.index_copy_(0, entry_rows, quantized.values.view(torch.uint8))
        keys.scales.index_copy_(0, entry_rows, quantized.scales)
    elif keys is not None:
        keys.index_copy_(0, entry_rows, entry[:, kv.shape[1] :])


@triton.jit
def _pooled(values, gates, rows_ok):
    """(R, W) fp32 values and gates -> (W,) fp32: the softmax(gates)-weighted sum down each
    column over the rows where rows_ok (R,)."""
    gates = tl.where(rows_ok[:, None], gates, float("-inf"))
    weights = tl.exp(gates - tl.max(gates, axis=0)[None, :])
    return tl.sum(values * weights, axis=0) / tl.sum(weights, axis=0)


@triton.jit
def _pool_groups_kernel(
    values_ptr, gates_ptr, out_ptr, stride_v, stride_g, stride_o, width,
    RATIO: tl.constexpr, RATIO_P: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    group = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    r = tl.arange(0, RATIO_P)
    rows = group * RATIO + r
    mask = (r[:, None] < RATIO) & (c[None, :] < width)
    values = tl.load(values_ptr + rows[:, None] * stride_v + c[None, :], mask=mask, other=0.0)
    gates = tl.load(gates_ptr + rows[:, None] * stride_g + c[None, :], mask=mask, other=0.0)
    pooled = _pooled(values.to(tl.float32), gates.to(tl.float32), r < RATIO)
    tl.store(out_ptr + group * stride_o + c, pooled.to(out_ptr.dtype.element_ty), mask=c < width)


def _block_width(ratio: int, width: int) -> int:
    """Channels a program pools: TILE_ELEMENTS over the group's rows, at most the width."""
    per_row = max(16, TILE_ELEMENTS // triton.next_power_of_2(ratio))
    return min(triton.next_power_of_2(width), per_row)


def pool_groups_triton(values: Tensor, gates: Tensor, ratio: int) -> Tensor:
    """`pool_groups` in one launch: a program pools a block of one group's channels."""
    if values.shape[0] % ratio or gates.shape != values.shape:
        raise ValueError(
            f"pool_groups needs whole groups of {ratio} rows, with a gate a value; got values "
            f"{tuple(values.shape)} and gates {tuple(gates.shape)}"
        )
    if values.stride(1) != 1 or gates.stride(1) != 1:
        raise ValueError("pool_groups needs rows contiguous along the last dim.")
    groups, width = values.shape[0] // ratio, values.shape[1]
    out = torch.empty(groups, width, device=values.device, dtype=values.dtype)
    if groups == 0:
        return out
    block = _block_width(ratio, width)
    launch(_pool_groups_kernel, (groups, triton.cdiv(width, block)), values, gates, out,
           values.stride(0), gates.stride(0), out.stride(0), width, RATIO=ratio,
           RATIO_P=triton.next_power_of_2(ratio), BLOCK_W=block)  # fmt: skip
    return out


@triton.jit
def _pool_open_group(new_values, new_gates, pend_v_ptr, pend_g_ptr, stream, slot, c, c_ok,
                     stride_ps, stride_pr, RATIO: tl.constexpr, RATIO_P: tl.constexpr):  # fmt: skip
    """Put a stream's new values and gates (channels c) into its open group at `slot` and pool
    the group; the slot's row is taken from registers, not read back."""
    r = tl.arange(0, RATIO_P)
    at = pend_v_ptr + stream * stride_ps + slot * stride_pr + c
    tl.store(at, new_values.to(pend_v_ptr.dtype.element_ty), mask=c_ok)
    tl.store(pend_g_ptr + stream * stride_ps + slot * stride_pr + c,
             new_gates.to(pend_g_ptr.dtype.element_ty), mask=c_ok)  # fmt: skip
    tile = stream * stride_ps + r[:, None] * stride_pr + c[None, :]
    mask = (r[:, None] < RATIO) & c_ok[None, :]
    values = tl.load(pend_v_ptr + tile, mask=mask, other=0.0).to(tl.float32)
    gates = tl.load(pend_g_ptr + tile, mask=mask, other=0.0).to(tl.float32)
    now = (r == slot)[:, None]
    values = tl.where(now, new_values.to(tl.float32)[None, :], values)
    gates = tl.where(now, new_gates.to(tl.float32)[None, :], gates)
    return _pooled(values, gates, r < RATIO)


@triton.jit
def _compress_step_kernel(
    kv_ptr, key_ptr, gates_ptr, raw_rows_ptr, slot_ptr, entry_rows_ptr, pend_v_ptr, pend_g_ptr,
    kv_cache_ptr, k_cache_ptr, ks_ptr, entry_offset,
    stride_kv, stride_key, stride_g, stride_ps, stride_pr, stride_c, stride_k,
    D: tl.constexpr, DK: tl.constexpr, DK_P: tl.constexpr, RATIO: tl.constexpr,
    RATIO_P: tl.constexpr, BLOCK_W: tl.constexpr, KEYS: tl.constexpr,
):  # fmt: skip
    """Program (stream, block): blocks of latent channels first, then (KEYS > 0) one block of
    the key's DK channels. KEYS: 0 none, 1 bf16 keys, 2 FP8 keys with a scale a key."""
    stream = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    slot = tl.load(slot_ptr + stream).to(tl.int64)
    entry = tl.load(entry_rows_ptr + stream).to(tl.int64)
    if block * BLOCK_W < D:
        _step_latent(kv_ptr + stream * stride_kv, gates_ptr + stream * stride_g, raw_rows_ptr,
                     pend_v_ptr, pend_g_ptr, kv_cache_ptr, entry_offset + entry, stream, slot,
                     block, stride_ps, stride_pr, stride_c, D, RATIO, RATIO_P, BLOCK_W)  # fmt: skip
    elif KEYS > 0:
        _step_key(key_ptr + stream * stride_key, gates_ptr + stream * stride_g + D, pend_v_ptr,
                  pend_g_ptr, k_cache_ptr + entry * stride_k, ks_ptr + entry, stream, slot,
                  stride_ps, stride_pr, D, DK, DK_P, RATIO, RATIO_P, KEYS)  # fmt: skip


@triton.jit
def _step_latent(new_ptr, gates_ptr, raw_rows_ptr, pend_v_ptr, pend_g_ptr, kv_cache_ptr,
                 entry_row, stream, slot, block, stride_ps, stride_pr, stride_c, D: tl.constexpr,
                 RATIO: tl.constexpr, RATIO_P: tl.constexpr, BLOCK_W: tl.constexpr):  # fmt: skip
    """A block of a stream's latent channels: the raw row, the open group, the entry."""
    c = block * BLOCK_W + tl.arange(0, BLOCK_W)
    c_ok = c < D
    new = tl.load(new_ptr + c, mask=c_ok)
    raw = tl.load(raw_rows_ptr + stream).to(tl.int64)
    tl.store(kv_cache_ptr + raw * stride_c + c, new, mask=c_ok)
    gates = tl.load(gates_ptr + c, mask=c_ok)
    pooled = _pool_open_group(new, gates, pend_v_ptr, pend_g_ptr, stream, slot, c, c_ok,
                              stride_ps, stride_pr, RATIO, RATIO_P)  # fmt: skip
    out = kv_cache_ptr + entry_row * stride_c + c
    tl.store(out, pooled.to(kv_cache_ptr.dtype.element_ty), mask=c_ok)


@triton.jit
def _step_key(new_ptr, gates_ptr, pend_v_ptr, pend_g_ptr, key_out_ptr, scale_out_ptr, stream,
              slot, stride_ps, stride_pr, D: tl.constexpr, DK: tl.constexpr, DK_P: tl.constexpr,
              RATIO: tl.constexpr, RATIO_P: tl.constexpr, KEYS: tl.constexpr):  # fmt: skip
    """A stream's indexer key (channels D.. of its values): the open group and the entry's
    key, in bf16 (KEYS 1) or quantised to FP8 with its power-of-two scale (KEYS 2)."""
    d = tl.arange(0, DK_P)
    d_ok = d < DK
    new = tl.load(new_ptr + d, mask=d_ok)
    gates = tl.load(gates_ptr + d, mask=d_ok)
    pooled = _pool_open_group(new, gates, pend_v_ptr, pend_g_ptr, stream, slot, D + d, d_ok,
                              stride_ps, stride_pr, RATIO, RATIO_P)  # fmt: skip
    pooled = pooled.to(pend_v_ptr.dtype.element_ty)  # the entry in the values' dtype
    if KEYS == 1:
        tl.store(key_out_ptr + d, pooled.to(key_out_ptr.dtype.element_ty), mask=d_ok)
    else:
        key = tl.where(d_ok, pooled.to(tl.float32), 0.0)
        scale, inverse = pow2_scale(tl.max(tl.abs(key), axis=0))
        tl.store(key_out_ptr + d, round_to_e4m3(key * inverse).to(tl.float8e4nv), mask=d_ok)
        tl.store(scale_out_ptr, scale)


def _check_step(
    kv_cache: Tensor,
    key_values: Tensor | None,
    pending: tuple[Tensor, Tensor],
    rows: tuple[Tensor, ...],
    kv: Tensor,
    index_k: Tensor | None,
    gates: Tensor,
) -> None:
    """Refuse what the kernel would read or write out of bounds, or convert silently."""
    (streams, d), (pending_values, pending_gates) = kv.shape, pending
    dk = 0 if index_k is None else index_k.shape[1]
    if dk and key_values is None:
        raise ValueError("compress_step got indexer keys to pool and no key cache to hold them.")
    if pending_values.shape != pending_gates.shape or pending_values.shape[0] != streams \
            or pending_values.shape[2] != d + dk or gates.shape[0] != streams \
            or gates.shape[1] < d + dk:  # fmt: skip
        raise ValueError(
            f"compress_step expects pending (S, ratio, {d + dk}) twice for {streams} streams and "
            f"gates (S, >= {d + dk}); got {tuple(pending_values.shape)}, "
            f"{tuple(pending_gates.shape)} and {tuple(gates.shape)}"
        )
    if kv_cache.shape[1] != d or (index_k is not None and (
            index_k.shape[0] != streams or key_values.shape[1] != index_k.shape[1])):  # fmt: skip
        raise ValueError(
            f"compress_step expects kv (S, D) for a cache of width D, and index_k (S, d) for "
            f"keys of width d; got kv {tuple(kv.shape)}, a cache of width {kv_cache.shape[1]}"
            + ("" if index_k is None else f", index_k {tuple(index_k.shape)} and keys of width "
               f"{key_values.shape[1]}")
        )  # fmt: skip
    if any(r.shape != (streams,) or r.stride(0) != 1 for r in rows):
        raise ValueError(f"compress_step expects raw_rows, slot and entry_rows as ({streams},) "
                         f"contiguous; got {[tuple(r.shape) for r in rows]}")  # fmt: skip
    values = [kv, gates, *pending] + ([] if index_k is None else [index_k])
    if len({t.dtype for t in values}) != 1 or kv_cache.dtype != kv.dtype:
        dtypes = sorted({str(t.dtype) for t in [*values, kv_cache]})
        raise ValueError(f"compress_step expects one dtype for kv, index_k, gates, pending and "
                         f"the cache; got {dtypes}")  # fmt: skip
    laid_out_alike = pending[0].stride() == pending[1].stride()
    if any(t.stride(-1) != 1 for t in [*values, kv_cache]) or not laid_out_alike:
        raise ValueError("compress_step needs rows contiguous along the last dim and both "
                         "pending buffers laid out alike.")  # fmt: skip


def compress_step_triton(
    kv_cache: Tensor,
    keys: Tensor | QuantizedKeys | None,
    pending: tuple[Tensor, Tensor],
    raw_rows: Tensor,
    slot: Tensor,
    entry_rows: Tensor,
    entry_offset: int,
    kv: Tensor,
    index_k: Tensor | None,
    gates: Tensor,
) -> None:
    """`compress_step` in one launch; FP8 keys (`QuantizedKeys`) are quantised as
    `write_cache` stores them, from the entry rounded to the values' dtype."""
    pending_values, pending_gates = pending
    streams, d = kv.shape
    dk = 0 if index_k is None else index_k.shape[1]
    ratio = pending_values.shape[1]
    fp8 = isinstance(keys, QuantizedKeys)
    key_values = keys.values if fp8 else keys
    _check_step(kv_cache, key_values, pending, (raw_rows, slot, entry_rows), kv, index_k, gates)
    block = _block_width(ratio, d)
    grid = (streams, triton.cdiv(d, block) + (1 if dk else 0))
    launch(
        _compress_step_kernel, grid, kv, index_k if dk else kv, gates, raw_rows, slot, entry_rows,
        pending_values, pending_gates, kv_cache, key_values if dk else kv_cache,
        keys.scales if fp8 else kv_cache, entry_offset, kv.stride(0),
        index_k.stride(0) if dk else 0, gates.stride(0), pending_values.stride(0),
        pending_values.stride(1), kv_cache.stride(0), key_values.stride(0) if dk else 0,
        D=d, DK=dk, DK_P=triton.next_power_of_2(max(dk, 1)), RATIO=ratio,
        RATIO_P=triton.next_power_of_2(ratio), BLOCK_W=block, KEYS=0 if not dk else 2 if fp8 else 1,
    )  # fmt: skip


def csa_rows(picked: Tensor, entry_pos: Tensor, window: Tensor, offset: int) -> Tensor:
    """(Q, topk + w) latent-buffer rows a CSA query attends to: the entries its indexer picked
    (entry rows, -1 unused) `offset` rows on, -1 all of them while it sees no entry
    (entry_pos < 0), then its (Q, w) window rows."""
    visible = (picked >= 0) & (entry_pos >= 0)[:, None]
    return torch.cat([torch.where(visible, picked + offset, -1), window], 1)


@triton.jit
def _csa_rows_kernel(picked_ptr, entry_pos_ptr, window_ptr, out_ptr, offset, stride_p, stride_w,
                     stride_o, TOPK: tl.constexpr, TOPK_P: tl.constexpr, WINDOW: tl.constexpr,
                     WINDOW_P: tl.constexpr):  # fmt: skip
    q = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, TOPK_P)
    picked = tl.load(picked_ptr + q * stride_p + k, mask=k < TOPK, other=-1)
    seen = tl.load(entry_pos_ptr + q) >= 0
    rows = tl.where((picked >= 0) & seen, picked + offset, -1)
    tl.store(out_ptr + q * stride_o + k, rows.to(out_ptr.dtype.element_ty), mask=k < TOPK)
    w = tl.arange(0, WINDOW_P)
    window = tl.load(window_ptr + q * stride_w + w, mask=w < WINDOW).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + q * stride_o + TOPK + w, window, mask=w < WINDOW)


def csa_rows_triton(picked: Tensor, entry_pos: Tensor, window: Tensor, offset: int) -> Tensor:
    """`csa_rows` in one launch, a program a query."""
    (queries, topk), width = picked.shape, window.shape[1]
    if window.shape[0] != queries or entry_pos.shape != (queries,):
        raise ValueError(f"csa_rows expects picks (Q, k), entry_pos (Q,) and window (Q, w) for "
                         f"one Q; got {tuple(picked.shape)}, {tuple(entry_pos.shape)} and "
                         f"{tuple(window.shape)}")  # fmt: skip
    if picked.stride(-1) != 1 or window.stride(-1) != 1 or entry_pos.stride(0) != 1:
        raise ValueError("csa_rows needs picks and window rows contiguous along the last dim.")
    out = torch.empty(queries, topk + width, device=picked.device, dtype=torch.int64)
    if queries:
        launch(_csa_rows_kernel, (queries,), picked, entry_pos, window, out, offset,
               picked.stride(0), window.stride(0), out.stride(0), TOPK=topk,
               TOPK_P=triton.next_power_of_2(topk), WINDOW=width,
               WINDOW_P=triton.next_power_of_2(max(width, 1)))  # fmt: skip
    return out
