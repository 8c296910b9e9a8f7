"""`workbench bench attention`: the indexer, the sparse attention, and the two with the top-k
between them, torch reference against Triton, at the TP2-rank shape and real context lengths.

Scenarios: one decode query at 2K and at 46K context, and a 4096-query prefill chunk ending at
46K. Each row is checked against the fp32 reference first (indexer scores; the attention over
the positions the fp32 scores select; the whole pipeline against fp32 attention over the
positions it selected itself) and only then timed, decode sizes as CUDA graph replays. The
floor is the larger of the bytes a step must move at the measured copy bandwidth (the
indexer's keys and scores, each selected latent row once, queries and outputs) and its FLOPs
at the measured cuBLAS bf16 rate: decode is all bytes (the indexer's keys, at 46K context), a
prefill chunk mostly FLOPs (every query scores every earlier key).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial

import pandas as pd
import torch
from tqdm.auto import tqdm

import kernels.attention as attention
from workbench.capture.bench_rows import (
    bench_setup,
    call_with_facts,
    check_then_time,
    compile_facts,
    print_row,
    roofline_ms,
    save_bench,
    time_call,
)
from workbench.errors import WorkbenchError
from workbench.presets import RankShapes
from workbench.workloads.attention import SCENARIOS, Problem, Scenario
from workbench.workloads.checks import relative_error, tolerance

VARIANTS = ("torch", "triton")
KERNELS = ("indexer", "sparse_attention", "attention")
SELECTION_SLACK = 1e-2  # of a row's largest |score|: how far below the fp32 cut a pick may be
COLUMNS = [
    "kernel", "variant", "scenario", "m", "context", "ms", "iqr_ms", "floor_ms",
    "ratio_to_floor", "tflops", "rel_error", "regs", "spills", "status",
]  # fmt: skip
PRINTED = ("kernel", "variant", "scenario", "ms", "floor_ms", "ratio_to_floor", "rel_error",
           "regs", "spills", "status")  # fmt: skip


def _scores_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Error over the scored keys; NaN unless exactly the future keys are -inf."""
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(out)):
        return float("nan")
    return relative_error(out[finite], ref[finite])


def _calls(variant: attention.AttentionVariant, p: Problem, s: RankShapes) -> dict:
    """kernel -> (call, reference, error measure) for one variant on one problem."""

    chosen: dict[str, torch.Tensor] = {}

    def pipeline() -> torch.Tensor:
        scores = variant.indexer_scores(p.index_q, p.index_w, p.keys, p.pos)
        chosen["index"] = variant.select_positions(scores, p.pos, s.index_topk, s.window)
        return variant.attend(p.q, p.kv, chosen["index"])

    def own_selection_error(out: torch.Tensor, _fp32_pipeline: torch.Tensor) -> float:
        """The pipeline against fp32 attention over the positions it selected itself, once the
        selection is a right one (else inf): bf16 indexer scores break near-ties differently
        from fp32 ones (the torch reference's bf16 dot products picked other positions and
        missed the fp32 output by 5-8% on the H200), which is selection, not error."""
        if not selection_ok(chosen["index"], p, s.window):
            return float("inf")
        reference = attention.sparse_attention(p.q.float(), p.kv.float(), chosen["index"])
        return relative_error(out, reference)

    return {
        "indexer": (
            partial(variant.indexer_scores, p.index_q, p.index_w, p.keys, p.pos),
            p.scores_ref,
            _scores_error,
        ),  # fmt: skip
        "sparse_attention": (
            partial(variant.attend, p.q, p.kv, p.index),
            p.out_ref,
            relative_error,
        ),  # fmt: skip
        "attention": (pipeline, p.out_ref, own_selection_error),
    }


def selection_ok(index: torch.Tensor, p: Problem, window: int) -> bool:
    """Whether `index` is a right selection for the problem, near-ties aside: the same window
    columns as the fp32 selection, as many top-k picks, none of them inside the window or in
    the future, and each scoring (in fp32) within SELECTION_SLACK of the row's largest score of
    the fp32 selection's worst pick."""
    if index.shape != p.index.shape:
        return False
    topk = index.shape[1] - window
    if not torch.equal(index[:, topk:], p.index[:, topk:]):
        return False
    picks, ref_picks = index[:, :topk], p.index[:, :topk]
    valid, ref_valid = picks >= 0, ref_picks >= 0
    if not torch.equal(valid.sum(dim=1), ref_valid.sum(dim=1)):
        return False
    if (picks > (p.pos[:, None] - window)).any():  # inside the window, or in the future
        return False
    scores = p.scores_ref.gather(1, picks.clamp(min=0))
    ref_scores = p.scores_ref.gather(1, ref_picks.clamp(min=0))
    worst = ref_scores.masked_fill(~ref_valid, float("inf")).amin(dim=1, keepdim=True)
    finite = p.scores_ref.masked_fill(~torch.isfinite(p.scores_ref), 0.0)
    slack = SELECTION_SLACK * finite.abs().amax(dim=1, keepdim=True)
    return bool((scores >= worst - slack)[valid].all())


def cost(kernel: str, sc: Scenario, p: Problem, s: RankShapes) -> tuple[float, float]:
    """(bytes, FLOPs) a kernel must move and compute at least, in the serving dtype."""
    element = p.q.element_size()
    indexer_bytes = (sc.context * s.index_dim + p.index_q.numel()) * element + 4 * (
        p.index_w.numel() + sc.queries * sc.context
    )
    indexer_flops = 2.0 * s.index_heads * s.index_dim * float((p.pos + 1).sum())
    rows = min(sc.queries * p.index.shape[1], sc.context)  # each selected latent row once
    attend_bytes = (rows * s.head_dim + 2 * p.q.numel()) * element
    attend_flops = 4.0 * s.q_heads * s.head_dim * float((p.index >= 0).sum())
    if kernel == "indexer":
        return indexer_bytes, indexer_flops
    if kernel == "sparse_attention":
        return attend_bytes, attend_flops
    return indexer_bytes + attend_bytes, indexer_flops + attend_flops


def _row(kernel, name, call: Callable, ref, error, sc, p, s, ctx) -> dict:
    facts: list[dict] = []

    def check() -> dict:
        return {"rel_error": error(call_with_facts(call, facts), ref), **compile_facts(facts)}

    row = {"kernel": kernel, "variant": name, "scenario": sc.name, "m": sc.queries,
           "context": sc.context}  # fmt: skip
    timer = partial(time_call, call, ctx["device"], sc.queries)
    row = check_then_time(row, check, tolerance("attention", "bf16"), timer)
    if "ms" not in row:
        return row
    nbytes, flops = cost(kernel, sc, p, s)
    ceilings = ctx["ceilings"]
    floor_ms = roofline_ms(nbytes, flops, ceilings)
    return row | {
        "floor_ms": floor_ms,
        "ratio_to_floor": row["ms"] / floor_ms,
        "tflops": flops / (row["ms"] / 1e3) / 1e12,
    }


def bench_attention(
    scenarios: Sequence[Scenario] = SCENARIOS,
    variants: Sequence[str] = VARIANTS,
    kernels: Sequence[str] = KERNELS,
    preset: str = "dsv4-flash-tp2",
    out: str = "raw",
    seed: int = 0,
    device: str = "cuda",
    ceilings: dict | None = None,
    progress: bool = True,
    **shape_overrides: int,
) -> pd.DataFrame:
    """Benchmark every attention variant x kernel in every scenario."""
    unknown = sorted(set(variants) - set(attention.VARIANTS)) + sorted(set(kernels) - set(KERNELS))
    if unknown:
        raise WorkbenchError(
            f"unknown attention variants or kernels {unknown}; variants: "
            f"{', '.join(attention.VARIANTS)}; kernels: {', '.join(KERNELS)}"
        )
    setup = bench_setup(preset, device, seed, ceilings, shape_overrides)
    dev, s, dtype = setup.device, setup.shapes, setup.dtype
    ctx = {"device": dev, "ceilings": setup.ceilings}
    rows = []
    total = len(scenarios) * len(variants) * len(kernels)
    with tqdm(total=total, desc="bench attention", disable=not progress) as bar:
        for sc in scenarios:
            problem = Problem.draw(sc, s, dtype, dev, seed)
            for name in variants:
                calls = _calls(attention.VARIANTS[name], problem, s)
                for kernel in kernels:
                    rows.append(_row(kernel, name, *calls[kernel], sc, problem, s, ctx))
                    print_row(bar, rows[-1], PRINTED)
    params = {"scenarios": [asdict(sc) for sc in scenarios], "variants": list(variants),
              "kernels": list(kernels), "preset": preset, "seed": seed, "device": device,
              "shape_overrides": shape_overrides}  # fmt: skip
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    return save_bench("attention", setup, out, params, table)
