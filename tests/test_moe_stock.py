"""The stock-scheduled Triton MoE against moe_reference (under the interpreter on CPU)."""

import subprocess
import sys

import pytest
import torch
from conftest import GPU_TESTS
from helpers import ROOT, relative_error

from kernels import moe
from kernels.moe import moe_reference, moe_stock, router_topk
from kernels.moe.formats import as_moe_weights
from kernels.moe.routing import validate_moe_inputs

EXPERTS, TOP_K = 8, 2
# bf16: each slot's row is stored in bf16 before the combine (kernels.moe.launch), and the
# interpreter narrows fp32 to bf16 by truncation where the GPU rounds to nearest: 0.0106 on
# the default-tiles problem here, 0.0085 with fp32 rows. The GPU keeps the 1e-2 bound.
TOLERANCE = {torch.bfloat16: 1e-2 if GPU_TESTS else 1.5e-2, torch.float32: 1e-4}
SMALL_TILES = {"block_n": 32, "block_k": 32}  # several N and K tiles, each with a ragged edge


def make_problem(tokens, hidden, inter, dtype, device, seed, topk_ids=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    w_gate_up = torch.randn(EXPERTS, 2 * inter, hidden, generator=gen) / hidden**0.5
    w_down = torch.randn(EXPERTS, hidden, inter, generator=gen) / inter**0.5
    ids, weights = router_topk(torch.randn(tokens, EXPERTS, generator=gen), TOP_K)
    ids = ids if topk_ids is None else topk_ids.to(torch.int32)
    tensors = (x.to(dtype), ids, weights, w_gate_up.to(dtype), w_down.to(dtype))
    return tuple(t.to(device) for t in tensors)


def check_against_reference(problem, **kwargs):
    out = moe_stock(*problem, **kwargs)
    x = problem[0]
    assert out.shape == x.shape and out.dtype == x.dtype
    assert relative_error(out, moe_reference(*problem)) < TOLERANCE[x.dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize(("tokens", "hidden", "inter"), [(1, 64, 32), (5, 96, 48), (37, 72, 40)])
def test_matches_reference(device, dtype, groups, tokens, hidden, inter):
    problem = make_problem(tokens, hidden, inter, dtype, device, seed=tokens + groups)
    check_against_reference(problem, groups=groups, **SMALL_TILES)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_all_tokens_on_one_expert(device, dtype):
    ids = torch.full((37, TOP_K), 6)  # 74 rows: several block_m tiles on one expert
    check_against_reference(make_problem(37, 72, 40, dtype, device, 7, ids), groups=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_several_empty_experts(device, dtype):
    ids = torch.tensor([[0, 2], [7, 0], [2, 7], [0, 7], [7, 2]])  # experts 1, 3-6 get nothing
    check_against_reference(make_problem(5, 72, 40, dtype, device, 8, ids), groups=3, **SMALL_TILES)


def test_default_groups_and_tiles(device):
    check_against_reference(make_problem(5, 72, 40, torch.bfloat16, device, 9))


def test_variants_registry():
    assert moe.VARIANTS["stock"] is moe_stock
    assert moe.VARIANTS["reference"] is moe_reference


def _operands(**changes):
    """Keyword operands of a valid small problem, each named one passed through its change."""
    names = ("x", "topk_ids", "topk_weights", "weights", "w_down")
    args = dict(zip(names, make_problem(4, 64, 32, torch.float32, "cpu", 10), strict=True))
    return {name: changes.get(name, lambda t: t)(tensor) for name, tensor in args.items()}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"x": lambda x: x.to(torch.int32)}, "floating"),
        ({"x": lambda x: x[None]}, r"\(T, H\)"),
        (
            {"x": lambda x: x[:0], "topk_ids": lambda i: i[:0], "topk_weights": lambda w: w[:0]},
            "T == 0",
        ),
        ({"weights": lambda w: w[:, :, :48]}, "w_gate_up must be"),
        ({"weights": lambda w: w[:, :63]}, "w_gate_up must be"),
        ({"w_down": lambda w: w.transpose(1, 2)}, "w_down must be"),
        ({"w_down": lambda w: w.to(torch.bfloat16)}, "share a dtype"),
        ({"topk_ids": lambda i: i[:3]}, "topk_ids must be"),
        ({"topk_weights": lambda w: w[:, :1]}, "differs from topk_ids"),
        ({"topk_ids": lambda i: i.float()}, "integer"),
        ({"topk_weights": lambda w: w.to(torch.int32)}, "topk_weights must be floating"),
        ({"topk_ids": lambda i: torch.where(i == i[0, 0], EXPERTS, i)}, "outside"),
        ({"topk_ids": lambda i: torch.where(i == i[0, 0], -1, i)}, "outside"),
    ],
)
def test_rejects_bad_inputs(changes, message):
    with pytest.raises(ValueError, match=message):
        moe_stock(**_operands(**changes))


@pytest.mark.parametrize(
    ("options", "message"),
    [({"block_n": 8}, "block_n"), ({"block_k": 48}, "block_k"), ({"groups": 0}, "groups")],
)
def test_rejects_bad_launch_options(options, message):
    with pytest.raises(ValueError, match=message):
        moe_stock(**_operands(), **options)


def test_trusted_routing_skips_only_the_range_readback():
    """Under `trusted_routing` the ids' range (a host sync on a GPU) is not read back; shapes
    still are, and the check is back once the block ends."""
    out_of_range = _operands(topk_ids=lambda i: torch.where(i == i[0, 0], EXPERTS, i))
    operands = [out_of_range[name] for name in ("x", "topk_ids", "topk_weights")]
    weights = as_moe_weights(out_of_range["weights"], out_of_range["w_down"])
    with moe.trusted_routing():
        assert validate_moe_inputs(*operands, weights).experts == EXPERTS
        with pytest.raises(ValueError, match="topk_ids must be"):
            moe_stock(**_operands(topk_ids=lambda i: i[:3]))
    with pytest.raises(ValueError, match="outside"):
        validate_moe_inputs(*operands, weights)


def test_trusted_routing_ends_with_its_block_when_the_block_raises():
    with pytest.raises(RuntimeError, match="inside"), moe.trusted_routing():
        raise RuntimeError("inside")
    with pytest.raises(ValueError, match="outside"):
        moe_stock(**_operands(topk_ids=lambda i: torch.where(i == i[0, 0], EXPERTS, i)))


@pytest.mark.skipif(GPU_TESTS, reason="checks the refusal without a GPU")
def test_the_served_loop_script_says_it_needs_a_gpu():
    result = subprocess.run([sys.executable, "scripts/moe_served_loop.py"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "run it on a machine with a GPU" in result.stderr
