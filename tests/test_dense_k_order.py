"""kernels.dense.k_order: the K order the Gluon W8A16 kernel reads its FP8 weights in. The
kernel's GPU tests (tests/test_dense_kernels.py) check that it multiplies in this order; here,
on the CPU, that the order is the one its docstring gives and that the copy is kept and freed
with the weights."""

import gc

import pytest
import torch

from kernels.dense import k_order


def test_a_threads_sixteen_values_of_a_row_are_contiguous():
    k = 192
    stored = k_order.reorder_k(torch.arange(k).repeat(3, 1))
    for q in range(k // 64):
        for c in range(4):  # lane mod 4
            piece = stored[0, q * 64 + c * 16 : q * 64 + (c + 1) * 16].tolist()
            # wgmma's register operand: pairs at 2c and 2c + 8 of each 16-wide slice j
            want = [q * 64 + j * 16 + h * 8 + c * 2 + b for j in range(4) for h in range(2)
                    for b in range(2)]  # fmt: skip
            assert piece == want
    assert torch.equal(stored[1], stored[0]) and sorted(stored[0].tolist()) == list(range(k))


def test_the_order_keeps_the_product_and_the_scale_blocks():
    x, w = torch.randn(5, 256, dtype=torch.float64), torch.randn(7, 256, dtype=torch.float64)
    order = k_order.reorder_k(torch.arange(256)[None])[0]
    assert torch.allclose(x[:, order] @ k_order.reorder_k(w).T, x @ w.T)
    assert all(set(order[b : b + 128].tolist()) == set(range(b, b + 128)) for b in (0, 128))


def test_a_k_that_is_not_a_multiple_of_64_is_refused():
    with pytest.raises(ValueError, match="K a multiple of 64, got 208"):
        k_order.reorder_k(torch.zeros(4, 208))


def test_the_copy_is_made_once_for_a_group_and_freed_with_the_weights():
    values = torch.arange(4 * 3 * 64, dtype=torch.int16).reshape(4 * 3, 64)
    member = values[:3]  # the first of four members of 3 rows
    group = k_order.reordered(member, 12)
    assert group.shape == (12, 64) and torch.equal(group, k_order.reorder_k(values))
    assert k_order.reordered(member, 12) is group
    assert k_order.reordered(member, 3).shape == (3, 64)
    cached = len(k_order._copies)
    del member
    gc.collect()
    assert len(k_order._copies) == cached - 2


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the captures hold no kernel
def test_the_copy_is_not_made_inside_a_cuda_graph_capture(device):
    """GPU only: the first call must come before a capture, which the refusal says."""
    if device.type != "cuda":
        pytest.skip("a CUDA graph capture needs a GPU (WORKBENCH_GPU_TESTS=1)")
    values = torch.zeros(128, 128, dtype=torch.float8_e4m3fn, device=device)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="call it once before capturing"), torch.cuda.graph(graph):
        k_order.reordered(values, 128)
    k_order.reordered(values, 128)  # outside a capture it is made, and a capture then finds it
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        assert k_order.reordered(values, 128).shape == (128, 128)
