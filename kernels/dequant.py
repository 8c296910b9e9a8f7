"""Weight dequantisation into bf16 by bit manipulation, four values a few integer instructions.

Triton converts E4M3 to bf16 through fp16 on sm_90: one `cvt.rn.f16x2.e4m3x2` per two values
and one `cvt.bf16.f16` per value, all on the SM's conversion pipe, which issues a quarter as
many instructions a clock as the integer pipe. A decode-size GEMM reading FP8 weights then
converts them more slowly than HBM delivers them. INT4 was worse: and, shift, int-to-float and
float-to-bf16 per value. The functions here do the same work with byte permutes, shifts and
logic ops, as Marlin and the FasterTransformer kernels do:

- E4M3 -> bf16: a byte's sign, exponent and mantissa bits moved into bf16's fields. The bits
  then mean the value times 2**-120 (E4M3's exponent bias is 7, bf16's 127), subnormals
  included, so the caller multiplies its scale by `E4M3_BITS_SCALE` (the block scale absorbs
  the bias). NaN codes stay finite; weights have none.
- INT4 nibble q -> bf16 q - 8: 0x4300 | q is the bf16 of 128 + q, exactly (bf16 has a unit
  step from 128 to 256), and one bf16x2 FMA subtracts 136 from two values at once.

The PTX runs on the GPU only: under TRITON_INTERPRET the callers take Triton's own conversion,
which gives the same values (`tests/test_dequant.py` checks both against torch on the GPU).
"""

import triton
import triton.language as tl
from torch import Tensor

E4M3_BITS_SCALE = tl.constexpr(2.0**120)  # what the bits of `e4m3_as_bf16` are to be scaled by
MAX_FP8_SCALE = 2.0**7  # above it, a scale times E4M3_BITS_SCALE overflows fp32


def check_fp8_scales(scales: Tensor) -> None:
    """Refuse FP8 block scales the W8A16 kernels cannot fold 2**120 into (a block's absmax
    above 448 * 2**7 = 57,344, far beyond any model's weights)."""
    if bool((scales > MAX_FP8_SCALE).any()):
        raise ValueError(
            f"an FP8 block scale is {scales.max().item():.4g}, above {MAX_FP8_SCALE:g} (a block "
            f"absmax above 57,344): the W8A16 kernels multiply each scale by 2**120, which "
            f"would overflow fp32. Scale the weights down before quantising them."
        )


# out0 takes bytes 0 and 1 of the input word, out1 bytes 2 and 3: each byte goes to the low
# byte of a 16-bit half and its sign, replicated (selector bit 3), to the high byte. Shifted
# left 4, a half holds the sign at bit 15 (and bits 11-14, masked off) and the low 7 bits of
# the byte at bits 4-10, which are bf16's exponent low bits and 3 mantissa bits.
E4M3_TO_BF16_PTX = tl.constexpr("""
{
.reg .b32 t;
prmt.b32 t, $2, 0, 0x9180;
shl.b32 t, t, 4;
and.b32 $0, t, 0x87f087f0;
prmt.b32 t, $2, 0, 0xb3a2;
shl.b32 t, t, 4;
and.b32 $1, t, 0x87f087f0;
}
""")

# The same fields one value a 32-bit word, as fp32: bytes 0 and 1 spread as above, shifted into
# the word's high half (lo) or masked there (hi). Converting E4M3_TO_BF16_PTX's halves to fp32
# took ptxas a permute and a shift for each high half, where a mask is enough.
E4M3_TO_F32_PTX = tl.constexpr("""
{
.reg .b32 t;
prmt.b32 t, $4, 0, 0x9180;
shl.b32 t, t, 4;
and.b32 $1, t, 0x87f00000;
shl.b32 t, t, 16;
and.b32 $0, t, 0x87f00000;
prmt.b32 t, $4, 0, 0xb3a2;
shl.b32 t, t, 4;
and.b32 $3, t, 0x87f00000;
shl.b32 t, t, 16;
and.b32 $2, t, 0x87f00000;
}
""")

# Bytes 0 and 1 (then 2 and 3) spread to the two 16-bit halves of a word; the low nibble of
# each half, or'ed into 0x4300, is the bf16 of 128 + q; the high nibble likewise after a
# shift by 4. $0, $1: the low nibbles of bytes 0-3; $2, $3: the high nibbles.
_INT4_BIASED = """
prmt.b32 lo, $4, 0, 0x4140;
prmt.b32 hi, $4, 0, 0x4342;
lop3.b32 $0, lo, 0x000f000f, 0x43004300, 0xea;
lop3.b32 $1, hi, 0x000f000f, 0x43004300, 0xea;
shr.b32 lo, lo, 4;
shr.b32 hi, hi, 4;
lop3.b32 $2, lo, 0x000f000f, 0x43004300, 0xea;
lop3.b32 $3, hi, 0x000f000f, 0x43004300, 0xea;
"""
# 128 + q, for a kernel that takes the 136 off after its MMA (kernels.moe.int4_mma).
INT4_TO_BIASED_BF16_PTX = tl.constexpr("{\n.reg .b32 lo, hi;" + _INT4_BIASED + "}\n")
# q - 8: fma(v, 1, -136) after the above.
INT4_TO_BF16_PTX = tl.constexpr(
    "{\n.reg .b32 lo, hi, one, offset;\nmov.b32 one, 0x3f803f80;\nmov.b32 offset, 0xc308c308;"
    + _INT4_BIASED
    + "".join(f"fma.rn.bf16x2 ${i}, ${i}, one, offset;\n" for i in range(4))
    + "}\n"
)

# fp16's 10-bit mantissa holds a byte's two nibbles in place: or'ed into 0x6400 (1024), bits
# 0-3 of a half are 1024 + q and bits 4-7 are 1024 + 16 q, so masks take bytes 0 and 2 (then,
# after one shift, bytes 1 and 3) four values an instruction: five instructions a word where
# bf16 takes eight. $0: the low nibbles of bytes 0 and 2, $1: of bytes 1 and 3; $2, $3: the
# high nibbles likewise. K comes out in the order of bytes 0, 2, 1, 3, which the activations
# must follow (`kernels.moe.fp16_rows`).
INT4_TO_BIASED_FP16_PTX = tl.constexpr("""
{
.reg .b32 t;
lop3.b32 $0, $4, 0x000f000f, 0x64006400, 0xea;
lop3.b32 $2, $4, 0x00f000f0, 0x64006400, 0xea;
shr.b32 t, $4, 8;
lop3.b32 $1, t, 0x000f000f, 0x64006400, 0xea;
lop3.b32 $3, t, 0x00f000f0, 0x64006400, 0xea;
}
""")


@triton.jit
def e4m3_as_bf16(w8):
    """The bf16 whose bits are E4M3 `w8`'s moved into place: the value times 2**-120.
    Multiply by `E4M3_BITS_SCALE` (folded into a scale) for the value."""
    return tl.inline_asm_elementwise(
        E4M3_TO_BF16_PTX,
        "=r,=r,r",
        [w8.to(tl.uint8, bitcast=True)],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def e4m3_as_f32(w8):
    """`e4m3_as_bf16` widened to fp32 (exactly; the same value times 2**-120), four values
    from a word in ten integer instructions."""
    return tl.inline_asm_elementwise(
        E4M3_TO_F32_PTX,
        "=r,=r,=r,=r,r",
        [w8.to(tl.uint8, bitcast=True)],
        dtype=tl.float32,
        is_pure=True,
        pack=4,
    )


@triton.jit
def int4_nibbles_as_bf16(packed):
    """(low nibbles, high nibbles) of uint8 `packed`, each q - 8 in bf16, exactly."""
    return tl.inline_asm_elementwise(
        INT4_TO_BF16_PTX,
        "=r,=r,=r,=r,r",
        [packed.to(tl.uint8, bitcast=True)],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )
