"""FP8 activations as DeepSeek's W8A8 takes them: E4M3 values with one power-of-two scale per
token and K block, by one Triton kernel, and the two Triton helpers kernels quantise with in
their epilogues (the MoE W8A8 path's h, the FP8 indexer's queries and keys).

Power-of-two scales make the scaling exact, so a value's only error is E4M3's rounding
(`round_to_e4m3`), the same on the GPU and in the interpreter. The W8A8 GEMMs (dense and MoE)
multiply each K block's FP8 product by its rows' scales.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch

QUANT_ROWS = 32  # token rows per program of the activation quantiser


@triton.jit
def pow2_scale(absmax):
    """(scale, 1 / scale): the smallest power of two with absmax / scale <= 448, from the bits.

    absmax = 1.f * 2**(b - 127) fits under 448 = 1.75 * 2**8 scaled by 2**(b - 135), or by
    2**(b - 134) when 1.f > 1.75; both results are built exactly as float bits, matching
    formats.pow2_scales (scale 1 for absmax 0, exponents clamped to fp32's normal range).
    """
    bits = absmax.to(tl.int32, bitcast=True)
    power = ((bits >> 23) & 0xFF) - 8 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    power = tl.minimum(tl.maximum(power, 1), 254)
    power = tl.where(absmax > 0, power, 127)
    scale = (power << 23).to(tl.float32, bitcast=True)
    inverse = ((254 - power) << 23).to(tl.float32, bitcast=True)
    return scale, inverse


@triton.jit
def round_to_e4m3(v):
    """fp32 v (|v| <= 448) rounded to the nearest E4M3 value, ties to even, still in fp32.

    Adding then subtracting 1.5 * 2**23 steps rounds v to a multiple of the step (2**-3 of its
    binade, 2**-9 below E4M3's smallest normal 2**-6) by fp32's own round-to-nearest-even. The
    conversion to fp8 is then exact everywhere; converting directly would be exact on the GPU,
    but the Triton interpreter drops the carry into the exponent (127.9 becomes 64).
    """
    biased = tl.maximum((v.to(tl.int32, bitcast=True) >> 23) & 0xFF, 121)  # 121: 2**-6
    magic = (((biased + 20) << 23) | 0x400000).to(tl.float32, bitcast=True)
    return (v + magic) - magic


@triton.jit
def fp8_rows(rows):
    """(FP8 rows, each row's power-of-two scale) of a (R, D) fp32 block, a row quantised as
    the indexer's queries are: one scale per (query, head)."""
    scale, inverse = pow2_scale(tl.max(tl.abs(rows), axis=1))
    return round_to_e4m3(rows * inverse[:, None]).to(tl.float8e4nv), scale


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_xk, stride_qm, stride_sm, stride_sk,
    BLOCK_R: tl.constexpr, QBLOCK: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    block = tl.program_id(1)
    cols = block * QBLOCK + tl.arange(0, QBLOCK)
    mask = (rows < M)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xk, mask=mask,
                other=0.0).to(tl.float32)  # fmt: skip
    scale, inverse = pow2_scale(tl.max(tl.abs(x), axis=1))
    q = round_to_e4m3(x * inverse[:, None]).to(tl.float8e4nv)  # the scaling is exact
    tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=mask)
    tl.store(s_ptr + rows * stride_sm + block * stride_sk, scale, mask=rows < M)


def quantize_activations(x: Tensor, block: int, outer_major: bool = False) -> tuple[Tensor, Tensor]:
    """(values float8_e4m3fn (M, K), scales fp32 (M, cdiv(K, block))), as
    `reference.quantize_activations_reference` computes them.

    `outer_major` stores the scales token-fastest, strides (1, M), the layout cuBLAS's 1x128
    blockwise scaling reads, so a caller feeding `torch.nn.functional.scaled_mm` needs no copy.
    """
    m, k = x.shape
    blocks = triton.cdiv(k, block)
    values = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    shape = (blocks, m) if outer_major else (m, blocks)
    scales = torch.empty(shape, dtype=torch.float32, device=x.device)
    scales = scales.t() if outer_major else scales
    grid = (triton.cdiv(m, QUANT_ROWS), blocks)
    launch(
        _quantize_rows_kernel, grid, x, values, scales, m, k, *x.stride(), values.stride(0),
        *scales.stride(), BLOCK_R=QUANT_ROWS, QBLOCK=block,
    )  # fmt: skip
    return values, scales
