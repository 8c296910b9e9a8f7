"""humming_w4a16: humming-kernels' dense W4A16 GEMM (4-bit integer weights with one bf16 scale
per 128 consecutive k of a row, bf16 activations), run on the workbench's own INT4 numbers.

Which numbers. The bench hands every dense peer the FP8 128x128-block `DenseWeights`; this one
takes the weight they stand for (`weights.dequantize()`, fp32) and quantises it with the
workbench's MoE quantiser, `kernels.moe.formats.int4_codes(w, 128)`: symmetric q in [-7, 7]
with scale = absmax / 7 rounded to bf16, stored as the code q + 8, here two codes a byte along
K with even k in the low nibble (the plain GPTQ order, not the run layout the workbench's own
MoE kernels read). So the INT4 comes from the same bf16 masters, through FP8 (a
second rounding, far below INT4's step; a bf16 `DenseWeights` is taken as it is). `holds`
gives the bench what the peer then multiplies by, `int4_values` of those codes, so its
check compares the peer against the product on exactly the INT4 it holds, not the FP8 it was
handed; `error_vs_bf16` keeps measuring what INT4 costs against the masters.

The API path: humming's own weight schema, no checkpoint translation, because the codes packed
in plain order are humming's layout. `humming.layer.HummingLayer` with `weight_config`
`{"quant_method": "humming", "b_dtype": "uint4", "bs_dtype": "bfloat16",
"weight_scale_group_size": 128}` (no zero point) declares `weight` as int32 (N, K/8) and
`weight_scale` as (N, K/128) in the scale dtype (`HummingWeightSchema.get_tensors_attrs`). Its
words hold eight codes each, code k at bits 4*(k % 8) of word k // 8 (`common_pack_weight` in
include/humming/kernel/pack_weight.cuh), which is the workbench's bytes read as little-endian
int32: `packed.view(torch.int32)`, no copy. An unsigned integer weight without a zero point is
read as code - 8 (`humming.utils.weight.dequantize_weight`), the workbench's offset. The bf16
scales are loaded as they are. It is the schema GPTQ's loader converts a `sym=True`,
`group_size=128` checkpoint to (`GPTQWeightSchema.to_humming_schema`, its qweight transposed
to this (N, K/8) layout), so the kernels are the ones a GPTQ checkpoint gets.
`transform()` then does what it does for any symmetric integer weight under float activations:
it recodes the codes to sign-magnitude 4-bit values (`convert_symmetric_integer_weight`; every
workbench code is in [1, 15], the condition for it) and repacks weight and scales for the
kernel.

The timed call is `layer(x)`: `humming_forward`, which quantises nothing for bf16 activations,
then one JIT-compiled humming GEMM writing a new (M, N) bf16 output. A projection whose N is
not a multiple of 128 (the fused `qkv_a`, N=1984) is padded by humming itself
(`pad_n_to_multiple=128`: zero rows inside the layer; the kernel writes only the N real
columns, so no slice): humming's SM90 seed heuristic for bf16 activations
(`build_sm90_seed_config`) asserts an N tile of at least 128, and the FP8 `humming` peer pads
the same projection to whole 128-row blocks too. K must be a
multiple of 128 (humming sizes the scales as floor(K/128) groups; every layer projection is).
`prepare` runs one call on zeros, which JIT-compiles (NVRTC, seconds per shape) the kernels
of every M range humming's heuristics pick for the shape, outside any timed region.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernels.dense import DenseWeights
from kernels.moe.formats import int4_codes, int4_values
from workbench.peers.humming_kernels import INSTALL, VERSION, available

__all__ = ["GROUP", "INSTALL", "VARIANT", "VERSION", "WEIGHT_CONFIG", "available", "prepare"]

GROUP = 128  # k per scale, as GPTQ/AWQ W4A16 checkpoints ship
PAD_N = 128  # humming pads N to this inside the layer (its SM90 N tile)
VARIANT = f"w4a16-group{GROUP}"
WEIGHT_CONFIG = {
    "quant_method": "humming",
    "b_dtype": "uint4",
    "bs_dtype": "bfloat16",
    "weight_scale_group_size": GROUP,
}


def int4_weights(weights: DenseWeights) -> tuple[Tensor, Tensor]:
    """The workbench's INT4 of the weight `weights` stands for: (packed uint8 (N, K/2), even k
    in the low nibble, bf16 scales (N, K/128)) from `int4_codes` of its dequantised values."""
    codes, scales = _codes(weights)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scales


def _codes(weights: DenseWeights) -> tuple[Tensor, Tensor]:
    k = weights.in_features
    if k % GROUP:
        raise ValueError(
            f"humming's W4A16 takes whole {GROUP}-wide scale groups along K; this weight has "
            f"K={k}, not a multiple of {GROUP}."
        )
    return int4_codes(weights.dequantize().float(), GROUP)


def humming_tensors(packed: Tensor, scales: Tensor) -> dict[str, Tensor]:
    """The workbench's INT4 as humming's schema holds it: `weight` int32 (N, K/8), code k at
    bits 4*(k % 8) of word k // 8 (the same bytes, read as little-endian words), and
    `weight_scale` (N, K/128) bf16, as it is."""
    if packed.dtype != torch.uint8 or packed.shape[-1] % 4 or not packed.is_contiguous():
        raise ValueError(
            f"expected contiguous packed uint8 (N, K/2) with K a multiple of 8, got "
            f"{packed.dtype} {tuple(packed.shape)}; build it with int4_weights."
        )
    return {"weight": packed.view(torch.int32), "weight_scale": scales}


def holds(weights: DenseWeights) -> Tensor:
    """The weight the peer multiplies by, for its check: the dequantised INT4, fp32 (N, K)."""
    codes, scales = _codes(weights)
    return int4_values(codes, scales, weights.in_features, GROUP)


def weight_bytes(weights: DenseWeights) -> int:
    """Bytes the peer's GEMM reads for one weight: half a byte a value and its bf16 scales."""
    n, k = weights.values.shape
    return n * (k // 2) + n * (k // GROUP) * 2


def prepare(weights: DenseWeights) -> Callable[[Tensor], Tensor]:
    """The peer's linear(x) for one weight: a transformed HummingLayer, its kernels compiled."""
    from humming.layer import HummingLayer

    packed, scales = int4_weights(weights)
    (n, k), device = weights.values.shape, weights.values.device
    layer = HummingLayer(
        shape_n=n,
        shape_k=k,
        weight_config=dict(WEIGHT_CONFIG),  # humming may fill in a dict it is given
        pad_n_to_multiple=PAD_N,
        torch_dtype=torch.bfloat16,
    ).to(device)
    layer.load_from_tensors(humming_tensors(packed, scales))
    layer.transform()
    layer(torch.zeros(1, k, dtype=torch.bfloat16, device=device))  # JIT-compile now
    return layer
