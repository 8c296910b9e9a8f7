"""Dense weight formats: bf16 as served, and FP8 E4M3 with power-of-two block scales.

The FP8 layout is part of the kernel contract: values are torch.float8_e4m3fn in nn.Linear's
(N, K) orientation, K being the reduction dim, and there is one fp32 scale per ``block`` x
``block`` tile, shaped (cdiv(N, block), cdiv(K, block)) (32 x 32 by default).

Why powers of two (the seed's MXFP8 model, whose E8M0 scales are exponents only): a value times
its scale is then exact in bf16 as in fp32, so the W8A16 kernel dequantises in the activation
dtype without rounding, and `dequantize()` gives exactly the numbers every kernel multiplies by:
a test compares a kernel against an fp32 GEMM on them and sees kernel error only. The cost is
up to one bit of range: a block's largest value lands in [224, 448] instead of at 448.

`pow2_scales` is shared with the activation quantiser of the W8A8 path, whose Triton kernel
computes the same exponent from the float's bits.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.dequant import check_fp8_scales

FORMATS = ("bf16", "fp8")
DEFAULT_BLOCK = 128  # DeepSeek's checkpoints: one fp32 scale per 128x128 weight block
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
ACTIVATION_DTYPES = (torch.bfloat16, torch.float32)  # fp16 ranges cannot hold every scale


def check_block(block: int) -> None:
    """A block is a power of two >= 32: one scale then covers whole kernel K sub-tiles, and an
    FP8 tensor-core MMA reduces over 32 elements at a time."""
    if not isinstance(block, int) or block < 32 or block & (block - 1):
        raise ValueError(f"block={block!r} must be a power of two >= 32, e.g. 32 or 128.")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown dense weight format {fmt!r}; use one of {', '.join(FORMATS)}.")


def pow2_scales(absmax: Tensor) -> Tensor:
    """The smallest power of two s with absmax / s <= 448, as fp32; 1 where absmax is 0.

    With absmax = m * 2**e (m in [0.5, 1)), absmax <= 448 * 2**x = 0.875 * 2**(x + 9) holds
    from x = e - 9, or x = e - 8 when m > 0.875. The exponent is clamped to fp32's normal range.
    """
    mantissa, exponent = torch.frexp(absmax.float())
    power = (exponent - 9 + (mantissa > 0.875).int()).clamp(-126, 127)
    scales = torch.ldexp(torch.ones_like(absmax, dtype=torch.float32), power)
    return torch.where(absmax > 0, scales, torch.ones_like(scales))


def quantize_fp8(w: Tensor, block: int = DEFAULT_BLOCK) -> tuple[Tensor, Tensor]:
    """(values float8_e4m3fn (N, K), scales fp32 (cdiv(N, block), cdiv(K, block))) of w."""
    check_block(block)
    n, k = w.shape
    padded = F.pad(w.float(), (0, -k % block, 0, -n % block))
    tiles = padded.unflatten(0, (-1, block)).unflatten(-1, (-1, block))  # (NB, b, KB, b)
    scales = pow2_scales(tiles.abs().amax(dim=(1, 3)))
    check_fp8_scales(scales)
    values = (tiles / scales[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    values = values.flatten(2).flatten(0, 1)[:n, :k]
    return values.to(torch.float8_e4m3fn).contiguous(), scales.contiguous()


def dequantize_fp8(values: Tensor, scales: Tensor, block: int = DEFAULT_BLOCK) -> Tensor:
    """fp32 weights: each value times the scale of its block (exact for power-of-two scales)."""
    n, k = values.shape
    full = scales.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)
    return values.float() * full[:n, :k]


@dataclass(frozen=True)
class DenseWeights:
    """One projection's weight (N, K) in a format; build FP8 ones with `DenseWeights.quantize`.

    ``scales`` is None for bf16. The constructor checks that the values and scales agree, so a
    kernel never reads a scale that is not there.
    """

    fmt: str
    values: Tensor
    scales: Tensor | None = None
    block: int = DEFAULT_BLOCK

    def __post_init__(self) -> None:
        check_format(self.fmt)
        check_block(self.block)
        if self.values.dim() != 2 or 0 in self.values.shape:
            raise ValueError(
                f"dense weights must be a non-empty (N, K) matrix, got shape "
                f"{tuple(self.values.shape)}; pass one projection's weight as nn.Linear stores it."
            )
        if self.fmt == "bf16":
            if self.scales is not None:
                raise ValueError("bf16 weights take no scales; pass fmt='fp8' with scales.")
            if self.values.dtype not in ACTIVATION_DTYPES:
                raise ValueError(
                    f"bf16-format weights must be bf16 or fp32, got {self.values.dtype}."
                )
            return
        if self.values.dtype != torch.float8_e4m3fn:
            raise ValueError(
                f"fp8 weights must be torch.float8_e4m3fn, got {self.values.dtype}; build them "
                "with DenseWeights.quantize(w, 'fp8')."
            )
        n, k = self.values.shape
        want = (-(-n // self.block), -(-k // self.block))
        if self.scales is None or tuple(self.scales.shape) != want:
            got = None if self.scales is None else tuple(self.scales.shape)
            raise ValueError(
                f"fp8 weight of shape ({n}, {k}) with block={self.block} needs scales of shape "
                f"{want}, got {got}; quantise with DenseWeights.quantize(w, 'fp8', "
                f"block={self.block}) or pass the block the scales were made with."
            )
        if self.scales.dtype != torch.float32 or self.scales.device != self.values.device:
            raise ValueError(
                f"fp8 scales must be float32 on {self.values.device}, got {self.scales.dtype} on "
                f"{self.scales.device}."
            )

    @classmethod
    def quantize(cls, w: Tensor, fmt: str = "fp8", block: int = DEFAULT_BLOCK) -> "DenseWeights":
        """Weights in `fmt` from an unquantised (N, K) float tensor (bf16 keeps it as it is)."""
        check_format(fmt)
        if not isinstance(w, Tensor):
            raise ValueError(f"quantize expects a weight tensor (N, K), got {type(w).__name__}.")
        if w.dtype not in ACTIVATION_DTYPES or w.dim() != 2:
            raise ValueError(
                f"quantize expects a 2-D bf16 or fp32 weight (N, K), got {w.dtype} of shape "
                f"{tuple(w.shape)}; unsupported dtypes (fp16, fp8, integers) are not converted."
            )
        if fmt == "bf16":
            return cls("bf16", w, block=block)
        if 0 in w.shape:
            raise ValueError(f"cannot quantise an empty weight of shape {tuple(w.shape)}.")
        return cls("fp8", *quantize_fp8(w, block), block=block)

    @classmethod
    def quantize_group(
        cls, ws: Sequence[Tensor], fmt: str = "fp8", block: int = DEFAULT_BLOCK
    ) -> list["DenseWeights"]:
        """The weights of a group of projections of one shape (kernels.dense.grouped), each
        quantised as `quantize` does, stored at one stride in one tensor so a kernel can
        reach member g from the first (`stacked_stride`)."""
        members = [cls.quantize(w, fmt, block) for w in ws]
        if len({tuple(w.values.shape) for w in members}) != 1:
            raise ValueError(
                f"a group's weights must share one shape, got "
                f"{[tuple(w.values.shape) for w in members]}; pass them as separate projections."
            )
        values = torch.stack([w.values for w in members]).unbind()
        if fmt == "bf16":
            return [cls("bf16", v, block=block) for v in values]
        scales = torch.stack([w.scales for w in members]).unbind()
        return [cls(fmt, v, s, block) for v, s in zip(values, scales, strict=True)]

    @property
    def out_features(self) -> int:
        return self.values.shape[0]

    @property
    def in_features(self) -> int:
        return self.values.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes a GEMM must read for this weight: the values and their scales."""
        scales = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.values.numel() * self.values.element_size() + scales

    def dequantize(self) -> Tensor:
        """The weight as the kernels see it: as stored for bf16, exact fp32 for fp8."""
        if self.fmt == "bf16":
            return self.values
        return dequantize_fp8(self.values, self.scales, self.block)


def check_linear_inputs(x: Tensor, weights: DenseWeights, fmt: str) -> None:
    """Check y = x @ W.T can run: x (M, K) in an activation dtype, M >= 1, W in `fmt`.

    A mismatch would otherwise read out of bounds inside a kernel, so each message names the
    problem and what to pass instead.
    """
    if not isinstance(weights, DenseWeights) or weights.fmt != fmt:
        got = weights.fmt if isinstance(weights, DenseWeights) else type(weights).__name__
        raise ValueError(
            f"this dense variant needs {fmt} DenseWeights, got {got}; build them once with "
            f"DenseWeights.quantize(w, '{fmt}')."
        )
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"x must be bf16 or fp32, got {x.dtype}; cast the activations.")
    if x.dim() != 2:
        raise ValueError(f"x must be (M, K), got shape {tuple(x.shape)}; flatten the batch dims.")
    if x.shape[0] == 0:
        raise ValueError("x has no rows (M == 0); skip the projection for an empty batch.")
    if x.shape[1] != weights.in_features:
        raise ValueError(
            f"x has K={x.shape[1]} columns but the weight is {tuple(weights.values.shape)} "
            f"(N, K={weights.in_features}); check the weight is not transposed."
        )
    if x.device != weights.values.device:
        raise ValueError(
            f"x is on {x.device} and the weight on {weights.values.device}; move them together."
        )


def stacked_stride(tensors: Sequence[Tensor]) -> int | None:
    """Elements from each tensor to the next when they lie at one stride in one storage with
    one shape, strides and dtype (as `torch.stack(...).unbind()` leaves them); else None."""
    first = tensors[0]
    if any(
        t.shape != first.shape or t.stride() != first.stride() or t.dtype != first.dtype
        or t.device != first.device or t.untyped_storage().data_ptr()
        != first.untyped_storage().data_ptr()
        for t in tensors
    ):  # fmt: skip
        return None
    offsets = [t.storage_offset() for t in tensors]
    step = offsets[1] - offsets[0] if len(tensors) > 1 else 0
    if any(b - a != step for a, b in zip(offsets, offsets[1:])):
        return None
    return step


def check_group_inputs(x: Tensor, group: Sequence[DenseWeights], fmt: str) -> tuple[int, int]:
    """Check cat_g(x[:, g] @ W_g.T) can run as one launch; return the (values, scales) strides
    from one member to the next. x is (M, G, K) and the G weights share a shape, a block and
    one stride (`DenseWeights.quantize_group` builds them so)."""
    if len(group) == 0:
        raise ValueError("a group needs at least one weight.")
    if x.dim() != 3 or x.shape[1] != len(group):
        raise ValueError(
            f"x must be (M, G, K) with G = {len(group)} weights, got shape {tuple(x.shape)}; "
            "view the activations as (M, G, K)."
        )
    check_linear_inputs(x[:, 0], group[0], fmt)
    values = stacked_stride([w.values for w in group])
    scales = 0 if fmt == "bf16" else stacked_stride([w.scales for w in group])
    if values is None or scales is None or len({w.block for w in group}) != 1:
        raise ValueError(
            "a group's weights must share one shape and block and lie at one stride in one "
            "tensor; build them with DenseWeights.quantize_group."
        )
    return values, scales
