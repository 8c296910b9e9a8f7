"""The CUDA-core W8A16 kernel for a few token rows (kernels/dense/w8a16_gemv.py): its results
against fp32 on the dequantised weights, under the interpreter and on the GPU, the rows it is
picked for, its plan of a program's rows and K pieces, and the errors bad options get."""

import pytest
import torch
from helpers import relative_error
from test_dense_kernels import make, master, with_distinct_block_scales

import kernels.dense as dense
from kernels.dense import DenseWeights, linear_reference
from kernels.dense.w8a16_gemv import GEMV_MAX_M, MAX_ROWS, gemv_block_n, k_pieces


@pytest.mark.parametrize(
    ("m", "n", "k", "block", "options"),
    [
        (1, 40, 256, 32, {}),  # one piece, rows past N masked
        (3, 130, 640, 128, {}),  # 4 + 1 blocks: a rest piece of one
        (4, 70, 1152, 128, {"block_n": 16}),  # 8 + 1
        (2, 64, 1792, 128, {"num_warps": 8}),  # 8 + 6 blocks, the rest padded to 8 (masked)
        (1, 256, 384, 128, {"tile_bytes": 1024}),  # two rows a program
        (4, 33, 96, 32, {"block_n": 1}),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gemv_kernel_computes_w8a16(m, n, k, block, options, dtype, device):
    x, weights = make(m, n, k, dtype, block=block, device=device)
    weights = with_distinct_block_scales(weights)
    out = dense.linear_w8a16(x, weights, gemv=True, **options)
    assert out.dtype == dtype and out.shape == (m, n)
    assert relative_error(out, linear_reference(x, weights)) < (
        1e-5 if dtype == torch.float32 else 1e-2
    )
    assert list(dense.last_facts()) == ["w8a16_gemv_kernel"]


def test_the_gemv_kernel_runs_a_group_in_one_launch(device):
    ws = [master(96, 384, seed).to(device) for seed in range(4)]
    group = DenseWeights.quantize_group(ws, "fp8", 128)
    x = torch.randn(2, 4 * 384, generator=torch.Generator().manual_seed(5)).to(device)
    out = dense.linear_w8a16_group(x.view(2, 4, 384), group, gemv=True)
    want = torch.cat([x[:, g * 384 : (g + 1) * 384] @ w.dequantize().T
                      for g, w in enumerate(group)], 1)  # fmt: skip
    assert relative_error(out, want) < 1e-5
    assert list(dense.last_facts()) == ["w8a16_gemv_kernel"]


@pytest.mark.parametrize(
    ("m", "k", "options", "kernel"),
    [
        (1, 256, {}, "w8a16_gemv_kernel"),
        (GEMV_MAX_M, 256, {"pdl": False}, "w8a16_gemv_kernel"),  # pdl=False asks for nothing
        (GEMV_MAX_M + 1, 256, {}, "w8a16_kernel"),
        (1, 200, {}, "w8a16_kernel"),  # K not whole 32-wide blocks
        (1, 256, {"block_n": 32}, "w8a16_kernel"),  # a Triton tile option
    ],
)
def test_w8a16_takes_the_gemv_kernel_up_to_its_rows_where_no_option_says_otherwise(
    m, k, options, kernel, device
):
    x, weights = make(m, 64, k, device=device)
    dense.linear_w8a16(x, weights, **options)
    assert list(dense.last_facts()) == [kernel]


def test_a_program_takes_the_most_rows_whose_k_fits_its_bytes():
    assert gemv_block_n(5120, 128, tile_bytes=32 * 1024) == 4  # 20 KB: 8 rows would be 40
    assert gemv_block_n(1280, 128, tile_bytes=32 * 1024) == 16
    assert gemv_block_n(1152, 32, tile_bytes=32 * 1024) == 16
    assert gemv_block_n(256, 32, tile_bytes=32 * 1024) == 32  # never past one scale block
    assert gemv_block_n(65536, 128) == 1  # at least one row, whatever K
    assert gemv_block_n(1280, 128) == 4  # the default: 8 KB


def test_k_is_loaded_as_a_power_of_two_piece_and_the_rest():
    assert k_pieces(40) == (32, 8, 8)  # K = 5120 in 128-wide blocks
    assert k_pieces(10) == (8, 2, 2)
    assert k_pieces(32) == (32, 0, 0)
    assert k_pieces(14) == (8, 6, 8)
    assert k_pieces(1) == (1, 0, 0)


@pytest.mark.parametrize(
    ("m", "k", "options", "message"),
    [
        (MAX_ROWS + 1, 256, {"gemv": True}, f"takes up to {MAX_ROWS} token rows"),
        (1, 200, {"gemv": True}, r"K \(200\) to be a whole number of 32-wide scale blocks"),
        (1, 256, {"gemv": True, "block_n": 12}, "block_n=12 must be a power of two"),
        (1, 256, {"gemv": True, "block_n": 64}, "block_n=64 must be a power of two"),
        (1, 256, {"gemv": True, "num_warps": 3}, "num_warps=3 must be one of"),
        (1, 256, {"gemv": True, "tile_bytes": 512, "block_n": 4}, "pass one of the two"),
        (1, 256, {"gemv": True, "block_k": 64}, r"leave out \['block_k'\]"),
        (1, 256, {"gemv": True, "pdl": None}, "launches without PDL"),
        (1, 256, {"tile_bytes": 512}, "tile_bytes is an option of the gemv kernel"),
        (1, 256, {"gemv": True, "wgmma": True}, "pick two kernels"),
    ],
)
def test_the_gemv_kernel_refuses_what_it_cannot_take(m, k, options, message):
    x, weights = make(m, 64, k)
    with pytest.raises(ValueError, match=message):
        dense.linear_w8a16(x, weights, **options)
