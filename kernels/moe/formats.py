"""Expert weight formats: plain, FP8 E4M3 with block scales, and packed INT4 with group scales.

The Triton schedulers read these layouts directly and dequantise inside the kernel (W8A16 and
W4A16: activations stay in x's dtype, accumulation is fp32), so the layouts are part of the
kernel contract. Every format keeps the (E, N, K) orientation of nn.Linear weights, K being
the reduction dim: gate_up is (E, 2I, H) with gate rows above up rows and down is (E, H, I).

- ``bf16``: unquantised tensors in x's dtype (the name is the serving dtype; fp32 also works).
- ``fp8``: torch.float8_e4m3fn values and one fp32 scale per ``block`` x ``block`` tile of
  (N, K), scales shaped (E, cdiv(N, block), cdiv(K, block)), as DeepSeek-style checkpoints ship.
- ``int4``: symmetric 4-bit values q in [-7, 7] stored as the code q + 8, two per uint8 byte
  along K in runs of ``INT4_RUN`` (16) values: byte i of a run's 8 holds value i in its low
  nibble and value i + 8 in its high one, so (E, N, 8 * cdiv(K, 16)); one bf16 scale per
  ``block`` consecutive k of one row, scales shaped (E, N, cdiv(K, block)). The runs let a
  kernel multiply the low nibbles of a K tile by one set of activation columns and the high
  nibbles by another, so the unpacked values never have to be interleaved in registers (which
  cost Triton a layout conversion through shared memory and the weight loads' pipelining).

dequantize() gives the exact values the kernels multiply by (INT4 prefill tiles round each to
bf16 first, within half a bf16 step), so tests can compare a kernel against moe_reference on
dequantised weights and see kernel error only, not quantisation error.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.dequant import check_fp8_scales

FORMATS = ("bf16", "fp8", "int4")
DEFAULT_BLOCK = 128
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
INT4_MAX = 7  # symmetric: -8 is never produced, so the grid is the same on both sides of zero
INT4_RUN = 16  # values per packed run along K: byte i of a run holds values i and i + 8


def check_block(block: int, what: str = "block") -> None:
    """Quantisation blocks tile K in whole kernel K-tiles, so they must be powers of two."""
    if not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"{what}={block!r} must be a power of two >= 16, e.g. 128.")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown weight format {fmt!r}; use one of {', '.join(FORMATS)}.")


def _pad_to(w: Tensor, rows: int, cols: int) -> Tensor:
    """Zero-pad the last two dims of w up to multiples of rows and cols."""
    return F.pad(w, (0, -w.shape[-1] % cols, 0, -w.shape[-2] % rows))


def quantize_fp8(w: Tensor, block: int = DEFAULT_BLOCK) -> tuple[Tensor, Tensor]:
    """(values float8_e4m3fn like w, scales fp32 (..., cdiv(N, block), cdiv(K, block))).

    Each block's scale maps its absolute maximum onto the largest E4M3 value (448); all-zero
    blocks get scale 1 so dequantisation never divides by zero.
    """
    check_block(block)
    *lead, n, k = w.shape
    tiles = _pad_to(w.float(), block, block).unflatten(-2, (-1, block)).unflatten(-1, (-1, block))
    absmax = tiles.abs().amax(dim=(-3, -1))  # (..., N/block, K/block)
    scales = torch.where(absmax > 0, absmax / FP8_MAX, torch.ones_like(absmax))
    check_fp8_scales(scales)
    values = (tiles / scales[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    values = values.flatten(-2).flatten(-3, -2)[..., :n, :k]
    return values.to(torch.float8_e4m3fn).contiguous(), scales.contiguous()


def dequantize_fp8(values: Tensor, scales: Tensor, block: int = DEFAULT_BLOCK) -> Tensor:
    """fp32 weights values * scale of their block: what the fp8 kernels multiply by."""
    n, k = values.shape[-2:]
    full = scales.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return values.float() * full[..., :n, :k]


def int4_codes(w: Tensor, group: int = DEFAULT_BLOCK) -> tuple[Tensor, Tensor]:
    """(codes uint8 (..., N, K rounded up to INT4_RUN), scales bf16 (..., N, cdiv(K, group))).

    Symmetric round-to-nearest with scale = absmax / 7 per group, rounded to bf16 before the
    values are computed, so the stored scale is the one the values were divided by. A code is
    q + 8; the padding past K holds q = 0 (code 8).
    """
    check_block(group, "group")
    k = w.shape[-1]
    groups = _pad_to(w.float(), 1, group).unflatten(-1, (-1, group))
    absmax = groups.abs().amax(dim=-1)
    scales = torch.where(absmax > 0, absmax / INT4_MAX, torch.ones_like(absmax))
    scales = scales.to(torch.bfloat16)
    q = (groups / scales.float()[..., None]).round().clamp(-INT4_MAX, INT4_MAX).flatten(-2)
    codes = (q[..., : k + -k % INT4_RUN] + 8).to(torch.uint8)
    return codes.contiguous(), scales.contiguous()


def pack_int4(codes: Tensor) -> Tensor:
    """Codes (..., N, K), K a multiple of INT4_RUN, two a byte in the kernels' run layout."""
    runs = codes.unflatten(-1, (-1, 2, INT4_RUN // 2))
    return (runs[..., 0, :] | (runs[..., 1, :] << 4)).flatten(-2).contiguous()


def unpack_int4(packed: Tensor) -> Tensor:
    """The codes (..., N, 2 * bytes) of run-layout `packed`: the inverse of pack_int4."""
    runs = packed.unflatten(-1, (-1, INT4_RUN // 2))
    return torch.stack((runs & 15, runs >> 4), dim=-2).flatten(-3)


def int4_values(codes: Tensor, scales: Tensor, k: int, group: int = DEFAULT_BLOCK) -> Tensor:
    """fp32 weights (..., N, k) of codes and group scales (k: the unpadded K)."""
    q = codes[..., :k].float() - 8
    return q * scales.float().repeat_interleave(group, dim=-1)[..., :k]


def quantize_int4(w: Tensor, group: int = DEFAULT_BLOCK) -> tuple[Tensor, Tensor]:
    """(packed uint8 (..., N, 8 * cdiv(K, 16)) in the run layout, scales bf16): int4_codes,
    packed for the kernels."""
    codes, scales = int4_codes(w, group)
    return pack_int4(codes), scales


def dequantize_int4(packed: Tensor, scales: Tensor, k: int, group: int = DEFAULT_BLOCK) -> Tensor:
    """fp32 weights (..., N, k), q * s exactly, from run-layout packed codes and group scales
    (k: the unpadded K). Prefill tiles multiply by q * s rounded to bf16 (kernels.moe.tiles,
    FOLD_ROWS), within half a bf16 step of these."""
    return int4_values(unpack_int4(packed), scales, k, group)


@dataclass(frozen=True)
class MoeWeights:
    """Routed-expert weights in one format; shapes are checked against x at each call.

    ``block`` is the fp8 block edge or the int4 group size (unused for bf16). Scales are None
    for bf16. Build quantised weights with ``MoeWeights.quantize``.
    """

    fmt: str
    gate_up: Tensor
    down: Tensor
    gate_up_scale: Tensor | None = None
    down_scale: Tensor | None = None
    block: int = DEFAULT_BLOCK

    def __post_init__(self) -> None:
        check_format(self.fmt)
        check_block(self.block)
        if self.fmt == "int4" and self.block < 2 * INT4_RUN:
            raise ValueError(
                f"int4 groups of {self.block} are too small for the kernels: a K tile lies in "
                f"one group and is at least {2 * INT4_RUN} deep (its low and high nibbles are "
                f"two MMAs of 16); quantise with block >= {2 * INT4_RUN}."
            )
        if self.gate_up.dim() != 3 or self.down.dim() != 3:
            raise ValueError(
                f"gate_up and down must be 3-D (E, N, K), got {tuple(self.gate_up.shape)} and "
                f"{tuple(self.down.shape)}; stack the experts along dim 0."
            )
        value_dtype = {"fp8": torch.float8_e4m3fn, "int4": torch.uint8}.get(self.fmt)
        scales = (self.gate_up_scale, self.down_scale)
        if value_dtype is None:
            if any(s is not None for s in scales):
                raise ValueError("bf16 weights take no scales; pass fmt='fp8' or 'int4'.")
            return
        if self.gate_up.dtype != value_dtype or self.down.dtype != value_dtype:
            raise ValueError(
                f"{self.fmt} weights must be {value_dtype}, got {self.gate_up.dtype} and "
                f"{self.down.dtype}; build them with MoeWeights.quantize."
            )
        if any(s is None or s.dim() != 3 for s in scales):
            raise ValueError(f"{self.fmt} weights need 3-D gate_up_scale and down_scale.")

    @classmethod
    def quantize(
        cls, w_gate_up: Tensor, w_down: Tensor, fmt: str, block: int = DEFAULT_BLOCK
    ) -> "MoeWeights":
        """Weights in `fmt` from unquantised (E, 2I, H) and (E, H, I) tensors."""
        check_format(fmt)
        if fmt == "bf16":
            return cls("bf16", w_gate_up, w_down, block=block)
        quantize = quantize_fp8 if fmt == "fp8" else quantize_int4
        gate_up, gate_up_scale = quantize(w_gate_up, block)
        down, down_scale = quantize(w_down, block)
        return cls(fmt, gate_up, down, gate_up_scale, down_scale, block)

    @property
    def hidden(self) -> int:
        return self.down.shape[1]

    @property
    def inter(self) -> int:
        return self.gate_up.shape[1] // 2

    def dequantize(self) -> tuple[Tensor, Tensor]:
        """(gate_up, down) as the kernels see them: as stored for bf16, exact fp32 otherwise."""
        if self.fmt == "bf16":
            return self.gate_up, self.down
        if self.fmt == "fp8":
            return (
                dequantize_fp8(self.gate_up, self.gate_up_scale, self.block),
                dequantize_fp8(self.down, self.down_scale, self.block),
            )
        return (
            dequantize_int4(self.gate_up, self.gate_up_scale, self.hidden, self.block),
            dequantize_int4(self.down, self.down_scale, self.inter, self.block),
        )


def as_moe_weights(
    weights: MoeWeights | tuple[Tensor, Tensor] | Tensor, w_down: Tensor | None = None
) -> MoeWeights:
    """Normalise the accepted weight arguments to MoeWeights.

    Accepts MoeWeights, a (gate_up, down) tuple, or the legacy positional pair
    (w_gate_up, w_down) that workbench/model.py passes; the tensor forms mean bf16 format.
    """
    if isinstance(weights, MoeWeights):
        if w_down is not None:
            raise ValueError("pass w_down only with a w_gate_up tensor, not with MoeWeights.")
        return weights
    if isinstance(weights, tuple | list):
        if w_down is not None or len(weights) != 2:
            raise ValueError("pass weights as (w_gate_up, w_down) or as two tensors, not both.")
        weights, w_down = weights
    if not isinstance(weights, Tensor) or not isinstance(w_down, Tensor):
        raise ValueError(
            "weights must be MoeWeights, a (w_gate_up, w_down) tuple, or w_gate_up and w_down "
            "tensors."
        )
    return MoeWeights("bf16", weights, w_down)
