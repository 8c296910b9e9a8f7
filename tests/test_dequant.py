"""The bit-manipulation conversions of kernels.dequant give Triton's (and torch's) values for
every input byte. They are PTX, so they run on the GPU only (WORKBENCH_GPU_TESTS=1); on the
CPU, tests/test_moe_compile_facts.py assembles the MoE kernels that use them for sm_90."""

import pytest
import torch
import triton
import triton.language as tl
from conftest import GPU_TESTS
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels.dequant import (
    E4M3_BITS_SCALE,
    INT4_TO_BIASED_FP16_PTX,
    e4m3_as_bf16,
    e4m3_as_f32,
    int4_nibbles_as_bf16,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPU_TESTS, reason="PTX: set WORKBENCH_GPU_TESTS=1 on a GPU machine"),
]


@triton.jit
def _e4m3_kernel(codes_ptr, out_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out_ptr + offsets, e4m3_as_bf16(tl.load(codes_ptr + offsets)))


@triton.jit
def _e4m3_f32_kernel(codes_ptr, out_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out_ptr + offsets, e4m3_as_f32(tl.load(codes_ptr + offsets)))


@triton.jit
def _int4_kernel(bytes_ptr, low_ptr, high_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    low, high = int4_nibbles_as_bf16(tl.load(bytes_ptr + offsets))
    tl.store(low_ptr + offsets, low)
    tl.store(high_ptr + offsets, high)


def every_byte() -> torch.Tensor:
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).cuda()


def test_every_finite_e4m3_code_becomes_its_value_times_two_to_the_minus_120():
    codes = every_byte().view(torch.float8_e4m3fn)
    out = torch.empty(256, dtype=torch.bfloat16, device="cuda")
    _e4m3_kernel[(1,)](codes, out, N=256)
    finite = ~codes.float().isnan()
    assert finite.sum() == 254  # 0x7f and 0xff are E4M3's NaNs
    values = out.float().cpu() * E4M3_BITS_SCALE.value  # bf16 subnormals are exact in fp32
    expected = codes.float().cpu()
    assert torch.equal(values[finite.cpu()], expected[finite.cpu()])
    assert torch.equal(out[finite].signbit(), codes.float()[finite].signbit())  # -0 stays -0


def test_every_e4m3_code_widens_to_fp32_as_its_bf16_bits_do():
    codes = every_byte().view(torch.float8_e4m3fn)
    as_bf16 = torch.empty(256, dtype=torch.bfloat16, device="cuda")
    as_f32 = torch.empty(256, dtype=torch.float32, device="cuda")
    _e4m3_kernel[(1,)](codes, as_bf16, N=256)
    _e4m3_f32_kernel[(1,)](codes, as_f32, N=256)
    # bit for bit, NaN codes and the subnormals' fp32 subnormals included
    assert torch.equal(as_f32.view(torch.int32), as_bf16.float().view(torch.int32))


def test_every_byte_splits_into_its_two_nibbles_minus_eight():
    packed = every_byte()
    low = torch.empty(256, dtype=torch.bfloat16, device="cuda")
    high = torch.empty_like(low)
    _int4_kernel[(1,)](packed, low, high, N=256)
    as_int = packed.int()
    assert torch.equal(low.float(), ((as_int & 15) - 8).float())
    assert torch.equal(high.float(), ((as_int >> 4) - 8).float())


# each thread holds one word in four registers, as `int4_mma.word_layout` spreads a word
_SPREAD = gl.constexpr(gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0]))


@gluon.jit
def _int4_fp16_kernel(words_ptr, low_ptr, high_ptr):
    """Each word handed to the conversion four times, in one thread's four consecutive
    registers, as `int4_mma._as_operands` hands it (Gluon: the layout says so)."""
    rows = gl.arange(0, 128, layout=gl.SliceLayout(1, _SPREAD))
    places = gl.arange(0, 4, layout=gl.SliceLayout(0, _SPREAD))
    index = (gl.program_id(0) * 128 + rows)[:, None] * 4 + places[None, :]
    spread = gl.load(words_ptr + index // 4)
    low, high = gl.inline_asm_elementwise(
        INT4_TO_BIASED_FP16_PTX, "=r,=r,=r,=r,r,r,r,r", [spread],
        dtype=(gl.float16, gl.float16), is_pure=True, pack=4,
    )  # fmt: skip
    gl.store(low_ptr + index, low)
    gl.store(high_ptr + index, high)


def test_every_byte_in_every_place_of_a_word_becomes_fp16_nibbles_in_k_order_0_2_1_3():
    # 256 words, byte b of word i the byte (i + 67 b) % 256: every byte in every place
    places = torch.arange(4)
    codes = (torch.arange(256)[:, None] + 67 * places[None, :]) % 256
    words = (codes << (8 * places)).sum(dim=1).to(torch.int64)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).cuda()
    low = torch.empty(4 * 256, dtype=torch.float16, device="cuda")
    high = torch.empty_like(low)
    _int4_fp16_kernel[(256 // 128,)](words, low, high, num_warps=4)
    in_order = codes[:, [0, 2, 1, 3]].flatten()  # the bytes in the order K comes out
    assert torch.equal(low.float().cpu(), 1024.0 + (in_order & 15).float())
    assert torch.equal(high.float().cpu(), 1024.0 + 16.0 * (in_order >> 4).float())
