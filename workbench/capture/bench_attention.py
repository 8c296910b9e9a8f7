"""`workbench bench attention`: the indexer, the top-k select, the sparse attention, and the
three in a row, for the torch reference, the bf16 Triton path and the FP8 path, with
DeepGEMM's FP8 indexer as a peer, at the TP2-rank shape and real context lengths.

Scenarios: one decode query at 2K and at 46K context, and a 4096-query prefill chunk ending at
46K. Each row is checked first and only then timed, decode sizes as CUDA graph replays:
indexer scores against fp32 of the inputs as the variant poses them (FP8 keys and queries for
`fp8` and the peer), the selection by the selection rules, the attention over the reference's
positions, the whole pipeline against fp32 attention over the positions it selected itself.
`quant_error` is the error against fp32 of the unquantised inputs (FP8's own rounding for the
FP8 rows) and `overlap` the share of the fp32 selection's picks the pipeline made. The floor
is the larger of the bytes a step must move at the measured copy bandwidth (the indexer's keys
and scores, each selected latent row once, queries and outputs) and its FLOPs at the measured
rate of the tensor-core dtype (FP8 for the FP8 indexer, bf16 otherwise): decode is all bytes,
a prefill chunk mostly FLOPs (every query scores every earlier key).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from functools import partial

import pandas as pd
import torch
from tqdm.auto import tqdm

import kernels.attention as attention
from workbench.capture.bench_rows import (
    RowPlan,
    bench_setup,
    call_with_facts,
    check_then_time,
    compile_facts,
    print_row,
    roofline_ms,
    save_bench,
)
from workbench.capture.timing import Launch
from workbench.errors import WorkbenchError
from workbench.presets import RankShapes
from workbench.workloads.attention import DECODE_QUERIES, SCENARIOS, Problem, Scenario
from workbench.workloads.checks import relative_error, tolerance

VARIANTS = ("torch", "triton", "fp8")
# `indexer_select`: the indexer and the select as the variant chains them (`choose`): the FP8
# variant's decode form takes the select's first round inside the indexer.
KERNELS = ("indexer", "select", "indexer_select", "sparse_attention", "attention")
SELECTION_SLACK = 1e-2  # of a row's largest |score|: how far below the fp32 cut a pick may be
COLUMNS = [
    "kernel", "variant", "scenario", "m", "context", "ms", "iqr_ms", "floor_ms",
    "ratio_to_floor", "tflops", "rel_error", "quant_error", "overlap", "regs", "spills", "status",
    "note",
]  # fmt: skip
PEERS = ("deepgemm",)
PRINTED = ("kernel", "variant", "scenario", "ms", "floor_ms", "ratio_to_floor", "rel_error",
           "quant_error", "regs", "spills", "status")  # fmt: skip


def _scores_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Error over the scored keys; NaN unless exactly the future keys are -inf."""
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(out)):
        return float("nan")
    return relative_error(out[finite], ref[finite])


def overlap(index: torch.Tensor, ref_index: torch.Tensor, topk: int) -> float:
    """The share of the reference's top-k picks that `index` picked too (window aside)."""
    width = int(max(index.max(), ref_index.max())) + 2
    picked = torch.zeros(index.shape[0], width, dtype=torch.bool, device=index.device)
    picked.scatter_(1, index[:, :topk] + 1, True)  # -1 lands in column 0, never counted
    wanted = ref_index[:, :topk]
    hits = picked.gather(1, wanted + 1) & (wanted >= 0)
    return float(hits.sum() / (wanted >= 0).sum().clamp(min=1))


def _calls(variant: attention.AttentionVariant, p: Problem, s: RankShapes) -> dict:
    """kernel -> (call, reference, error measure, quantisation measure) for one variant on one
    problem, `p` posed in the variant's key format (`own_problem`)."""

    chosen: dict[str, torch.Tensor] = {}
    topk = s.index_topk

    choose = partial(variant.choose, p.index_q, p.index_w, p.cached_keys, p.pos, None, topk,
                     s.window)  # fmt: skip

    def pipeline() -> torch.Tensor:
        chosen["index"] = choose()
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

    def selection_error(index: torch.Tensor, _ref: torch.Tensor) -> float:
        """0 for a right selection of the reference scores, inf otherwise."""
        return 0.0 if selection_ok(index, p, s.window) else float("inf")

    def scores_fidelity(scores: torch.Tensor) -> dict:
        return {"quant_error": _scores_error(scores, p.fp32_scores)}

    def pipeline_fidelity(out: torch.Tensor) -> dict:
        return {"quant_error": relative_error(out, p.fp32_out),
                "overlap": overlap(chosen["index"], p.fp32_index, topk)}  # fmt: skip

    return {
        "indexer": (
            partial(variant.indexer_scores, p.index_q, p.index_w, p.cached_keys, p.pos),
            p.scores_ref,
            _scores_error,
            scores_fidelity,
        ),  # fmt: skip
        "select": (
            partial(variant.select_positions, p.scores_ref, p.pos, topk, s.window),
            p.index,
            selection_error,
            None,
        ),  # fmt: skip
        "indexer_select": (choose, p.index, selection_error, None),
        "sparse_attention": (
            partial(variant.attend, p.q, p.kv, p.index),
            p.out_ref,
            relative_error,
            None,
        ),  # fmt: skip
        "attention": (pipeline, p.out_ref, own_selection_error, pipeline_fidelity),
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


def cost(
    kernel: str, sc: Scenario, p: Problem, s: RankShapes, key_format: str
) -> tuple[float, dict[str, float]]:
    """(bytes, FLOPs by tensor-core rate) a kernel must move and compute at least, in the
    variant's formats: FP8 keys (a byte and a 4-byte scale per key) and the indexer's MMA at
    the FP8 rate, or bf16 keys at the bf16 rate. Selection reads each score and writes the
    index once; attention reads each selected latent row once."""
    element = p.q.element_size()
    fp8 = key_format == "fp8"
    key_bytes = sc.context * (s.index_dim + 4 if fp8 else s.index_dim * element)
    scores_bytes = 4 * sc.queries * sc.context
    indexer_bytes = key_bytes + p.index_q.numel() * element + 4 * p.index_w.numel() + scores_bytes
    indexer_flops = {("fp8_flops" if fp8 else "bf16_flops"):
                     2.0 * s.index_heads * s.index_dim * float((p.pos + 1).sum())}  # fmt: skip
    select_bytes = scores_bytes + p.index.numel() * p.index.element_size()
    rows = min(sc.queries * p.index.shape[1], sc.context)  # each selected latent row once
    attend_bytes = (rows * s.head_dim + 2 * p.q.numel()) * element
    attend_flops = {"bf16_flops": 4.0 * s.q_heads * s.head_dim * float((p.index >= 0).sum())}
    if kernel == "indexer":
        return indexer_bytes, indexer_flops
    if kernel == "select":
        return select_bytes, {}
    if kernel == "indexer_select":
        return indexer_bytes + select_bytes, indexer_flops
    if kernel == "sparse_attention":
        return attend_bytes, attend_flops
    flops = {rate: indexer_flops.get(rate, 0.0) + attend_flops.get(rate, 0.0)
             for rate in {*indexer_flops, *attend_flops}}  # fmt: skip
    return indexer_bytes + select_bytes + attend_bytes, flops


def floor_ms(nbytes: float, flops: dict[str, float], ceilings: dict) -> float:
    """The larger of the bytes at the copy bandwidth and the FLOPs at their rates, summed."""
    compute = sum(roofline_ms(0.0, count, ceilings, rate) for rate, count in flops.items())
    return max(roofline_ms(nbytes, 0.0, ceilings), compute)


def _peer_plan(sc: Scenario, p: Problem, s: RankShapes, ctx: dict) -> RowPlan | dict:
    """DeepGEMM's indexer on the problem as the FP8 variant poses it (`p`): its paged decode
    kernel for a handful of queries, its prefill kernel above, as a plan, or the row saying
    why it cannot run."""
    from workbench.peers import deepgemm_indexer as peer

    untimed = {"kernel": "indexer", "variant": "deepgemm", "scenario": sc.name,
               "m": sc.queries, "context": sc.context}  # fmt: skip
    ok, why = peer.available()
    if not ok:
        return untimed | {"status": "missing-peer", "note": why}
    prepare = peer.prepare_decode if sc.queries <= DECODE_QUERIES else peer.prepare_prefill
    try:
        call = prepare(p.index_q, p.index_w, p.cached_keys, p.pos)
    except Exception as err:  # noqa: BLE001 (a peer that fails to build is a row, not a crash)
        status = f"error: {type(err).__name__}: {str(err)[:120]}"
        return untimed | {"status": status, "note": peer.PEER_NOTE}
    planned = _plan("indexer", "deepgemm", call, p.scores_ref, _scores_error, None, sc, p, s, ctx)
    return replace(planned, row=planned.row | {"note": peer.PEER_NOTE})


def _plan(kernel, name, call: Callable, ref, error, fidelity, sc, p, s, ctx) -> RowPlan:
    """One row's plan: a kernel of one variant in one scenario, checked against its reference
    (and its fidelity measures), then timed and judged against its floor."""
    facts: list[dict] = []

    def check() -> dict:
        out = call_with_facts(call, facts)
        row = {"rel_error": error(out, ref), **compile_facts(facts)}
        return row | (fidelity(out) if fidelity else {})

    def judge(row: dict) -> dict:
        nbytes, flops = cost(kernel, sc, p, s, ctx["key_format"])
        floor = floor_ms(nbytes, flops, ctx["ceilings"])
        return {
            "floor_ms": floor,
            "ratio_to_floor": row["ms"] / floor,
            "tflops": sum(flops.values()) / (row["ms"] / 1e3) / 1e12,
        }

    row = {"kernel": kernel, "variant": name, "scenario": sc.name, "m": sc.queries,
           "context": sc.context}  # fmt: skip
    return RowPlan(row, check, tolerance("attention", "bf16"), Launch(call, sc.queries), judge)


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
    peers: Sequence[str] = PEERS,
    **shape_overrides: int,
) -> pd.DataFrame:
    """Benchmark every attention variant x kernel in every scenario."""
    unknown = sorted(set(variants) - set(attention.VARIANTS)) + sorted(set(kernels) - set(KERNELS))
    unknown += sorted(set(peers) - set(PEERS))
    if unknown:
        raise WorkbenchError(
            f"unknown attention variants, kernels or peers {unknown}; variants: "
            f"{', '.join(attention.VARIANTS)}; kernels: {', '.join(KERNELS)}; peers: "
            f"{', '.join(PEERS)}"
        )
    setup = bench_setup(preset, device, seed, ceilings, shape_overrides)
    dev, s, dtype = setup.device, setup.shapes, setup.dtype
    ctx = {"device": dev, "ceilings": setup.ceilings}
    rows = []
    indexer_peers = list(peers) if "indexer" in kernels else []
    total = len(scenarios) * (len(variants) * len(kernels) + len(indexer_peers))
    with tqdm(total=total, desc="bench attention", disable=not progress) as bar:
        for sc in scenarios:
            problem = Problem.draw(sc, s, dtype, dev, seed)
            plans: list[RowPlan] = []
            for name in variants:
                variant = attention.VARIANTS[name]
                posed = problem.with_keys(variant, s.index_topk, s.window)
                calls = _calls(variant, posed, s)
                context = ctx | {"key_format": variant.key_format}
                plans += [_plan(k, name, *calls[k], sc, posed, s, context) for k in kernels]
            unrun = []
            if indexer_peers:  # posed as the FP8 variant poses it: FP8 keys, their reference
                posed = problem.with_keys(attention.VARIANTS["fp8"], s.index_topk, s.window)
                peer = _peer_plan(sc, posed, s, ctx | {"key_format": "fp8"})
                (plans if isinstance(peer, RowPlan) else unrun).append(peer)
            for row in check_then_time(plans, dev) + unrun:
                rows.append(row)
                print_row(bar, row, PRINTED)
    params = {"scenarios": [asdict(sc) for sc in scenarios], "variants": list(variants),
              "kernels": list(kernels), "peers": list(peers), "preset": preset, "seed": seed,
              "device": device, "shape_overrides": shape_overrides}  # fmt: skip
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    return save_bench("attention", setup, out, params, table, rows)
