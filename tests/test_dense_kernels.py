"""Dense GEMM variants under the Triton interpreter against their fp32 references: the FP8
format (power-of-two block scales), W8A16, W8A8 with its activation quantiser, the hybrid
switch, and the errors bad input gets."""

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import GPU_TESTS
from helpers import relative_error

import kernels.dense as dense
from kernels.dense import DenseWeights, linear_reference, w8a8, w8a8_reference
from kernels.dense.formats import pow2_scales
from kernels.dense.reference import quantize_activations_reference
from kernels.dense.w8a8_wgmma import gemm_w8a8_wgmma, scale_descriptor
from kernels.dense.w8a16_wgmma import (
    linear_w8a16_wgmma,
    linear_w8a16_wgmma_group,
    split_count,
    tile_plan,
)
from kernels.fp8_quant import quantize_activations


def master(n, k, seed=0, outlier=40.0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) / k**0.5
    w[0] *= outlier  # an outlier row: its blocks' scales must not flatten the others
    return w


def make(m, n, k, dtype=torch.float32, block=32, seed=0, device="cpu"):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1))
    w = master(n, k, seed).to(dtype).to(device)
    return x.to(dtype).to(device), DenseWeights.quantize(w, "fp8", block)


def with_distinct_block_scales(weights: DenseWeights) -> DenseWeights:
    """`weights` with every 128 x 128 block's scale a different power of two (2**-2 to 2**2,
    by block row and column), so a kernel reading a neighbouring block's scale is caught; the
    test weights' own scales are nearly all alike."""
    rows, cols = weights.scales.shape
    steps = (torch.arange(rows)[:, None] * 3 + torch.arange(cols)[None, :]) % 5 - 2
    spread = torch.exp2(steps.to(weights.scales.dtype)).to(weights.scales.device)
    return DenseWeights("fp8", weights.values, weights.scales * spread, weights.block)


def test_kernels_dense_imports_first_in_a_fresh_interpreter():
    """The scripts import kernels.dense before anything else: kernels.dense.tiles imports
    kernels.moe, whose kernels import kernels.dense modules, so a name imported back from
    kernels.dense.tiles would meet that module half imported (a circular import)."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", "import kernels.dense"], check=True, timeout=120,
                   cwd=root)  # fmt: skip


# ---- the format ----------------------------------------------------------------------------
def test_pow2_scales_are_the_smallest_power_of_two_that_fits_448():
    absmax = torch.tensor([448.0, 449.0, 1.0, 0.875, 3e-3, 0.0, 1e30])
    scales = pow2_scales(absmax)
    assert scales.tolist()[:3] == [1.0, 2.0, 2.0**-8]
    assert scales[5] == 1.0  # all-zero block
    mantissa, _ = torch.frexp(scales)
    assert (mantissa == 0.5).all()  # powers of two
    assert (absmax / scales <= 448).all() and (absmax[:5] / (scales[:5] / 2) > 448).all()


@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("shape", [(70, 100), (33, 32)])
def test_fp8_weights_round_trip_within_e4m3_rounding(shape, block):
    _, weights = make(1, *shape, block=block)
    n, k = shape
    assert weights.values.dtype == torch.float8_e4m3fn
    assert weights.scales.shape == (-(-n // block), -(-k // block))
    w = master(n, k)
    back = weights.dequantize()
    scale_of = weights.scales.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]
    # 3 mantissa bits: half a step is 2^-4 relative; subnormals step 2^-9 * scale.
    assert ((back - w).abs() <= w.abs() * 2**-4 + scale_of * 2**-10).all()
    assert weights.nbytes == n * k + 4 * weights.scales.numel()


def test_dequantised_values_are_exact_in_bf16():
    _, weights = make(1, 64, 96)
    back = weights.dequantize()
    assert torch.equal(back.to(torch.bfloat16).float(), back)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda v, s: DenseWeights("fp8", v, s[:, :1], 32), r"needs scales of shape \(2, 3\)"),
        (lambda v, s: DenseWeights("fp8", v.float(), s), "must be torch.float8_e4m3fn"),
        (lambda v, s: DenseWeights("fp8", v, None), "needs scales"),
        (lambda v, s: DenseWeights("fp8", v, s, block=64), "block=64"),
        (lambda v, s: DenseWeights("bf16", v.float(), s), "take no scales"),
        (lambda v, s: DenseWeights("int4", v, s), "unknown dense weight format"),
        (lambda v, s: DenseWeights.quantize(v.float().half()), "unsupported dtypes"),
        (lambda v, s: DenseWeights.quantize(v.float().int()), "bf16 or fp32"),
        (lambda v, s: DenseWeights.quantize(v.float(), block=48), "power of two >= 32"),
        (lambda v, s: DenseWeights.quantize(v.float()[:0]), "empty"),
    ],
)
def test_bad_weights_raise_a_clear_error(build, message):
    _, weights = make(1, 40, 72)
    with pytest.raises(ValueError, match=message):
        build(weights.values, weights.scales)


# ---- the kernels -----------------------------------------------------------------------------
SHAPES = [(1, 40, 72), (5, 130, 200), (33, 70, 96), (130, 64, 160)]  # odd sizes, every tile set
# fp32 in, FP8 products: exact under the interpreter. Hopper's FP8 MMAs keep about 14 bits of
# their running sum (DeepSeek-V3 report, section 3.3.2), seen on the H200 as errors over 1e-5
# from 64-row tiles up; the kernel promotes each 32-wide product to fp32, which bounds it.
FP8_MMA_TOLERANCE = {"cpu": 1e-5, "cuda": 1e-3}


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a16_matches_fp32_on_the_dequantised_weights(m, n, k, dtype, device):
    x, weights = make(m, n, k, dtype, device=device)
    out = dense.linear_w8a16(x, weights)
    assert out.dtype == dtype and out.shape == (m, n)
    assert relative_error(out, linear_reference(x, weights)) < (
        1e-5 if dtype == torch.float32 else 1e-2
    )


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_matches_fp32_on_quantised_activations_and_weights(m, n, k, dtype, device):
    x, weights = make(m, n, k, dtype, device=device)
    out = dense.linear_w8a8(x, weights)
    assert out.dtype == dtype and out.shape == (m, n)
    assert relative_error(out, w8a8_reference(x, weights)) < (
        FP8_MMA_TOLERANCE[device.type] if dtype == torch.float32 else 1e-2
    )


@pytest.mark.parametrize("linear", [dense.linear_w8a16, dense.linear_w8a8])
def test_fp8_accuracy_against_the_unquantised_weights_is_within_5e_2(linear, device):
    # What quantisation costs (weights, and activations for W8A8): the FP8 bound.
    x = torch.randn(24, 256, generator=torch.Generator().manual_seed(2)).to(device)
    w = master(96, 256, outlier=1.0).to(device)
    error = relative_error(linear(x, DenseWeights.quantize(w)), x.double() @ w.double().T)
    assert 5e-3 < error < 5e-2


@pytest.mark.parametrize("linear", [dense.linear_w8a16, dense.linear_w8a8])
@pytest.mark.parametrize(
    "options",
    [
        {"split_k": 1},
        {"split_k": 3},  # three K splits through the fp32 partial buffer
        {"block_k": 32, "split_k": 7},  # more splits than K tiles: clipped, none empty
        {"block_m": 16, "block_n": 16, "block_k": 64, "num_warps": 1, "num_stages": 1},
    ],
)
def test_tile_options_and_split_k_keep_the_result(linear, options, device):
    x, weights = make(3, 50, 200, device=device)
    ref = (
        w8a8_reference(x, weights) if linear is dense.linear_w8a8 else linear_reference(x, weights)
    )
    assert relative_error(linear(x, weights, **options), ref) < 1e-5


@pytest.mark.parametrize("m", [3, 40])
def test_w8a16_orientations_agree(m, device):
    # swap_ab computes y.T = W @ x.T (the prefill default), the direct form x @ W.T (decode's).
    x, weights = make(m, 70, 160, device=device)
    ref = linear_reference(x, weights)
    for swap_ab in (False, True):
        out = dense.linear_w8a16(x, weights, swap_ab=swap_ab, block_m=16, block_n=32)
        assert relative_error(out, ref) < 1e-5, swap_ab
    with pytest.raises(ValueError, match="swap_ab is a W8A16 option"):
        dense.linear_w8a8(x, weights, swap_ab=True)


def test_the_default_split_plan_fills_the_gpu_but_bounds_the_reduction(monkeypatch):
    from kernels.dense import tiles

    monkeypatch.setattr(tiles, "planned_sms", lambda device: 132)  # an H200
    decode = tiles.GemmTiles(16, 64, 128, 4, 4)
    # index_w (N=64, K=5120) at M=1: one tile, so 40 splits (every K tile) for 264 programs
    assert tiles.split_plan(decode, 1, 64, 5120, torch.device("cpu")) == (40, 128)
    # the same at M=128 with 128 x 128 tiles: 64 KB partial tiles, at most 8 of them summed
    prefill = tiles.GemmTiles(128, 128, 64, 8, 3)
    assert tiles.split_plan(prefill, 128, 64, 5120, torch.device("cpu")) == (8, 640)
    assert tiles.split_plan(prefill, 4096, 5120, 4096, torch.device("cpu")) == (1, 4096)
    assert tiles.split_plan(prefill.override(split_k=20), 128, 64, 5120,
                            torch.device("cpu")) == (20, 256)  # fmt: skip


def test_balanced_splits_spare_the_busiest_sm():
    from kernels.dense.tiles import MAX_ROUNDS, balanced_splits

    # o_a's 64 tiles (32 K steps) on 132 SMs: 5 splits stack a third program of 7 steps on 56
    # SMs (21 steps), 4 splits two of 8 (16), 8 splits four of 4 (16, but more partial sums)
    assert balanced_splits(64, 32, 132, 128) == (4, 8)
    # qkv_a's 31 tiles: 4 splits would be one round (one program an SM), 8 are two of 5 steps
    assert balanced_splits(31, 40, 132, 128) == (8, 5)
    # q_up's 384 tiles already fill three rounds: no split
    assert balanced_splits(384, 10, 132, 128) == (1, 10)
    # one tile: every plan is one round, so the shortest splits
    assert balanced_splits(1, 40, 132, 128) == (40, 1)
    # `most` bounds the splits; beyond MAX_ROUNDS only the unsplit plan is left
    assert balanced_splits(1, 40, 132, 8) == (8, 5)
    assert balanced_splits(MAX_ROUNDS * 132 + 1, 10, 132, 128) == (1, 10)


@pytest.mark.parametrize("swap_ab", [False, True])
def test_sub_tiles_past_k_read_no_scale(swap_ab, device):
    # K=72 in a 128-wide K tile: sub-tiles at 96 lie past K, in no scale block. Scales held as a
    # view of a wider buffer whose spare column is NaN must not leak into the result.
    x, weights = make(3, 64, 72, device=device)
    padded = torch.full((weights.scales.shape[0], weights.scales.shape[1] + 2), float("nan"),
                        device=device)  # fmt: skip
    padded[:, : weights.scales.shape[1]] = weights.scales
    viewed = DenseWeights("fp8", weights.values, padded[:, : weights.scales.shape[1]], 32)
    out = dense.linear_w8a16(x, viewed, block_k=128, block_m=16, block_n=32, swap_ab=swap_ab)
    assert relative_error(out, linear_reference(x, weights)) < 1e-5


def test_split_k_leaves_its_arrival_counters_at_zero_for_the_next_gemm(device):
    from kernels.dense.tiles import _locks

    x, weights = make(4, 200, 256, device=device)
    first = dense.linear_w8a16(x, weights, split_k=4, block_n=16)  # 13 tiles x 4 splits
    assert not _locks[x.device].any()
    assert torch.equal(dense.linear_w8a16(x, weights, split_k=4, block_n=16), first)


@pytest.mark.parametrize("linear", [dense.linear_w8a16, dense.linear_w8a8])
def test_blocks_wider_than_a_k_tile_and_strided_activations(linear, device):
    # block 128 with block_k 64: one scale covers two K tiles. x is a column slice (as the
    # model's output-projection groups are), so its row stride is not its width.
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(6, 2 * 136, generator=gen).to(device)
    x = wide[:, 136:]
    weights = DenseWeights.quantize(torch.randn(80, 136, generator=gen).to(device), block=128)
    ref = (
        w8a8_reference(x, weights) if linear is dense.linear_w8a8 else linear_reference(x, weights)
    )
    assert relative_error(linear(x, weights, block_k=64), ref) < 1e-5


def test_activation_quantiser_matches_the_reference_bit_for_bit(device):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(37, 100, generator=gen) * torch.logspace(-3, 3, 100)
    x[3, 32:64] = 0.0  # an all-zero block: scale 1
    x[5, :32] = 127.9 * 2.0**-3  # rounds up into the next binade: the interpreter's trap
    x = x.to(device)
    values, scales = dense.quantize_activations(x, 32)
    ref_values, ref_scales = quantize_activations_reference(x, 32)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(values.float(), ref_values.float())
    assert scales[3, 1] == 1.0 and (values[3, 32:64].float() == 0).all()


def test_hybrid_switches_at_hybrid_m(monkeypatch):
    import kernels.dense.hybrid as hybrid

    calls = []
    monkeypatch.setattr(hybrid, "linear_w8a16", lambda x, w, pdl: calls.append("w8a16"))
    monkeypatch.setattr(hybrid, "linear_w8a8", lambda x, w: calls.append("w8a8"))
    monkeypatch.delenv("DENSE_HYBRID_M", raising=False)
    for m in (1, 256, 257):
        hybrid.linear_hybrid(torch.zeros(m, 8), None)
    assert calls == ["w8a16", "w8a16", "w8a8"]
    monkeypatch.setenv("DENSE_HYBRID_M", "4")
    hybrid.linear_hybrid(torch.zeros(5, 8), None)
    hybrid.linear_hybrid(torch.zeros(5, 8), None, hybrid_m=8)  # the argument wins
    assert calls[3:] == ["w8a8", "w8a16"]
    monkeypatch.setenv("DENSE_HYBRID_M", "big")
    with pytest.raises(ValueError, match=r"\$DENSE_HYBRID_M='big' is not an integer"):
        dense.hybrid_threshold()
    with pytest.raises(ValueError, match="hybrid_m=-1 must be an integer >= 0"):
        dense.hybrid_threshold(-1)


def test_hybrid_gives_each_paths_answer(device):
    x, weights = make(6, 40, 72, device=device)
    assert torch.equal(dense.linear_hybrid(x, weights, hybrid_m=6), dense.linear_w8a16(x, weights))
    assert torch.equal(dense.linear_hybrid(x, weights, hybrid_m=5), dense.linear_w8a8(x, weights))


def test_variants_name_their_weight_format_and_facts_are_recorded(device):
    assert set(dense.VARIANTS) == {"bf16", "w8a16", "w8a8", "hybrid"}
    assert dense.WEIGHT_FORMAT == {"bf16": "bf16", "w8a16": "fp8", "w8a8": "fp8", "hybrid": "fp8"}
    x, weights = make(2, 40, 300, device=device)
    dense.linear_w8a8(x, weights, split_k=2)
    facts = dense.last_facts()
    assert list(facts) == ["quantize_rows_kernel", "w8a8_kernel"]  # split-K in one launch
    compiled = device.type == "cuda"  # the interpreter makes no binary to read facts from
    assert all((f.n_regs is not None) == compiled for f in facts.values())


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("linear", [dense.linear_w8a16, dense.linear_w8a8])
def test_default_tiles_compile_without_spills_and_replay_in_a_cuda_graph(linear, m):
    # The TP2 shared expert's gate/up shape; split-K at small M, its counters inside a graph.
    x, weights = make(m, 2304, 5120, torch.bfloat16, device="cuda")
    eager = linear(x, weights)
    assert all(f.n_spills == 0 for f in dense.last_facts().values()), dense.last_facts()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = linear(x, weights)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    # equal up to rounding: the Gluon W8A16 kernel's splits of K add in L2 in no fixed order
    assert relative_error(replayed, eager) < 1e-3


@pytest.mark.parametrize("linear", [dense.linear_w8a16, dense.linear_w8a8, dense.linear_hybrid])
@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.zeros(0, 72), r"no rows \(M == 0\)"),
        (torch.zeros(3, 70), "K=70 columns but the weight is"),
        (torch.zeros(3, 72, dtype=torch.float16), "x must be bf16 or fp32"),
        (torch.zeros(3, 72, dtype=torch.int32), "x must be bf16 or fp32"),
        (torch.zeros(2, 3, 72), r"x must be \(M, K\)"),
    ],
)
def test_bad_activations_raise_a_clear_error(linear, x, message):
    _, weights = make(1, 40, 72)
    with pytest.raises(ValueError, match=message):
        linear(x, weights)


def test_fp8_variants_refuse_unquantised_weights():
    x = torch.zeros(2, 72)
    with pytest.raises(ValueError, match="needs fp8 DenseWeights, got Tensor"):
        dense.linear_w8a16(x, torch.zeros(40, 72))
    with pytest.raises(ValueError, match="needs fp8 DenseWeights, got bf16"):
        dense.linear_w8a8(x, DenseWeights.quantize(torch.zeros(40, 72), "bf16"))
    _, weights = make(1, 40, 72)
    with pytest.raises(ValueError, match="block_k=24 must be a power of two"):
        dense.linear_w8a16(x, weights, block_k=24)
    with pytest.raises(ValueError, match="split_k=0 must be an integer >= 1"):
        dense.linear_w8a8(x, weights, split_k=0)


# ---- W8A8 at prefill sizes: the persistent TMA kernel ----------------------------------------
@pytest.mark.parametrize(
    ("m", "n", "k", "options"),
    [
        (200, 256, 384, {"block_m": 64, "block_n": 64, "num_warps": 4}),  # M, N tails in tiles
        (70, 192, 256, {"block_m": 64, "block_n": 128, "num_warps": 4, "tma": True}),
        (5, 64, 128, {"block_m": 64, "block_n": 64, "num_warps": 4, "tma": True}),  # forced
        # a tile two weight blocks wide: a scale per column, not one per tile
        (70, 384, 256, {"block_m": 64, "block_n": 256, "num_warps": 4, "tma": True}),
        # two K steps an iteration, the last pair half past K (three steps)
        (
            70,
            256,
            384,
            {"block_m": 64, "block_n": 128, "num_warps": 4, "tma": True, "paired_k": True},
        ),
    ],
)
def test_the_tma_w8a8_kernel_computes_w8a8(m, n, k, options, device):
    """The persistent kernel against the exact W8A8 product: each 128-wide K step's product
    rescaled by its row and column scales (one weight scale per tile up to 128 wide, one per
    column beyond), every output tile visited once by the programs walking the tiles."""
    x, weights = make(m, n, k, torch.bfloat16, block=128, seed=m, device=device)
    out = dense.linear_w8a8(x, weights, **options)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert relative_error(out, dense.w8a8_reference(x, weights)) < 1e-2


# two-wave tiles in a 3-slot ring with the row scales in it and the weight scales staged
TWO_WAVES_BOTH_SCALES = dict(block_m=256, num_stages=3, ring_scales=True, staged_weight_scales=True)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "n", "k", "options"),
    [
        (300, 384, 512, {}),  # M tail in the last tile (9 tiles, one a program)
        (1000, 200, 1040, {"num_stages": 3}),  # N and K tails: TMA zero-fills, scales masked
        (4096, 1024, 4096, {"block_n": 64}),  # several tiles a program, 64-wide tiles
        (7, 128, 256, {}),  # fewer rows than a warpgroup
        (300, 384, 512, {"block_m": 256, "num_stages": 4}),  # two waves; the second's tail
        (1000, 200, 1040, {"block_m": 256, "num_stages": 3}),  # two waves, N and K tails
        (200, 128, 384, {"block_m": 256}),  # the second wave partly past the last row
        # several tiles a program with fewer K steps than ring slots: the load warp's cursor
        # crosses tiles inside its window
        (8192, 2048, 128, {}),
        (8192, 2048, 256, {"block_m": 128, "num_stages": 5}),
        # the row scales by TMA with each slot: rows past M zero-filled, the K tail's block,
        # two waves, and the cursor crossing tiles with one wave and with two
        (300, 384, 512, {"ring_scales": True}),
        (1000, 200, 1040, {"block_m": 256, "num_stages": 3, "ring_scales": True}),
        (4096, 1024, 4096, {"block_m": 256, "num_stages": 3, "ring_scales": True}),
        (8192, 2048, 256, {"block_m": 128, "num_stages": 5, "ring_scales": True}),
        (8192, 2048, 512, {"block_m": 256, "num_stages": 3, "ring_scales": True}),  # 512 tiles
        # a tile's weight scales staged in shared memory, the next tile's loaded a tile ahead:
        # one tile a program, fewer rows than a warpgroup, the K tail (9 of 16 slots), and
        # programs walking tiles of several weight blocks, with one wave and with two
        (300, 384, 512, {"staged_weight_scales": True}),
        (7, 128, 256, {"staged_weight_scales": True}),
        (1000, 200, 1040, TWO_WAVES_BOTH_SCALES),
        (8192, 2048, 256, {"block_m": 128, "num_stages": 5, "staged_weight_scales": True}),
        (8192, 2048, 512, TWO_WAVES_BOTH_SCALES),
        (4096, 1024, 4096, TWO_WAVES_BOTH_SCALES),
    ],
)
def test_the_wgmma_w8a8_kernel_computes_w8a8(m, n, k, options, device):
    """The Gluon kernel (two warpgroups over one TMA ring that runs across tiles) against the
    exact W8A8 product, every weight block with its own scale. Gluon has no interpreter: this
    runs under WORKBENCH_GPU_TESTS=1 only; on the CPU, tests/test_dense_wgmma_sass.py checks
    what it compiles to."""
    if device.type != "cuda":
        pytest.skip("the Gluon kernel runs on a GPU only (WORKBENCH_GPU_TESTS=1)")
    x, weights = make(m, n, k, torch.bfloat16, block=128, seed=m, device=device)
    weights = with_distinct_block_scales(weights)
    out = dense.linear_w8a8(x, weights, wgmma=True, **options)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert relative_error(out, dense.w8a8_reference(x, weights)) < 1e-2


def test_the_wgmma_kernel_refuses_what_it_cannot_take(device):
    if device.type != "cuda":  # Gluon has no interpreter: asked for on the CPU, it says so
        x, weights = make(300, 256, 128, torch.bfloat16, block=128, device=device)
        with pytest.raises(ValueError, match="needs an sm_90 \\(Hopper\\) GPU, got cpu"):
            dense.linear_w8a8(x, weights, wgmma=True)
    x, weights = make(80, 256, 128, torch.bfloat16, block=32, device=device)
    with pytest.raises(ValueError, match="takes 128-wide blocks, got 32"):
        dense.linear_w8a8(x, weights, wgmma=True)
    x, weights = make(80, 256, 128, torch.bfloat16, block=128, device=device)
    with pytest.raises(ValueError, match="leave out \\[\\] and the TMA kernel's options"):
        dense.linear_w8a8(x, weights, wgmma=True, tma=True)
    with pytest.raises(ValueError, match=r"leave out \['block_m', 'num_warps'\]"):
        dense.linear_w8a8(x, weights, wgmma=True, block_m=64, num_warps=4)
    with pytest.raises(ValueError, match="block_n must be 32, 64 or 128"):
        dense.linear_w8a8(x, weights, wgmma=True, block_n=256)
    with pytest.raises(ValueError, match="block_m must be 128 or 256"):
        gemm_w8a8_wgmma(*quantize_activations(x, 128, outer_major=True), weights,
                        torch.bfloat16, block_m=64)  # fmt: skip
    # ring_scales or staged_weight_scales where the wgmma kernel does not run (80 rows, or
    # wgmma=False) is refused, not ignored
    for wgmma, option in itertools.product((False, None), ("ring_scales", "staged_weight_scales")):
        with pytest.raises(ValueError, match=f"{option}=True is an option of the wgmma kernel, "
                           "which does not run here"):  # fmt: skip
            dense.linear_w8a8(x, weights, wgmma=wgmma, **{option: True})
    # the row scales' ring: TMA needs each K block's scales 16-byte aligned (M % 4 == 0 where
    # K has several blocks), and a slot's scales take shared memory
    x2, weights2 = make(78, 256, 256, torch.bfloat16, block=128, device=device)
    with pytest.raises(ValueError, match="a multiple of 4, got M=78, stride 78"):
        gemm_w8a8_wgmma(*quantize_activations(x2, 128, outer_major=True), weights2,
                        torch.bfloat16, ring_scales=True)  # fmt: skip
    quantised = quantize_activations(x, 128, outer_major=True)
    with pytest.raises(ValueError, match="and ring_scales needs 229 KB .* use num_stages <= 3"):
        gemm_w8a8_wgmma(*quantised, weights, torch.bfloat16, block_m=256, num_stages=4,
                        ring_scales=True)  # fmt: skip
    # 6 slots of 128 x 128 with the scales would fill 227 KB to the byte, with no room left
    # for the barriers
    with pytest.raises(ValueError, match="use num_stages <= 5"):
        gemm_w8a8_wgmma(*quantised, weights, torch.bfloat16, block_m=128, num_stages=6,
                        ring_scales=True)  # fmt: skip
    if device.type != "cuda":  # the default slots make room for the scales: past every check
        with pytest.raises(ValueError, match="needs an sm_90"):
            gemm_w8a8_wgmma(*quantised, weights, torch.bfloat16, block_m=256, ring_scales=True)


@pytest.mark.skipif(GPU_TESTS, reason="on the GPU the settings run: the plan times them")
def test_the_gemm_times_settings_clear_the_kernels_host_checks(monkeypatch):
    """scripts/dense_w8a8_gemm_times.py's settings (plans/w8a8-ring.toml times three of them on
    the GPU) are ones gemm_w8a8_wgmma takes: on the CPU each stops only at the missing sm_90
    GPU, past the shared-memory, stage and row-scale checks."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    import dense_w8a8_gemm_times as times

    x, weights = make(512, 256, 256, torch.bfloat16, block=128)
    quantised = quantize_activations(x, 128, outer_major=True)
    assert "m256s3r" in times.SETTINGS
    for options in times.SETTINGS.values():
        with pytest.raises(ValueError, match="needs an sm_90"):
            gemm_w8a8_wgmma(*quantised, weights, torch.bfloat16, **options)
    for options in times.WIDE_SETTINGS.values():
        with pytest.raises(ValueError, match="needs an sm_90"):
            times.gemm_w8a8_wide(*quantised, weights, torch.bfloat16, **options)


def test_the_row_scales_descriptor_reads_them_as_they_lie(device):
    """`scale_descriptor`: token-fastest scales (M, K blocks), strides (1, M), are the (K
    blocks, M) matrix TMA reads a K block's row of block_m scales from; with one K block the
    stride is rounded up to what TMA takes (no second row is read), so any M will do."""
    seeded = torch.Generator().manual_seed(0)
    x = torch.randn(300, 512, generator=seeded).to(device)
    values, scales = quantize_activations(x, 128, outer_major=True)
    desc = scale_descriptor(scales, 256)
    assert (list(desc.shape), list(desc.strides)) == ([4, 300], [300, 1])
    assert list(desc.block_shape) == [1, 256]
    assert desc.base.data_ptr() == scales.data_ptr()
    one_block = quantize_activations(torch.randn(78, 128, generator=seeded).to(device), 128,
                                     outer_major=True)[1]  # fmt: skip
    desc = scale_descriptor(one_block, 128)
    assert (list(desc.shape), list(desc.strides)) == ([1, 78], [80, 1])


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "n", "k", "options"),
    [
        (64, 1984, 5120, {}),  # qkv_a's N (a half-empty last tile), K split 8 ways
        (128, 5120, 1152, {}),  # K split 3 ways (9 steps of 128)
        (256, 3072, 1280, {"split_k": 1}),  # one program a tile, two token tiles
        (33, 2304, 640, {"split_k": 1, "block_t": 64}),  # an odd number of K steps (5)
        (48, 640, 768, {"split_k": 1}),  # an even number (6): the loop's tail step
        (100, 1024, 4096, {"split_k": 3}),  # uneven splits: 11, 11, 10 steps
        (300, 256, 384, {"block_t": 128, "num_stages": 4}),  # token tiles with a tail
        (40, 384, 192, {"split_k": 2}),  # one step a split; K past the last full TMA box
        (64, 256, 32768, {"split_k": 1}),  # the most K steps a split's staged scales hold (256)
    ],
)
def test_the_wgmma_w8a16_kernel_computes_w8a16(m, n, k, options, device):
    """The Gluon W8A16 kernel (weights through registers into bf16 wgmma) against the fp32
    product on the dequantised weights, as the Triton kernel is held to. GPU only (Gluon has
    no interpreter); tests/test_dense_wgmma_sass.py checks what it compiles to on the CPU."""
    if device.type != "cuda":
        pytest.skip("the Gluon kernel runs on a GPU only (WORKBENCH_GPU_TESTS=1)")
    x, weights = make(m, n, k, torch.bfloat16, block=128, seed=m, device=device)
    out = linear_w8a16_wgmma(x, weights, **options)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert relative_error(out, x.float() @ weights.dequantize().T) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 3])
def test_the_wgmma_w8a16_kernel_with_pdl_reads_what_the_grid_before_wrote(split_k, device):
    """With PDL a GEMM's programs start while the grid before runs and copy their weights;
    their activations are that grid's output. A chain of three GEMMs captured in a CUDA graph
    is replayed on new inputs, each time equal to the chain without PDL on the same input (a
    program that read its activations early would read the replay before's)."""
    if device.type != "cuda":
        pytest.skip("the Gluon kernel runs on a GPU only (WORKBENCH_GPU_TESTS=1)")
    x, first = make(128, 2048, 1024, torch.bfloat16, block=128, seed=1, device=device)
    chain = [first] + [make(128, n, k, torch.bfloat16, block=128, seed=s, device=device)[1]
                       for s, (n, k) in enumerate([(1024, 2048), (768, 1024)], 2)]  # fmt: skip

    def run(x: torch.Tensor, pdl: bool) -> torch.Tensor:
        for weights in chain:
            x = linear_w8a16_wgmma(x, weights, split_k=split_k, pdl=pdl)
        return x

    run(x, True)  # compiled, the weights' K-ordered copies made, before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = run(x, True)
    for seed in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        want = run(x, False)
        if split_k == 1:
            assert torch.equal(replayed, want)
        else:  # its splits of K add in the order they arrive
            assert relative_error(replayed, want) < 1e-3


def test_the_wgmma_w8a16_kernels_splits_leave_their_sums_at_zero(device):
    """The splits of K add into one buffer of fp32 sums per device, which the last split of
    each tile reads and zeroes: the next split GEMM on the stream starts from zeros."""
    if device.type != "cuda":
        pytest.skip("the Gluon kernel runs on a GPU only (WORKBENCH_GPU_TESTS=1)")
    from kernels.dense import tiles

    x, weights = make(100, 1024, 4096, torch.bfloat16, block=128, seed=5, device=device)
    first = linear_w8a16_wgmma(x, weights, split_k=3)
    assert not tiles._sums[x.device].any()
    # the same again, up to the order of the additions, which the GPU does not fix
    assert relative_error(linear_w8a16_wgmma(x, weights, split_k=3), first) < 1e-3


def test_the_wgmma_w8a16_kernel_runs_a_group_in_one_launch(device):
    if device.type != "cuda":
        pytest.skip("the Gluon kernel runs on a GPU only (WORKBENCH_GPU_TESTS=1)")
    ws = [master(256, 512, seed).to(device) for seed in range(4)]
    group = DenseWeights.quantize_group(ws, "fp8", 128)
    x = torch.randn(48, 4 * 512, device=device).to(torch.bfloat16)
    out = linear_w8a16_wgmma_group(x.view(48, 4, 512), group, split_k=2)
    want = torch.cat([x[:, g * 512 : (g + 1) * 512].float() @ w.dequantize().T
                      for g, w in enumerate(group)], 1)  # fmt: skip
    assert relative_error(out, want) < 1e-2


def test_the_wgmma_w8a16_kernel_refuses_what_it_cannot_take(device):
    x, weights = make(64, 256, 256, torch.bfloat16, block=128, device=device)
    if device.type != "cuda":
        with pytest.raises(ValueError, match="needs an sm_90 \\(Hopper\\) GPU, got cpu"):
            linear_w8a16_wgmma(x, weights)
    with pytest.raises(ValueError, match="takes 128 x 128 weight blocks, not 32"):
        linear_w8a16_wgmma(*make(64, 256, 256, torch.bfloat16, block=32, device=device))
    with pytest.raises(ValueError, match="takes bf16 activations"):
        linear_w8a16_wgmma(x.float(), weights)
    with pytest.raises(ValueError, match="K order .* needs K a multiple of 64"):
        linear_w8a16_wgmma(*make(64, 256, 208, torch.bfloat16, block=128, device=device))
    with pytest.raises(ValueError, match="scales in shared memory, K up to 32768"):
        linear_w8a16_wgmma(*make(64, 128, 32832, torch.bfloat16, block=128, device=device))
    with pytest.raises(ValueError, match="block_t must be one of"):
        linear_w8a16_wgmma(x, weights, block_t=32)
    with pytest.raises(ValueError, match="KB of shared memory.*use num_stages <= 4"):
        linear_w8a16_wgmma(x, weights, block_t=128, num_stages=9)
    with pytest.raises(ValueError, match="refill_lag must be at least 1"):
        linear_w8a16_wgmma(x, weights, refill_lag=0)
    with pytest.raises(ValueError, match="split_k=0 must be an integer >= 1"):
        linear_w8a16_wgmma(x, weights, split_k=0)
    with pytest.raises(ValueError, match="split_fill=0 must be above 0"):
        linear_w8a16_wgmma(x, weights, split_fill=0)
    with pytest.raises(ValueError, match="pdl='yes' must be True, False or None"):
        linear_w8a16_wgmma(x, weights, pdl="yes")


def test_wgmma_w8a16_splits_fill_at_most_one_round_of_sms():
    # o_b at 128 rows on 132 SMs: 40 tiles of 32 K steps
    assert split_count(40, 32, 132, fill=0.5) == 2  # half a program an SM: 80 programs
    assert split_count(40, 32, 132) == 3  # 120 programs; 4 would take two rounds
    assert split_count(40, 9, 132) == 1  # shared_down: 9 steps make one 8-step split
    assert split_count(40, 9, 132, min_steps=3) == 3
    assert split_count(200, 32, 132) == 1  # more tiles than SMs: no split
    for tiles in range(1, 300):
        assert split_count(tiles, 64, 132, min_steps=1) * tiles <= max(132, tiles)


@pytest.mark.parametrize(
    ("m", "row_tiles", "k_steps", "plan"),
    [
        (64, 40, 32, (64, 3)),  # up to 64 rows: one 64-token tile
        (128, 64, 16, (64, 1)),  # o_a: 128 programs either way, the narrower tile
        (128, 40, 32, (128, 3)),  # o_b: 120 programs at 128 tokens against 80 at 64
        (128, 192, 10, (128, 1)),  # q_up: two rounds at 128 tokens against three at 64
        (256, 16, 40, (64, 2)),  # qkv_a: 128 programs either way
        (256, 18, 40, (128, 3)),  # shared_gate_up: 108 programs against 72
    ],
)
def test_wgmma_w8a16_tile_plan_takes_the_fewest_rounds_then_the_most_programs(
    m, row_tiles, k_steps, plan
):
    assert tile_plan(m, row_tiles, k_steps, 132) == plan


def test_w8a16_takes_the_wgmma_kernel_where_it_can_and_was_faster(device):
    """From WGMMA_MIN_M rows, bf16 activations, 128-wide blocks, an sm_90 GPU and no Triton
    tile option: the Gluon kernel; anything else the Triton kernel, which takes all of them."""
    gpu = device.type == "cuda"
    x, weights = make(64, 256, 256, torch.bfloat16, block=128, device=device)
    dense.linear_w8a16(x, weights)
    assert list(dense.last_facts()) == ["w8a16_wgmma_kernel" if gpu else "w8a16_kernel"]
    for other in (x[:32], x.float()):  # too few rows; fp32 activations
        dense.linear_w8a16(other, weights)
        assert list(dense.last_facts()) == ["w8a16_kernel"]
    dense.linear_w8a16(x, weights, block_m=32)  # a Triton option
    assert list(dense.last_facts()) == ["w8a16_kernel"]
    dense.linear_w8a16(x, weights, wgmma=False)
    assert list(dense.last_facts()) == ["w8a16_kernel"]
    with pytest.raises(ValueError, match="takes none of the Triton kernel's options"):
        dense.linear_w8a16(x, weights, wgmma=True, block_m=32)
    if not gpu:
        with pytest.raises(ValueError, match="needs an sm_90"):
            dense.linear_w8a16(x, weights, wgmma=True)


def test_the_tma_kernels_options_are_refused_elsewhere(device):
    x, weights = make(80, 256, 128, torch.bfloat16, block=128, device=device)
    with pytest.raises(ValueError, match="options of the TMA kernel"):
        dense.linear_w8a8(x, weights, tma=False, paired_k=True)
    with pytest.raises(ValueError, match="paired_k takes tiles up to 128 wide"):
        dense.linear_w8a8(x, weights, tma=True, paired_k=True, block_n=256)


def test_the_tma_kernel_takes_only_128_blocks_and_is_picked_for_them(monkeypatch, device):
    x, weights = make(80, 64, 128, torch.bfloat16, block=32, device=device)
    with pytest.raises(ValueError, match="takes 128-wide blocks, got 32"):
        dense.linear_w8a8(x, weights, tma=True)
    monkeypatch.setattr(w8a8, "TMA_MIN_M", 80)
    dense.linear_w8a8(*make(80, 64, 128, torch.bfloat16, block=128, device=device))
    # on a GPU the Gluon kernel takes the TMA kernel's place; Gluon has no interpreter
    prefill_kernel = "w8a8_wgmma_kernel" if device.type == "cuda" else "w8a8_tma_kernel"
    assert list(dense.last_facts()) == ["quantize_rows_kernel", prefill_kernel]
    dense.linear_w8a8(*make(80, 64, 128, torch.bfloat16, block=128, device=device), tma=True)
    assert list(dense.last_facts()) == ["quantize_rows_kernel", "w8a8_tma_kernel"]
    # tiles the Gluon kernel cannot take (it fixes 128 rows on 8 warps) keep the TMA kernel
    x, weights = make(80, 64, 128, torch.bfloat16, block=128, device=device)
    dense.linear_w8a8(x, weights, block_m=64, num_warps=4)
    assert list(dense.last_facts()) == ["quantize_rows_kernel", "w8a8_tma_kernel"]
    dense.linear_w8a8(*make(79, 64, 128, torch.bfloat16, block=128, device=device))
    assert list(dense.last_facts()) == ["quantize_rows_kernel", "w8a8_kernel"]
    # rows TMA cannot address (N=82: 164-byte output rows, as the tiny preset's) take the
    # split-K kernel at prefill sizes too, unless the TMA kernel is asked for by name
    x, weights = make(80, 82, 128, torch.bfloat16, block=128, device=device)
    out = dense.linear_w8a8(x, weights)
    assert list(dense.last_facts()) == ["quantize_rows_kernel", "w8a8_kernel"]
    assert relative_error(out, dense.w8a8_reference(x, weights)) < 1e-2
    with pytest.raises(ValueError, match="TMA needs K % 16 == 0 and N % 8 == 0"):
        dense.linear_w8a8(x, weights, tma=True)


def test_the_wgmma_kernel_takes_two_waves_where_one_wave_tiles_overflow_the_sms():
    """256-row tiles where 128-row tiles would take the SMs more than one round (the H200
    measurements behind it are in `default_block_m`'s docstring), else 128."""
    from kernels.dense.w8a8_wgmma import default_block_m

    assert default_block_m(4096, 5120, 128, sms=132) == 256  # o_b: 1,280 one-wave tiles
    assert default_block_m(4096, 1024, 128, sms=132) == 256  # o_a: 256 one-wave tiles
    assert default_block_m(2048, 1024, 128, sms=132) == 128  # 128 one-wave tiles fit
    assert default_block_m(512, 1984, 128, sms=132) == 128  # qkv_a at 512 rows: 64


def test_the_wide_tiles_go_where_they_fill_the_last_round_better():
    """`prefers_wide`, by rounds of tiles times a tile's area: of the dsv4-flash-tp2 layer's
    GEMMs at 4,096 rows only shared_gate_up (288 two-wave tiles, its third round 18% full)
    takes 128 x 192 tiles; q_up's rounds tie, and at 16,384 rows every GEMM fills its rounds
    with the kernel's own tiles."""
    from kernels.dense.w8a8_wide import prefers_wide
    from workbench.presets import get_preset
    from workbench.workloads.dense import layer_projections

    projections = layer_projections(get_preset("dsv4-flash-tp2").rank_shapes())
    wide = {m: [p.name for p in projections if prefers_wide(m, p.n, sms=132)]
            for m in (4096, 16384)}  # fmt: skip
    assert wide == {4096: ["shared_gate_up"], 16384: []}


def test_linear_w8a8_turns_the_gluon_kernels_options_on_where_they_can_go(monkeypatch, device):
    """The defaults (ring_scales, wide_tiles and staged_weight_scales None), as the Gluon
    kernels would be called on an sm_90 GPU (the launches replaced by a record of their
    arguments): the wide tiles where `prefers_wide` picks them, the row scales in the ring
    where TMA can copy them and the ring's slots are the kernel's to choose, the weight scales
    staged wherever the kernel's own tiles run; the ring and the wide tiles not where block_m
    or num_stages is set (the wide tiles set the one, and a 4-slot two-wave ring has no room
    for the scales), and none of them where the Gluon kernel does not run."""
    calls = []
    monkeypatch.setattr(w8a8, "supported", lambda device: True)
    monkeypatch.setattr(w8a8, "planned_sms", lambda device: 132)
    monkeypatch.setattr(w8a8, "gemm_w8a8_wgmma",
                        lambda *args, **options: calls.append(("own", options)))  # fmt: skip
    monkeypatch.setattr(w8a8, "gemm_w8a8_wide",
                        lambda *args, **options: calls.append(("wide", options)))  # fmt: skip
    monkeypatch.setattr(w8a8, "prefers_wide", lambda m, n, sms: n == 384)

    def called(m: int, n: int, k: int, **options: object) -> tuple[str, object, object]:
        dense.linear_w8a8(*make(m, n, k, torch.bfloat16, block=128, device=device), **options)
        kernel, kwargs = calls.pop()
        return kernel, kwargs.get("ring_scales"), kwargs.get("staged_weight_scales")

    assert called(300, 384, 256) == ("wide", None, None)
    assert called(300, 256, 256) == ("own", True, True)
    assert called(302, 256, 256) == ("own", False, True)  # 302 rows: TMA cannot copy their scales
    assert called(302, 256, 128) == ("own", True, True)  # one K block: no second row to align
    assert called(300, 256, 256, num_stages=4) == ("own", False, True)
    assert called(300, 384, 256, block_m=256) == ("own", True, True)  # block_m: its own tiles
    assert called(300, 384, 256, ring_scales=False, wide_tiles=False,
                  staged_weight_scales=False) == ("own", False, False)  # fmt: skip
    dense.linear_w8a8(*make(300, 384, 256, torch.bfloat16, block=128, device=device), wgmma=False)
    assert not calls  # the TMA kernel ran, taking none of them


def test_the_wide_tiles_are_refused_where_they_cannot_run(device):
    """`wide_tiles` where the Gluon kernel does not run, or beside the options it sets or
    lacks, is refused with the reason; the wide kernel's ring fits 4 slots of 40 KB."""
    from kernels.dense.w8a8_wide import gemm_w8a8_wide

    x, weights = make(80, 256, 128, torch.bfloat16, block=128, device=device)
    for wgmma in (False, None):  # 80 rows: below the Gluon kernel's
        with pytest.raises(ValueError, match="wide_tiles=True is an option of the wgmma kernel, "
                           "which does not run here"):  # fmt: skip
            dense.linear_w8a8(x, weights, wgmma=wgmma, wide_tiles=True)
    for options in ({"block_n": 64}, {"block_m": 256}):
        with pytest.raises(ValueError, match="wide_tiles=True picks the tiles"):
            dense.linear_w8a8(x, weights, wgmma=True, wide_tiles=True, **options)
    quantised = quantize_activations(x, 128, outer_major=True)
    with pytest.raises(ValueError, match=r"128 x 192 tiles needs 249 KB .* num_stages <= 4"):
        gemm_w8a8_wide(*quantised, weights, torch.bfloat16, num_stages=5)
    with pytest.raises(ValueError, match="num_stages must be at least 2"):
        gemm_w8a8_wide(*quantised, weights, torch.bfloat16, num_stages=1)
    with pytest.raises(ValueError, match="takes 128-wide blocks, got 32"):
        gemm_w8a8_wide(*quantised, make(80, 256, 128, block=32)[1], torch.bfloat16)
    if device.type != "cuda":
        with pytest.raises(ValueError, match="needs an sm_90 \\(Hopper\\) GPU, got cpu"):
            gemm_w8a8_wide(*quantised, weights, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "n", "k", "num_stages", "dtype"),
    [
        (300, 2304, 512, 4, torch.bfloat16),  # M tail; 12 tiles, even and odd
        (1000, 1984, 1040, 3, torch.bfloat16),  # K tail; last tile even: whole partial, half out
        (4096, 5120, 1024, 4, torch.bfloat16),  # several tiles a program; last half past N
        (7, 384, 256, 4, torch.bfloat16),  # fewer rows than a warpgroup
        (8192, 2304, 128, 4, torch.bfloat16),  # one K step a tile: the cursor crosses tiles
        (4096, 2304, 5120, 4, torch.bfloat16),  # shared_gate_up at 4,096 rows
        # an odd last tile: its half block partial and its whole block past N (200), its half
        # whole and its whole block past N (2176), its whole block partial (2240)
        (300, 200, 256, 4, torch.bfloat16),
        (300, 2176, 384, 4, torch.bfloat16),
        (300, 2240, 384, 2, torch.bfloat16),
        (520, 2304, 640, 3, torch.float32),  # fp32 out: 96 KB of staging, 3 slots fit
    ],
)
def test_the_wide_tiles_compute_w8a8(m, n, k, num_stages, dtype, device):
    """The 128 x 192 tile kernel against the exact W8A8 product, every weight block with its
    own scale, and against the kernel's own tiles on the same quantised operands (the same FP8
    products, rescaled and summed in the same order)."""
    from kernels.dense.w8a8_wide import gemm_w8a8_wide

    if device.type != "cuda":
        pytest.skip("the Gluon kernel runs on a GPU only (WORKBENCH_GPU_TESTS=1)")
    x, weights = make(m, n, k, dtype, block=128, seed=m, device=device)
    weights = with_distinct_block_scales(weights)
    quantised = quantize_activations(x, 128, outer_major=True)
    out = gemm_w8a8_wide(*quantised, weights, dtype, num_stages=num_stages)
    assert out.shape == (m, n) and out.dtype == dtype
    assert relative_error(out, dense.w8a8_reference(x, weights)) < 1e-2
    own = gemm_w8a8_wgmma(*quantised, weights, dtype)
    assert relative_error(out, own) < 1e-3


@pytest.mark.gpu
def test_linear_w8a8_takes_the_wide_tiles_where_asked_and_preferred(device):
    """`wide_tiles=True` at shared_gate_up's shape and 4,096 rows runs the wide kernel (its
    launch recorded), and where the kernel's own tiles fill the rounds (o_b's shape) not;
    with ring_scales too, which the GEMMs left on the kernel's own tiles take. Left unset (the
    default) both are on where they can be: at 4,094 rows, whose row scales TMA cannot copy,
    the ring goes without them instead of refusing."""
    if device.type != "cuda":
        pytest.skip("the Gluon kernel runs on a GPU only (WORKBENCH_GPU_TESTS=1)")
    for m, wide_tiles, ring_scales in ((4096, True, False), (4096, True, True),
                                       (4096, None, None), (4094, None, None)):  # fmt: skip
        for n, k, kernel in ((2304, 5120, "w8a8_wide_kernel"), (5120, 1024, "w8a8_wgmma_kernel")):
            x, weights = make(m, n, k, torch.bfloat16, block=128, device=device)
            out = dense.linear_w8a8(x, weights, wide_tiles=wide_tiles, ring_scales=ring_scales)
            assert kernel in list(dense.last_facts())
            assert relative_error(out, dense.w8a8_reference(x, weights)) < 1e-2


def test_the_wgmma_kernels_ring_must_load_ahead(device):
    x, weights = make(300, 256, 256, torch.bfloat16, block=128, device=device)
    values, scales = quantize_activations(x, 128, outer_major=True)
    with pytest.raises(ValueError, match="num_stages must be at least 2"):
        gemm_w8a8_wgmma(values, scales, weights, torch.bfloat16, num_stages=1)
    # beside the load warp, setmaxnreg can give each consumer warpgroup 232 registers at most
    with pytest.raises(ValueError, match="consumer_regs must be a multiple of 8 from 24 to 232"):
        gemm_w8a8_wgmma(values, scales, weights, torch.bfloat16, consumer_regs=240)
    with pytest.raises(ValueError, match=r"needs 273 KB of shared memory.*num_stages <= 4"):
        gemm_w8a8_wgmma(values, scales, weights, torch.bfloat16, block_m=256, num_stages=5)
