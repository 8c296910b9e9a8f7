"""W8A8 dense GEMM for prefill sizes: persistent programs, TMA loads, DeepSeek's 128-wide blocks.

The split-K kernel in `w8a8.py` serves decode sizes, where streaming the weight is the work.
At prefill sizes the FP8 tensor cores are the limit, and what keeps them busy is that operand
tiles arrive by TMA (one descriptor copy per tile into shared memory, no address arithmetic in
the warps) while the previous tile's MMA runs, and that programs stay resident across tiles
(one per SM, walking the output tiles in grouped order) so the pipeline never drains between
tiles. Activation scales are read token-fastest (the quantiser's `outer_major` layout), one
contiguous vector per K block.

The block scales are applied as DeepGEMM applies them ("promote and rescale"): each 128-wide K
step's FP8 product leaves the MMA in fp32, is multiplied by its row scales and column scales,
and is added to the accumulator. A tile no wider than a weight block (BLOCK_N <= 128; tiles
start at multiples of their width) has one weight scale per K step, so the rescale is one
multiply-add per accumulator element, not an outer product of scales and two more. With
`warp_specialize`, Triton is asked to split the loop into a producer (TMA) and consumers (MMA
and rescale), so that one consumer group's rescale overlaps another's MMA.

Why this kernel trails DeepGEMM (1.01-1.15x cuBLAS bf16 against 1.45-1.64x on the H200,
raw/bench-dense-*T043838): in its PTX (Triton 3.6, sm_90, 128 x 128 tiles on 8 warps, 3
stages) every K step's wgmma group is
committed and then waited for with `wgmma.wait_group 0` before the rescale, also in the
paired form (two groups, each waited for at 0), so inside a warpgroup the CUDA-core rescale
never overlaps an MMA; and the PTX with `warp_specialize` is byte for byte the PTX without,
so that option does nothing on this Triton for sm_90. DeepGEMM also waits before promoting,
but its two math warpgroups run out of step, so one promotes while the other multiplies. On
sm_90 GPUs `w8a8_wgmma` (Gluon, built that way) takes this kernel's place; this one serves the
interpreter, other GPUs and the options only it has.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels.compiled import launch
from kernels.dense.formats import DenseWeights
from kernels.moe.routing import planned_sms

BLOCK = 128  # the only weight block this kernel takes: one scale per K step


@triton.jit
def _scaled_step(
    a_desc, w_desc, sa_ptr, sw_ptr, off_m, off_n, rows, step, k_steps, M, stride_sak,
    stride_swn, stride_swk, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """(the FP8 product of one K step, unscaled; its row scales times the tile's weight scale).

    A step past K (the pair's second of an odd count) reads zeros through TMA and zero scales.
    """
    off_k = step * BLOCK_K
    product = tl.dot(a_desc.load([off_m, off_k]), w_desc.load([off_n, off_k]).T)
    inside = step < k_steps
    sa = tl.load(sa_ptr + step * stride_sak + rows, mask=(rows < M) & inside, other=0.0)
    sw = tl.load(sw_ptr + (off_n // BLOCK_K) * stride_swn + step * stride_swk, mask=inside,
                 other=0.0)  # fmt: skip
    return product, sa * sw


@triton.jit
def _w8a8_tma_kernel(
    a_desc, w_desc, y_desc, sa_ptr, sw_ptr, M, N, K, stride_sak, stride_swn, stride_swk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, PAIRED: tl.constexpr,
):  # fmt: skip
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    per_group = GROUP * tiles_n
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True,
                         warp_specialize=WARP_SPECIALIZE):  # fmt: skip
        first_m = (tile // per_group) * GROUP
        rows_in_group = tl.minimum(tiles_m - first_m, GROUP)
        pid_m = first_m + (tile % per_group) % rows_in_group
        pid_n = (tile % per_group) // rows_in_group
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if PAIRED:  # two K steps an iteration: one product is rescaled while the next is made
            for step in range(0, k_steps, 2):
                first = _scaled_step(a_desc, w_desc, sa_ptr, sw_ptr, off_m, off_n, rows, step,
                                     k_steps, M, stride_sak, stride_swn, stride_swk,
                                     BLOCK_K)  # fmt: skip
                second = _scaled_step(a_desc, w_desc, sa_ptr, sw_ptr, off_m, off_n, rows,
                                      step + 1, k_steps, M, stride_sak, stride_swn, stride_swk,
                                      BLOCK_K)  # fmt: skip
                acc += first[0] * first[1][:, None]
                acc += second[0] * second[1][:, None]
        else:
            for step in range(k_steps):
                off_k = step * BLOCK_K
                a = a_desc.load([off_m, off_k])
                w = w_desc.load([off_n, off_k])
                sa = tl.load(sa_ptr + step * stride_sak + rows, mask=rows < M, other=0.0)
                if BLOCK_N <= BLOCK_K:  # the tile lies in one weight block: one scale for it
                    sw = tl.load(sw_ptr + (off_n // BLOCK_K) * stride_swn + step * stride_swk)
                    acc += tl.dot(a, w.T) * (sa * sw)[:, None]
                else:
                    sw = tl.load(sw_ptr + (cols // BLOCK_K) * stride_swn + step * stride_swk,
                                 mask=cols < N, other=0.0)  # fmt: skip
                    acc += tl.dot(a, w.T) * (sa[:, None] * sw[None, :])
        y_desc.store([off_m, off_n], acc.to(y_desc.dtype))


def check_tma_inputs(kernel: str, scales: Tensor, weights: DenseWeights) -> None:
    """What both prefill W8A8 kernels (this one and the Gluon `w8a8_wgmma`) need: 128-wide
    weight blocks (one scale a K step), rows TMA can address, token-fastest activation scales."""
    if weights.block != BLOCK:
        raise ValueError(
            f"the {kernel} W8A8 kernel takes {BLOCK}-wide blocks, got {weights.block}; quantise "
            f"with DenseWeights.quantize(w, 'fp8', {BLOCK}) or use the split-K kernel."
        )
    k, n = weights.in_features, weights.out_features
    if k % 16 or n % 8:
        raise ValueError(f"TMA needs K % 16 == 0 and N % 8 == 0 (16-byte rows), got K={k}, N={n}.")
    if scales.stride(0) != 1:
        raise ValueError("activation scales must be token-fastest: quantise with outer_major.")


def gemm_w8a8_tma(
    values: Tensor,
    scales: Tensor,
    weights: DenseWeights,
    out_dtype: torch.dtype,
    block_m: int = 128,
    block_n: int = 128,
    num_warps: int = 8,
    num_stages: int = 4,
    group_m: int = 8,
    warp_specialize: bool = False,
    paired_k: bool = False,
) -> Tensor:
    """y = (values * scales) @ W.T for quantised activations (M, K) with token-fastest scales
    (the quantiser's `outer_major` layout) and FP8 `weights` in 128x128 blocks.

    `paired_k` takes two K steps an iteration (tiles up to 128 wide), so the compiler may
    rescale one step's product while the tensor cores make the next."""
    check_tma_inputs("TMA", scales, weights)
    (m, k), n = values.shape, weights.out_features
    if paired_k and block_n > BLOCK:
        raise ValueError(f"paired_k takes tiles up to {BLOCK} wide (one weight scale), got "
                         f"block_n={block_n}.")  # fmt: skip
    y = torch.empty(m, n, dtype=out_dtype, device=values.device)
    a_desc = TensorDescriptor.from_tensor(values, [block_m, BLOCK])
    w_desc = TensorDescriptor.from_tensor(weights.values, [block_n, BLOCK])
    y_desc = TensorDescriptor.from_tensor(y, [block_m, block_n])
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    programs = min(tiles, planned_sms(values.device))
    launch(
        _w8a8_tma_kernel, (programs,), a_desc, w_desc, y_desc, scales, weights.scales, m, n, k,
        scales.stride(1), *weights.scales.stride(), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=BLOCK, GROUP=group_m, PROGRAMS=programs, WARP_SPECIALIZE=warp_specialize,
        PAIRED=paired_k,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return y
