"""Token rows in fp16 for the Gluon INT4 decode kernels' fp16 gate/up (`int4_mma`).

bf16's 7-bit mantissa holds one INT4 nibble a 16-bit half, so turning a packed word of eight
nibbles into bf16 MMA operands takes eight integer instructions; fp16's 10-bit mantissa holds
two, and five do (`kernels.dequant.INT4_TO_BIASED_FP16_PTX`). An MMA takes both operands in
one type, so the activations must be fp16 too, and fp16 spans 2**-24 to 65,504 where bf16
spans 2**-133 to 3e38. Each row is therefore multiplied by a power of two that puts its
largest magnitude in [2**14, 2**15): every bf16 value within 2**28 of it stays exact, and the
kernel multiplies its sums by the row's inverse at the end (exact, a power of two).

The row also takes the order the fp16 conversion leaves K in: within each run of four columns,
the second and third swap places (bytes 0, 2, 1, 3 of a packed word). And the columns of each
16-value run's high nibbles (`formats.pack_int4`: columns 8-15 of the run) are divided by 16,
because those nibbles convert to 1024 + 16 q.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.compiled import launch

TOP = 14  # a row's largest magnitude lands in [2**TOP, 2**(TOP + 1)); fp16's largest is 65,504
RUN = 16  # values a packed run (`formats.pack_int4`): 8 low-nibble columns, then 8 high
NUM_WARPS = 8


@triton.jit
def _fp16_rows_kernel(x_ptr, out_ptr, inverse_ptr, cols, stride_x, stride_o,
                      TOP_POWER: tl.constexpr, RUN_SIZE: tl.constexpr,
                      BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    inside = c < cols
    place = c % 4
    source = c + (place == 1).to(tl.int32) - (place == 2).to(tl.int32)  # 0, 2, 1, 3
    x = tl.load(x_ptr + row * stride_x + source, mask=inside, other=0.0).to(tl.float32)
    largest = tl.max(tl.abs(x), axis=0)
    exponent = ((largest.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2)
    shift = tl.where(largest > 0, TOP_POWER - exponent, 0)
    shift = tl.minimum(tl.maximum(shift, -126), 126)  # both powers of two normal fp32
    scale = ((shift + 127) << 23).to(tl.float32, bitcast=True)
    high = (c % RUN_SIZE) >= RUN_SIZE // 2
    values = x * scale * tl.where(high, 1.0 / 16.0, 1.0)
    tl.store(out_ptr + row * stride_o + c, values.to(tl.float16), mask=inside)
    tl.store(inverse_ptr + row, ((127 - shift) << 23).to(tl.float32, bitcast=True))


def fp16_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """(rows, inverses): x (T, H) in fp16, each row scaled by a power of two, its K in the
    fp16 conversion's order and its high-nibble columns divided by 16; and each row's inverse
    scale (fp32, T). H must be a whole number of 16-value runs."""
    if x.dim() != 2 or x.shape[1] % RUN != 0:
        raise ValueError(f"fp16_rows takes (T, H) rows with H a multiple of {RUN} (whole packed "
                         f"runs); got {tuple(x.shape)}.")  # fmt: skip
    rows = torch.empty(x.shape, dtype=torch.float16, device=x.device)
    inverses = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
    if x.shape[0]:
        launch(_fp16_rows_kernel, (x.shape[0],), x, rows, inverses, x.shape[1], x.stride(0),
               rows.stride(0), TOP_POWER=TOP, RUN_SIZE=RUN,
               BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=NUM_WARPS)  # fmt: skip
    return rows, inverses


def fp16_rows_reference(x: Tensor) -> tuple[Tensor, Tensor]:
    """`fp16_rows` in torch."""
    cols = torch.arange(x.shape[1], device=x.device)
    place = cols % 4
    source = cols + (place == 1).long() - (place == 2).long()
    values = x.float()[:, source]
    largest = values.abs().amax(dim=1)
    exponent = torch.floor(torch.log2(largest.clamp_min(torch.finfo(torch.float32).tiny)))
    shift = torch.where(largest > 0, TOP - exponent, torch.zeros_like(exponent)).clamp(-126, 126)
    scale = torch.exp2(shift)
    high = torch.where(cols % RUN >= RUN // 2, 1.0 / 16.0, 1.0)
    return (values * scale[:, None] * high).to(torch.float16), torch.exp2(-shift)
