"""The ncu target's workloads: one marked launch per token count of a MoE scheduler, a dense
backend, or every kernel of one decode step of the synthetic model.

Inputs come from the one workload contract (`workbench.workloads`), so a report of
"stock, T=6" profiles exactly the launch that `bench` and `sweep` time.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import fields
from functools import partial

import torch

from kernels.moe import FORMATS, VARIANTS, moe_reference
from workbench.analysis.ncu_files import DECODE_STEP
from workbench.capture.ncu_args import DECODE_DEFAULTS, Mark, TargetArgs, Workload, range_name
from workbench.capture.ncu_workload_parts import (
    DEFAULT_PROJECTION,
    check_output,
    dense_projection,
    device_for,
    marked,
)
from workbench.errors import WorkbenchError
from workbench.presets import get_preset
from workbench.workloads.checks import moe_check_key, relative_error, tolerance
from workbench.workloads.model import Plan, SyntheticModel
from workbench.workloads.moe import expert_weights, moe_problem, reference
from workbench.workloads.seeds import serving_dtype


# ---- shared pieces -------------------------------------------------------------------------
def _peer_workloads(args: TargetArgs) -> list[Workload] | None:
    """A peer's workloads when `args.variant` names one of its kernel's peers, else None.

    The peers are imported here, not with the module: `workbench ncu --code BASE` runs this
    target on an older kernels package, which the peers' adapters may need more of."""
    try:
        from workbench.capture.ncu_peers import build_dense_peer, build_moe_peer
        from workbench.peers import peer_of
    except ImportError:  # an older kernels package: then no variant of its is a peer
        return None
    peer = peer_of(args.kernel, args.variant)
    if peer is None:
        return None
    return (build_moe_peer if args.kernel == "moe" else build_dense_peer)(args, peer)


def _variant(table: dict[str, Callable], kind: str, name: str) -> Callable:
    if name not in table:
        from workbench.peers import peer_names

        peers = ", ".join(peer_names(kind))
        raise WorkbenchError(f"unknown {kind} variant '{name}'; known: {', '.join(table)}"
                             + (f"; peers: {peers}" if peers else ""))  # fmt: skip
    return table[name]


def _keyword_params(fn: Callable, params: dict[str, object], label: str) -> dict[str, object]:
    """Check `params` against the keyword-only parameters of variant `fn` (any, for **kwargs)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return params
    known = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise WorkbenchError(
            f"{label} takes no parameter {', '.join(unknown)}; its parameters: "
            f"{', '.join(known) or 'none'}."
        )
    return params


# ---- --kernel moe --------------------------------------------------------------------------
def build_moe(args: TargetArgs) -> list[Workload]:
    """One launch of `kernels.moe.VARIANTS[variant]` per token count, routed experts only.

    `fmt` (bf16, fp8 or int4) and `block` choose the weight format (MoeWeights.quantize); the
    reference then runs on the dequantised weights, so the check isolates the kernel (and, for
    the W8A8 variants, the rounding of their FP8 activations). A MoE peer's layer instead
    (`ncu_peers`), when `variant` names one.
    """
    if args.variant not in VARIANTS and (workloads := _peer_workloads(args)) is not None:
        return workloads
    fn = _variant(VARIANTS, "moe", args.variant)
    options = dict(args.params)
    fmt, block = str(options.pop("fmt", "bf16")), options.pop("block", None)
    if fmt not in FORMATS:
        raise WorkbenchError(f"unknown weight format fmt={fmt}; known: {', '.join(FORMATS)}")
    # the W8A8 variants quantise x and h too: checked against the bf16-activation reference
    # at W8A8's bound, as the bench checks them
    scheme = moe_check_key(args.variant, fmt)
    params = _keyword_params(fn, options, f"moe variant '{args.variant}'")
    device = device_for(args.device)
    dtype = serving_dtype(device)
    shapes = get_preset(args.preset).rank_shapes()
    quantize_args = {} if block is None else {"block": int(block)}
    weights = expert_weights(shapes, fmt, args.seed, device, dtype, **quantize_args)
    workloads = []
    for tokens in args.tokens:
        problem = moe_problem(shapes, tokens, args.routing, args.seed, device, dtype)
        call = partial(fn, *problem.args(), weights, **params)
        name = range_name("moe", args.variant, tokens)
        check = partial(check_output, call, partial(reference, problem, weights), name,
                        tolerance("moe", scheme), "tests/test_moe_stock.py")  # fmt: skip
        workloads.append(Workload(name, check, call, marked(call, name)))
    return workloads


# ---- --kernel dense --------------------------------------------------------------------------
def build_dense(args: TargetArgs) -> list[Workload]:
    """One launch of `kernels.dense.VARIANTS[variant]` per token count M, on one projection of a
    layer: `projection` (default `o_b`, the output projection's second half, 5120 x 4096); FP8
    variants get its weight quantised with `block` (32). A dense peer's linear instead
    (`ncu_peers`), when `variant` names one."""
    import kernels.dense as dense
    from kernels.dense.formats import check_block
    from kernels.dense.tiles import GemmTiles
    from workbench.workloads.dense import activations, projection_master

    if args.variant not in dense.VARIANTS and (workloads := _peer_workloads(args)) is not None:
        return workloads
    fn = _variant(dense.VARIANTS, "dense", args.variant)
    options = dict(args.params)
    chosen = str(options.pop("projection", DEFAULT_PROJECTION))
    block = int(options.pop("block", dense.DEFAULT_BLOCK))
    p = dense_projection(args.preset, chosen)
    tiles = {f.name for f in fields(GemmTiles)}
    gluon_w8a8 = {"ring_scales", "wide_tiles", "staged_weight_scales"}  # the wgmma kernel's
    allowed = {"bf16": set(), "w8a16": tiles, "w8a8": (tiles - {"swap_ab"}) | gluon_w8a8,
               "hybrid": {"hybrid_m"}}  # fmt: skip
    unknown = ", ".join(sorted(set(options) - allowed.get(args.variant, set())))
    if unknown:
        names = "".join(", " + a for a in sorted(allowed.get(args.variant, ())))
        raise WorkbenchError(
            f"dense variant '{args.variant}' has no parameter {unknown}; its parameters: "
            f"projection, block{names}."
        )
    try:  # bad values fail here with the kernels' own messages, before ncu starts
        check_block(block)
        if args.variant in ("w8a16", "w8a8"):
            tile_options = {k: v for k, v in options.items() if k in tiles}
            GemmTiles(16, 64, 64, 4, 3).override(**tile_options).check()
    except ValueError as err:
        raise WorkbenchError(f"dense variant '{args.variant}': {err}") from None
    device = device_for(args.device)
    master = projection_master(p, args.seed, device, torch.bfloat16)
    fp8 = dense.WEIGHT_FORMAT[args.variant] == "fp8"
    weight = dense.DenseWeights.quantize(master, "fp8", block) if fp8 else master
    reference = dense.w8a8_reference if args.variant == "w8a8" else dense.linear_reference
    workloads = []
    for tokens in args.tokens:
        x = activations(tokens, [p.k], args.seed, device, torch.bfloat16)[p.k]
        call = partial(fn, x, weight, **options)
        name = range_name("dense", args.variant, tokens)
        check = partial(check_output, call, partial(reference, x, weight), name,
                        tolerance("dense", args.variant),
                        "tests/test_dense_kernels.py")  # fmt: skip
        workloads.append(Workload(name, check, call, marked(call, name)))
    return workloads


# ---- --kernel attention ----------------------------------------------------------------------
ATTENTION_PARTS = ("indexer", "select", "indexer_select", "attend")


def build_attention(args: TargetArgs) -> list[Workload]:
    """One call of a sparse-attention variant's `part` (indexer, select, both as the variant
    chains them, or attend) per query
    count, the last query at position `context - 1` (46,000): the bench's scenarios, on the
    same inputs (`workloads.attention.Problem`), checked against the variant's reference."""
    import kernels.attention as attention
    from workbench.workloads.attention import Problem, Scenario

    variant = _variant(attention.VARIANTS, "attention", args.variant)
    options = dict(args.params)
    part, context = str(options.pop("part", "indexer")), int(options.pop("context", 46_000))
    if part not in ATTENTION_PARTS or options:
        raise WorkbenchError(
            f"attention takes part ({', '.join(ATTENTION_PARTS)}) and context; got "
            f"part={part} and {', '.join(options) or 'nothing else'}."
        )
    device, s = device_for(args.device), get_preset(args.preset).rank_shapes()
    workloads = []
    for queries in args.tokens:
        if not 1 <= queries <= context:
            raise WorkbenchError(f"{queries} queries do not fit a context of {context}.")
        p = Problem.draw(Scenario(part, queries, context), s, serving_dtype(device), device,
                         args.seed).with_keys(variant, s.index_topk, s.window)  # fmt: skip
        call, reference, measure = {
            "indexer": (partial(variant.indexer_scores, p.index_q, p.index_w, p.cached_keys,
                                p.pos), p.scores_ref, "finite"),
            "select": (partial(variant.select_positions, p.scores_ref, p.pos, s.index_topk,
                               s.window), None, "selection"),
            "indexer_select": (partial(variant.choose, p.index_q, p.index_w, p.cached_keys,
                                       p.pos, None, s.index_topk, s.window), None, "selection"),
            "attend": (partial(variant.attend, p.q, p.kv, p.index), p.out_ref, "values"),
        }[part]  # fmt: skip
        name = range_name("attention", args.variant, queries)  # the file name has the part
        check = partial(_check_attention, call, reference, measure, p, s.window, name)
        workloads.append(Workload(name, check, call, marked(call, name)))
    return workloads


def _check_attention(call, reference, measure: str, p, window: int, name: str) -> None:
    from workbench.capture.bench_attention import selection_ok

    out = call()
    if measure == "selection":
        if not selection_ok(out, p, window):
            raise WorkbenchError(f"{name}: a wrong selection is not profiled.")
        return
    finite = torch.isfinite(reference)
    error = relative_error(out[finite], reference[finite])
    if not error <= tolerance("attention", "bf16"):
        raise WorkbenchError(
            f"{name}: output differs from its reference (relative error {error:.3g}); a wrong "
            "kernel is not profiled. Reproduce with tests/test_attention_kernels.py."
        )


# ---- --kernel model-decode-step --------------------------------------------------------------
class _MarkedModel(SyntheticModel):
    """The synthetic model, with chosen structural steps (e.g. `wb.decode#1`) run inside a mark.

    The model runs every step inside its structural scope `step_scope(name)`; wrapping that scope is
    how one decode step, and nothing of the prefill around it, lands in an NVTX range.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.marks: dict[str, Callable[[], AbstractContextManager]] = {}

    @contextmanager
    def step_scope(self, name: str, sync: bool = True) -> Iterator[None]:
        with super().step_scope(name, sync), self.marks.get(name, nullcontext)():
            yield


def _decode_options(params: dict[str, object]) -> dict[str, object]:
    unknown = sorted(set(params) - set(DECODE_DEFAULTS))
    if unknown:
        raise WorkbenchError(
            f"{DECODE_STEP} takes no parameter {', '.join(unknown)}; its parameters: "
            f"{', '.join(DECODE_DEFAULTS)}."
        )
    return {**DECODE_DEFAULTS, **params}


def _decode_workload(model: _MarkedModel, streams: int, opts: dict, args: TargetArgs) -> Workload:
    """Prefill, one warm-up decode step, then decode step 1 inside the range (one model.run)."""
    plan = Plan(opts["prompt_tokens"], 2, streams, opts["prefill_chunk"])
    inputs = model.inputs(plan)
    name = range_name(DECODE_STEP, args.variant, streams)

    def run(mark: Mark) -> None:
        model.marks = {"wb.decode#1": partial(mark, name)}
        try:
            model.run(plan, inputs)
        finally:
            model.marks = {}

    # The step's MoE is the kernel under test: check it at this batch on layer 0's experts.
    experts = model.weights[0]
    problem = moe_problem(model.shapes, streams, args.routing, args.seed, model.device,
                          model.dtype)  # fmt: skip
    args_ = (*problem.args(), experts.experts_gate_up, experts.experts_down)
    check = partial(
        check_output, partial(model.moe_fn, *args_), partial(moe_reference, *args_), name,
        tolerance("moe", "bf16"), "tests/test_moe_stock.py",
    )  # fmt: skip
    return Workload(name, check, lambda: None, run)  # run() warms up before the marked step


def build_decode_step(args: TargetArgs) -> list[Workload]:
    """Every kernel of one decode step of the synthetic model, per number of streams."""
    opts = _decode_options(args.params)
    model = _MarkedModel(
        get_preset(args.preset),
        moe=args.variant,
        dense=str(opts["dense"]),
        attention=str(opts["attention"]),
        routing=args.routing,
        seed=args.seed,
        device=device_for(args.device),
        layers=int(opts["layers"]),
    )
    return [_decode_workload(model, streams, opts, args) for streams in args.tokens]


BUILDERS: dict[str, Callable[[TargetArgs], list[Workload]]] = {
    "moe": build_moe,
    "dense": build_dense,
    "attention": build_attention,
    DECODE_STEP: build_decode_step,
}
