"""The per-device buffers kept at zero between kernel calls (kernels/zeroed.py)."""

import torch

from kernels import zeroed


def test_a_buffer_is_made_once_and_served_by_its_first_rows():
    store: dict = {}
    first = zeroed.kept_zeros(store, 3, torch.device("cpu"), (2,), least_rows=8)
    assert first.shape == (3, 2) and first.dtype == torch.int32 and not first.any()
    again = zeroed.kept_zeros(store, 5, torch.device("cpu"), (2,))
    assert again.data_ptr() == first.data_ptr()  # the same 8 rows: nothing new was made


def test_an_outgrown_buffer_is_kept_for_the_graphs_that_may_hold_it():
    store: dict = {}
    small = zeroed.kept_zeros(store, 4, torch.device("cpu"))
    held = store[torch.device("cpu")]
    large = zeroed.kept_zeros(store, 16, torch.device("cpu"))
    assert large.shape == (16,) and large.data_ptr() != small.data_ptr()
    assert any(kept is held for kept in zeroed._outgrown)
