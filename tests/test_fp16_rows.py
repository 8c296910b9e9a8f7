"""kernels/moe/fp16_rows.py: the token rows the fp16 INT4 gate/up reads (under the interpreter
on the CPU, as a kernel on a GPU)."""

import pytest
import torch

from kernels.moe.fp16_rows import RUN, TOP, fp16_rows, fp16_rows_reference

ORDER = [0, 2, 1, 3]  # the fp16 conversion's K order within four columns


def rows(device: torch.device) -> torch.Tensor:
    """Rows far outside fp16's range and far inside it, one of zeros, one with a single value."""
    torch.manual_seed(0)
    x = torch.randn(5, 4 * RUN) * torch.tensor([[1e-9], [1.0], [3e6], [0.0], [0.0]])
    x[4, 7] = -5e4
    return x.to(torch.bfloat16).to(device)


def test_rows_match_the_reference_bit_for_bit(device):
    x = rows(device)
    values, inverses = fp16_rows(x)
    expected_values, expected_inverses = fp16_rows_reference(x)
    assert torch.equal(values, expected_values) and torch.equal(inverses, expected_inverses)


def test_each_row_lands_below_fp16s_largest_and_comes_back_exactly(device):
    """The largest magnitude of a nonzero row in [2**14, 2**15); rows times their inverse,
    the high-nibble columns times 16, put back in K order, are the bf16 input exactly."""
    x = rows(device)
    values, inverses = fp16_rows(x)
    assert torch.isfinite(values).all()
    high = (torch.arange(x.shape[1], device=device) % RUN) >= RUN // 2
    undone = values.float() * torch.where(high, 16.0, 1.0) * inverses[:, None]
    order = (torch.arange(x.shape[1]) // 4 * 4 + torch.tensor(ORDER * (x.shape[1] // 4))).to(device)
    assert torch.equal(undone[:, order], x.float())
    largest = (values.float() * torch.where(high, 16.0, 1.0)).abs().amax(dim=1)
    nonzero = x.float().abs().amax(dim=1) > 0
    assert ((largest[nonzero] >= 2**TOP) & (largest[nonzero] < 2 ** (TOP + 1))).all()
    assert torch.equal(inverses[~nonzero], torch.ones_like(inverses[~nonzero]))
    assert bool((torch.log2(inverses) == torch.round(torch.log2(inverses))).all())  # powers of 2


def test_no_rows_give_no_rows(device):
    values, inverses = fp16_rows(torch.empty(0, RUN, dtype=torch.bfloat16, device=device))
    assert values.shape == (0, RUN) and inverses.shape == (0,)


@pytest.mark.parametrize("shape", [(2, RUN + 4), (RUN,)])
def test_rows_that_are_not_whole_packed_runs_are_refused(device, shape):
    with pytest.raises(ValueError, match="H a multiple of 16"):
        fp16_rows(torch.zeros(shape, dtype=torch.bfloat16, device=device))
