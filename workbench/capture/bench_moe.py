"""`workbench bench moe`: every MoE scheduler and weight format against its physical floor
and its peers, at the TP2-rank shape, with the ceilings measured in the same run.

Peers are the torch baselines (`torch_grouped_mm`, `torch_grouped_mm_bare`, `cublas_loop`, on
the bf16 masters, each row's `variant` saying what its timed call holds) and
the registered MoE peers (`workbench.peers`: DeepGEMM's grouped FP8 GEMMs, humming's MoE, ...),
which take the same masters as FP8 in DeepSeek's 128x128 blocks (`bench_peers`); one that
cannot run here is a `missing-peer` row with the reason in `note`. Each row is checked against
`moe_reference` on the same (dequantised) weights before it is timed: a wrong kernel is
reported `wrong`, not timed; one that does not compile, runs out of memory or spills is
reported as such. The rows at one (routing, T) are timed in turns (`bench_rows`). Inputs
come from the one MoE workload builder
(`workbench.workloads.moe`) and times from the one timer (`workbench.capture.timing`), as in
`sweep`, `ab` and `ncu`. Rows go to `raw/<run-id>/bench.csv` with `run.json` (ceilings,
timing method, environment).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from kernels.moe import FORMATS, VARIANTS, W8A8_VARIANTS, MoeWeights, last_facts, trusted_routing
from workbench.capture.bench_peers import PeerRun, prepare_peers, unrun_rows
from workbench.capture.bench_rows import (
    RowPlan,
    bench_setup,
    check_then_time,
    compile_facts,
    print_row,
    roofline_ms,
    save_bench,
)
from workbench.capture.timing import Launch
from workbench.peers import PEER_BLOCK, get_peers, peer_names
from workbench.presets import RankShapes
from workbench.workloads.checks import moe_check_key, relative_error, tolerance
from workbench.workloads.moe import (
    MoeProblem,
    expert_masters,
    flops,
    min_bytes,
    moe_problem,
    reference,
)

TOKENS = (1, 6, 24, 48, 512, 4096, 33863)
SCHEDULERS = ("stock", "multirow", "flat", "padded", "w8a8")
# torch on the bf16 masters, by what the timed call holds (the rows' `variant`)
BASELINE_VARIANTS = {
    "torch_grouped_mm": "whole layer: sort, gather, 2 grouped GEMMs, fp32 SiLU, fp32 scatter",
    "torch_grouped_mm_bare": "2 grouped GEMMs and a bf16 SiLU; sort, gather, scatter untimed",
    "cublas_loop": "whole layer: a cuBLAS GEMM pair per expert with tokens, torch glue",
}
BASELINES = tuple(BASELINE_VARIANTS)
COLUMNS = [
    "kernel", "variant", "weight_dtype", "tokens", "routing", "ms", "iqr_ms", "floor_ms",
    "ratio_to_floor", "tflops", "ratio_to_cublas", "rel_error", "regs", "spills", "status",
    "note",
]  # fmt: skip


def _expert_layout(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot order sorted by expert, int32 end offset of each expert's run) for grouped_mm."""
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    offsets = torch.cumsum(torch.bincount(flat, minlength=experts), 0).to(torch.int32)
    return order, offsets


def _scatter(y: torch.Tensor, x: torch.Tensor, ids, weights, order) -> torch.Tensor:
    """The layer output from per-slot expert outputs in expert order: weighted, summed per
    token in fp32, in x's dtype."""
    top_k = ids.shape[1]
    y = y.float() * weights.reshape(-1)[order, None]
    out = torch.zeros(x.shape[0], x.shape[1], device=x.device, dtype=torch.float32)
    out.index_add_(0, order // top_k, y)
    return out.to(x.dtype)


def grouped_mm_peer(x, ids, weights, w_gate_up, w_down) -> torch.Tensor:
    """The torch peer: tokens sorted by expert, `torch._grouped_mm` for both projections."""
    order, offsets = _expert_layout(ids, w_gate_up.shape[0])
    rows = x[order // ids.shape[1]]
    gate_up = torch._grouped_mm(rows, w_gate_up.transpose(1, 2), offs=offsets)
    gate, up = gate_up.chunk(2, dim=-1)
    h = (F.silu(gate.float()) * up.float()).to(x.dtype)
    y = torch._grouped_mm(h, w_down.transpose(1, 2), offs=offsets)
    return _scatter(y, x, ids, weights, order)


def grouped_mm_bare(
    x, ids, weights, w_gate_up, w_down
) -> tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
    """(the timed part, what completes it into the layer output) of the bare torch peer.

    The timed part is the two grouped GEMMs with a bf16 SiLU-and-multiply between them, on
    rows already sorted by expert: what the GEMMs alone cost, the bound a fused MoE kernel
    is measured against once its routing glue is paid for elsewhere. The sort, the gather
    and the weighted scatter run before and after it, outside the timing, for the check.
    """
    order, offsets = _expert_layout(ids, w_gate_up.shape[0])
    rows = x[order // ids.shape[1]]

    def gemms() -> torch.Tensor:
        gate, up = torch._grouped_mm(rows, w_gate_up.transpose(1, 2), offs=offsets).chunk(2, -1)
        return torch._grouped_mm(F.silu(gate) * up, w_down.transpose(1, 2), offs=offsets)

    return gemms, partial(_scatter, x=x, ids=ids, weights=weights, order=order)


def cublas_loop_peer(x, ids, weights, w_gate_up, w_down) -> torch.Tensor:
    """The naive peer: one cuBLAS GEMM pair per expert that has tokens."""
    tokens, top_k = ids.shape
    out = torch.zeros(tokens, x.shape[1], device=x.device, dtype=torch.float32)
    flat = ids.reshape(-1)
    for expert in torch.unique(flat).tolist():
        slots = torch.nonzero(flat == expert).squeeze(1)
        token = slots // top_k
        gate, up = (x[token] @ w_gate_up[expert].T).chunk(2, dim=-1)
        y = ((F.silu(gate.float()) * up.float()).to(x.dtype) @ w_down[expert].T).float()
        out.index_add_(0, token, y * weights.reshape(-1)[slots, None])
    return out.to(x.dtype)


def plan(
    kernel: str,
    variant: str,
    fmt: str,
    call: Callable[[], torch.Tensor],
    expected: torch.Tensor,
    problem: MoeProblem,
    s: RankShapes,
    ceilings: dict,
    scheme: str | None = None,
    timed: Callable[[], object] | None = None,
) -> RowPlan:
    """One benchmark row's plan: checked, then timed with the rest of its (routing, T) in
    turns (`bench_rows.check_then_time`); every failure becomes a status. `scheme` ("w8a8",
    "w8a16") is a peer's: its tolerance, and for W8A8 the FP8 tensor-core rate of its floor.
    `timed` is what is timed when it is only part of the checked `call`."""
    tokens = problem.x.shape[0]
    row = {"kernel": kernel, "variant": variant, "weight_dtype": fmt, "tokens": tokens,
           "routing": problem.routing}  # fmt: skip

    def check() -> dict:
        error = relative_error(call(), expected)
        facts = compile_facts([last_facts()] if kernel == "moe" else [])
        return {"rel_error": error, **facts}

    def judge(row: dict) -> dict:
        ms = row["ms"]
        # The workbench's formats compute in bf16 (W*A16: weights dequantised in registers).
        peak = "fp8_flops" if scheme == "w8a8" else "bf16_flops"
        floor_ms = roofline_ms(min_bytes(fmt, problem, s), flops(tokens, s), ceilings, peak)
        tflops = flops(tokens, s) / (ms / 1e3) / 1e12
        return {
            "floor_ms": floor_ms,
            "ratio_to_floor": ms / floor_ms,
            "tflops": tflops,
            "ratio_to_cublas": tflops * 1e12 / ceilings["bf16_flops"],
        }

    timed = timed or call
    if kernel == "moe":  # checked untimed by `check`: its samples skip the routing's readback
        timed = trusted_routing()(timed)
    launch = Launch(timed, tokens, graph=None if kernel == "moe" else False)
    return RowPlan(row, check, tolerance("moe", scheme or fmt), launch, judge)


REPORT_KEYS = ("kernel", "variant", "weight_dtype", "tokens", "routing", "ms", "ratio_to_floor",
               "ratio_to_cublas", "regs", "spills", "status")  # fmt: skip

WHOLE_LAYER_CALLS = {"torch_grouped_mm": grouped_mm_peer, "cublas_loop": cublas_loop_peer}


def _baseline(name: str, args: tuple, base: tuple) -> tuple[Callable, Callable | None]:
    """(the checked call, the timed part when it is not the whole call) of a torch baseline."""
    if name == "torch_grouped_mm_bare":
        gemms, finish = grouped_mm_bare(*args, *base)
        return lambda: finish(gemms()), gemms
    return partial(WHOLE_LAYER_CALLS[name], *args, *base), None


def default_peers() -> list[str]:
    """The torch baselines, then every registered MoE peer."""
    return [*BASELINES, *peer_names("moe")]


def _peer_weights(base: tuple[torch.Tensor, torch.Tensor], held: dict) -> MoeWeights:
    """The experts as the peers take them: FP8 in 128x128 blocks (the run's own FP8 when it
    already uses that block)."""
    fp8 = held.get("fp8")
    if fp8 is not None and fp8.block == PEER_BLOCK:
        return fp8
    return MoeWeights.quantize(*base, "fp8", PEER_BLOCK)


def _peer_plans(
    run: PeerRun, problem: MoeProblem, ctx: tuple, known: dict[int, torch.Tensor]
) -> list[RowPlan]:
    """The converted registered peers' plans at one (routing, T), each checked against the
    reference on its 128x128-block FP8 experts. `known` holds the references already computed
    at this T, by id of the weights: the peers' weights are the run's own FP8 when it uses
    128-wide blocks."""
    if not run.prepared:
        return []
    expected = known.get(id(run.weights))
    if expected is None:
        expected = reference(problem, run.weights)
    plans = []
    for prepared in run.prepared:
        peer = prepared.peer
        call = partial(prepared.converted, *problem.args())
        plans.append(plan(peer.name, peer.moe_variant, "fp8", call, expected, problem, *ctx,
                          scheme=peer.scheme))  # fmt: skip
    return plans


def bench_moe(
    tokens: Sequence[int] = TOKENS,
    routings: Sequence[str] = ("uniform", "skewed"),
    variants: Sequence[str] = SCHEDULERS,
    formats: Sequence[str] = FORMATS,
    peers: Sequence[str] | bool | None = None,
    preset: str = "dsv4-flash-tp2",
    out: str = "raw",
    seed: int = 0,
    device: str = "cuda",
    ceilings: dict | None = None,
    progress: bool = True,
    **shape_overrides: int,
) -> pd.DataFrame:
    """Benchmark every variant x format (the W8A8 variants: FP8 only) and the peers at every
    token count and routing.

    `peers`: names from `default_peers()` (None or True: all of them; False or []: none).
    """
    names = default_peers() if peers is None or peers is True else list(peers or [])
    baselines = [n for n in names if n in BASELINES]
    registered = get_peers([n for n in names if n not in BASELINES], "moe")
    setup = bench_setup(preset, device, seed, ceilings, shape_overrides)
    dev, s, dtype, ceilings = setup.device, setup.shapes, setup.dtype, setup.ceilings
    base = expert_masters(s, seed, dev, dtype)
    weights = {fmt: MoeWeights.quantize(*base, fmt) for fmt in formats}
    # conversions and JIT, before anything is timed
    peer_run = prepare_peers(registered, "moe", partial(_peer_weights, base, weights))
    ctx = (s, ceilings)
    rows = []
    pairs = [
        (fmt, v) for fmt in formats for v in variants if v not in W8A8_VARIANTS or fmt == "fp8"
    ]
    per_size = len(pairs) + len(baselines) * ("bf16" in formats)
    work = len(routings) * len(tokens) * (per_size + len(registered))
    with tqdm(total=work, desc="bench moe", disable=not progress) as bar:
        for routing in routings:
            for t in tokens:
                problem = moe_problem(s, t, routing, seed, dev, dtype)
                args = problem.args()
                references: dict[int, torch.Tensor] = {}
                plans = []
                for fmt in formats:
                    expected = references[id(weights[fmt])] = reference(problem, weights[fmt])
                    for variant in [v for f, v in pairs if f == fmt]:
                        call = partial(VARIANTS[variant], *args, weights[fmt])
                        scheme = moe_check_key(variant, fmt)
                        plans.append(plan("moe", variant, fmt, call, expected, problem, *ctx,
                                          scheme))  # fmt: skip
                    if fmt == "bf16":
                        for name in baselines:
                            call, timed = _baseline(name, args, base)
                            plans.append(plan(name, BASELINE_VARIANTS[name], fmt, call,
                                              expected, problem, *ctx, timed=timed))  # fmt: skip
                plans += _peer_plans(peer_run, problem, ctx, references)
                unrun = unrun_rows(peer_run, problem.tokens, "tokens")
                for row in check_then_time(plans, dev) + unrun:
                    rows.append(row | {"routing": routing})
                    print_row(bar, rows[-1], REPORT_KEYS)
    params = {"tokens": list(tokens), "routings": list(routings), "variants": list(variants),
              "formats": list(formats), "preset": preset, "seed": seed, "device": device,
              "shape_overrides": shape_overrides, "peers": names,
              "peer_block": PEER_BLOCK}  # fmt: skip
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    return save_bench("moe", setup, out, params, table, rows, peers=peer_run.meta)
