"""Assertion helpers shared by the test modules."""

import torch
from torch import Tensor


def relative_error(out: Tensor, ref: Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; fails on NaN/inf in either or on a zero reference."""
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(out64).all(), "output has NaN or inf"
    assert torch.isfinite(ref64).all(), "reference has NaN or inf"
    ref_norm = ref64.norm().item()
    assert ref_norm > 0, "reference is all zeros: the comparison would prove nothing"
    return (out64 - ref64).norm().item() / ref_norm
