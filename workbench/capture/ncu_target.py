"""The program that `ncu` relaunches: build inputs, check, warm up, then one marked launch each.

ncu 2025.3 cannot attach to a running process, so `workbench.capture.ncu` starts this module
under `ncu` in a subprocess (as tritonbench does):

    python -m workbench.capture.ncu_target --kernel moe --variant stock --tokens 6 4096

For every token count it builds the inputs at one rank's shapes (preset `dsv4-flash-tp2`),
checks the variant against its torch reference (a wrong kernel is never profiled: exit status 2
and a message), warms up (Triton compiles), and only then runs exactly one launch of the variant
inside an NVTX push/pop range named by `range_name`, e.g. `wb:moe:stock:T=6`.

NVTX: the ranges are torch.cuda.nvtx push/pop ranges, so the GPU machine needs no `nvtx`
package; torch has no domain API, so they sit in NVTX's default domain (not a workbench domain).
ncu selects one with `--nvtx --nvtx-include "wb:moe:stock:T=6/"`: in ncu's filter syntax a
trailing `/` marks a push/pop range of the default domain (the bare name would mean a start/end
range), and several `--nvtx-include` options select any of their ranges. Range names therefore
avoid ncu's filter quantifiers `@ , [ ] / * +` (the `\\` escape is not worth the risk).

Kernels are registered in BUILDERS (moe, dense, model-decode-step): a builder turns the parsed
arguments into Workloads. Imports torch, the kernels and the model only: no plotly
and no nvtx package, which the GPU machine lacks.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from functools import partial

import torch

from kernels.moe import FORMATS, VARIANTS, MoeWeights, moe_reference
from workbench.analysis.ncu_files import DECODE_STEP
from workbench.errors import WorkbenchError
from workbench.model import Plan, SyntheticModel
from workbench.presets import ROUTINGS, RankShapes, draw_routing, get_preset

PREFIX = "wb-ncu-target:"  # capture.ncu finds this program's own lines in ncu's output by it
DONE = f"{PREFIX} done"
DEFAULT_PRESET = "dsv4-flash-tp2"
FILTER_QUANTIFIERS = frozenset("@,[]/*+\\")
TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 1e-4}  # relative error, as tests/test_moe_stock
DECODE_DEFAULTS = {
    "layers": 4,  # of 40: enough for a representative step, short under ncu's replays
    "prompt_tokens": 2048,
    "prefill_chunk": 4096,
    "dense": "bf16",
    "attention": "torch",
}

Mark = Callable[[str], AbstractContextManager]  # range name -> context manager around a launch


def range_name(kernel: str, variant: str, tokens: int) -> str:
    """The NVTX range around one profiled launch; it labels the launch in the report too."""
    name = f"wb:{kernel}:{variant}:T={tokens}"
    bad = sorted(FILTER_QUANTIFIERS & set(name))
    if bad:
        raise WorkbenchError(
            f"'{name}' contains {' '.join(bad)}, which ncu's NVTX filter reads as syntax; "
            "rename the kernel or variant without these characters."
        )
    return name


def nvtx_filter(name: str) -> str:
    """ncu's `--nvtx-include` value for push/pop range `name` of the default domain."""
    return f"{name}/"


@dataclass(frozen=True)
class TargetArgs:
    """What to profile: kernel family, variant, token counts and the variant's parameters."""

    kernel: str
    variant: str
    tokens: tuple[int, ...]
    params: dict[str, object] = field(default_factory=dict)
    routing: str = "uniform"
    seed: int = 0
    preset: str = DEFAULT_PRESET
    device: str = "cuda"

    def validate(self) -> None:
        """Reject bad arguments before anything heavy (or ncu) starts."""
        if self.kernel not in BUILDERS:
            raise WorkbenchError(
                f"unknown kernel '{self.kernel}'; known kernels: {', '.join(BUILDERS)}"
            )
        if not self.tokens or min(self.tokens) < 1:
            raise WorkbenchError(f"tokens={list(self.tokens)}: give one or more counts >= 1.")
        if self.routing not in ROUTINGS:
            raise WorkbenchError(f"unknown routing '{self.routing}'; known: {', '.join(ROUTINGS)}")
        self.range_names()

    def range_names(self) -> list[str]:
        return [range_name(self.kernel, self.variant, t) for t in self.tokens]

    def to_argv(self) -> list[str]:
        """The command-line arguments that `parse_args` turns back into these arguments."""
        argv = ["--kernel", self.kernel, "--variant", self.variant]
        argv += ["--tokens", *map(str, self.tokens), "--routing", self.routing]
        argv += ["--seed", str(self.seed)]
        if self.preset != DEFAULT_PRESET:
            argv += ["--preset", self.preset]
        if self.device != "cuda":
            argv += ["--device", self.device]
        for key, value in self.params.items():
            argv += ["--param", f"{key}={value}"]
        return argv


@dataclass(frozen=True)
class Workload:
    """One profiled launch: `check` raises if its output is wrong, `warmup` compiles, and
    `run(mark)` performs the launch with `mark(name)` around exactly the part to profile."""

    name: str
    check: Callable[[], None]
    warmup: Callable[[], None]
    run: Callable[[Mark], None]


# ---- arguments -------------------------------------------------------------------------------
def parse_value(text: str) -> object:
    """`--param` values: int, float, true/false, none, else the string itself."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def _param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"'{text}' is not key=value (e.g. block_m=32)")
    return key, parse_value(value)


def parse_args(argv: Sequence[str] | None = None) -> TargetArgs:
    p = argparse.ArgumentParser(
        prog="python -m workbench.capture.ncu_target",
        description="Check, warm up, then launch a kernel once per token count inside an NVTX "
        "range, for ncu to profile (see workbench.capture.ncu).",
    )
    p.add_argument("--kernel", required=True, choices=sorted(BUILDERS))
    p.add_argument("--variant", required=True, help="e.g. stock (kernels.moe.VARIANTS)")
    p.add_argument("--tokens", required=True, nargs="+", type=int, help="token counts")
    p.add_argument("--param", action="append", type=_param, default=[], metavar="KEY=VALUE")
    p.add_argument("--routing", default="uniform", choices=ROUTINGS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default=DEFAULT_PRESET, help="shapes (one rank's)")
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    return TargetArgs(
        a.kernel, a.variant, tuple(a.tokens), dict(a.param), a.routing, a.seed, a.preset, a.device
    )


# ---- shared pieces -------------------------------------------------------------------------
def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise WorkbenchError(
            "no CUDA GPU is visible (torch.cuda.is_available() is False); ncu captures run on "
            "the GPU machine."
        )
    return device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _variant(table: dict[str, Callable], kind: str, name: str) -> Callable:
    if name not in table:
        raise WorkbenchError(f"unknown {kind} variant '{name}'; known: {', '.join(table)}")
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


def _check_output(
    call: Callable[[], torch.Tensor], reference: Callable, label: str, tolerance: float, hint: str
) -> None:
    """Raise unless `call()` matches `reference()` to `tolerance` (relative error)."""
    out, ref = call(), reference()
    diff = (out.double() - ref.double()).norm().item()
    scale = ref.double().norm().item()
    error = diff / scale if scale else float("inf")
    if not error <= tolerance:  # also catches NaN
        raise WorkbenchError(
            f"{label}: output differs from its reference (relative error {error:.3g}, tolerance "
            f"{tolerance:g}); a wrong kernel is not profiled. Reproduce at small shapes with "
            f"{hint}."
        )


def _marked(call: Callable[[], object], name: str) -> Callable[[Mark], None]:
    def run(mark: Mark) -> None:
        with mark(name):
            call()

    return run


# ---- --kernel moe --------------------------------------------------------------------------
def _expert_weights(s: RankShapes, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    """Routed-expert weights (E, 2I, H) and (E, H, I) in bf16, scaled by fan-in."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shapes = (
        (s.experts, 2 * s.expert_intermediate, s.hidden),
        (s.experts, s.hidden, s.expert_intermediate),
    )
    return tuple(
        torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16).mul_(
            shape[-1] ** -0.5
        )
        for shape in shapes
    )


def _moe_problem(s: RankShapes, tokens: int, args: TargetArgs, device: torch.device) -> tuple:
    gen = torch.Generator(device=device).manual_seed(args.seed + tokens)
    x = torch.randn(tokens, s.hidden, generator=gen, device=device, dtype=torch.bfloat16)
    ids, weights = draw_routing(tokens, s.experts, s.top_k, args.routing, args.seed)
    return x, torch.from_numpy(ids).to(device), torch.from_numpy(weights).to(device)


def build_moe(args: TargetArgs) -> list[Workload]:
    """One launch of `kernels.moe.VARIANTS[variant]` per token count, routed experts only.

    `fmt` (bf16, fp8 or int4) and `block` choose the weight format (MoeWeights.quantize); the
    reference then runs on the dequantised weights, so the check isolates the kernel.
    """
    fn = _variant(VARIANTS, "moe", args.variant)
    options = dict(args.params)
    fmt, block = str(options.pop("fmt", "bf16")), options.pop("block", None)
    if fmt not in FORMATS:
        raise WorkbenchError(f"unknown weight format fmt={fmt}; known: {', '.join(FORMATS)}")
    params = _keyword_params(fn, options, f"moe variant '{args.variant}'")
    device = _device(args.device)
    shapes = get_preset(args.preset).rank_shapes()
    w_gate_up, w_down = _expert_weights(shapes, device, args.seed)
    quantize_args = {} if block is None else {"block": int(block)}
    weights = MoeWeights.quantize(w_gate_up, w_down, fmt, **quantize_args)
    del w_gate_up, w_down
    workloads = []
    for tokens in args.tokens:
        problem = (*_moe_problem(shapes, tokens, args, device), weights)
        call = partial(fn, *problem, **params)
        name = range_name("moe", args.variant, tokens)
        check = partial(_check_output, call, partial(moe_reference, *problem), name,
                        TOLERANCE[torch.bfloat16], "tests/test_moe_stock.py")  # fmt: skip
        workloads.append(Workload(name, check, call, _marked(call, name)))
    return workloads


# ---- --kernel dense --------------------------------------------------------------------------
def build_dense(args: TargetArgs) -> list[Workload]:
    """One launch of `kernels.dense.VARIANTS[variant]` per token count M, on one projection of a
    layer: `projection` (default `o_b`, the output projection's second half, 5120 x 4096); FP8
    variants get its weight quantised with `block` (32)."""
    import kernels.dense as dense
    from kernels.dense.formats import check_block
    from kernels.dense.tiles import GemmTiles
    from workbench.capture.bench_dense import TOLERANCE as DENSE_TOLERANCE
    from workbench.capture.bench_dense import layer_projections

    fn = _variant(dense.VARIANTS, "dense", args.variant)
    options = dict(args.params)
    chosen = str(options.pop("projection", "o_b"))
    block = int(options.pop("block", dense.DEFAULT_BLOCK))
    projections = {p.name: p for p in layer_projections(get_preset(args.preset).rank_shapes())}
    if chosen not in projections:
        raise WorkbenchError(
            f"unknown projection={chosen}; the layer's are {', '.join(projections)}."
        )
    tiles = {f.name for f in fields(GemmTiles)}
    allowed = {"bf16": set(), "w8a16": tiles, "w8a8": tiles - {"swap_ab"}, "hybrid": {"hybrid_m"}}
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
            GemmTiles(16, 64, 64, 4, 3).override(**options).check()
    except ValueError as err:
        raise WorkbenchError(f"dense variant '{args.variant}': {err}") from None
    p, device = projections[chosen], _device(args.device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    master = torch.randn(p.n, p.k, generator=gen, device=device, dtype=torch.bfloat16)
    master *= p.k**-0.5
    fp8 = dense.WEIGHT_FORMAT[args.variant] == "fp8"
    weight = dense.DenseWeights.quantize(master, "fp8", block) if fp8 else master
    reference = dense.w8a8_reference if args.variant == "w8a8" else dense.linear_reference
    workloads = []
    for tokens in args.tokens:
        x = torch.randn(tokens, p.k, generator=gen, device=device, dtype=torch.bfloat16)
        call = partial(fn, x, weight, **options)
        name = range_name("dense", args.variant, tokens)
        check = partial(_check_output, call, partial(reference, x, weight), name,
                        DENSE_TOLERANCE[args.variant], "tests/test_dense_kernels.py")  # fmt: skip
        workloads.append(Workload(name, check, call, _marked(call, name)))
    return workloads


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
    def step_scope(self, name: str) -> Iterator[None]:
        with super().step_scope(name), self.marks.get(name, nullcontext)():
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
    gen = torch.Generator(device=model.device).manual_seed(args.seed + streams)
    x = torch.randn(streams, model.shapes.hidden, generator=gen, device=model.device)
    ids, weights = draw_routing(
        streams, model.shapes.experts, model.shapes.top_k, args.routing, args.seed
    )
    problem = (
        x.to(model.dtype),
        torch.from_numpy(ids).to(model.device),
        torch.from_numpy(weights).to(model.device),
        experts.experts_gate_up,
        experts.experts_down,
    )
    check = partial(
        _check_output, partial(model.moe_fn, *problem), partial(moe_reference, *problem), name,
        TOLERANCE[model.dtype], "tests/test_moe_stock.py",
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
        device=_device(args.device),
        layers=int(opts["layers"]),
    )
    return [_decode_workload(model, streams, opts, args) for streams in args.tokens]


BUILDERS: dict[str, Callable[[TargetArgs], list[Workload]]] = {
    "moe": build_moe,
    "dense": build_dense,
    DECODE_STEP: build_decode_step,
}


# ---- the run ---------------------------------------------------------------------------------
def run_target(
    args: TargetArgs, mark: Mark = torch.cuda.nvtx.range, log: Callable[[str], None] = print
) -> list[str]:
    """Check every workload, warm all up, then run each once inside `mark`; return the names.

    Every check comes first, so a kernel wrong at any size fails before anything is profiled.
    """
    args.validate()
    device = _device(args.device)
    workloads = BUILDERS[args.kernel](args)
    for w in workloads:
        w.check()
        log(f"{PREFIX} {w.name} matches its reference")
    for w in workloads:
        w.warmup()
    _synchronize(device)
    for w in workloads:
        w.run(mark)
        _synchronize(device)
    return [w.name for w in workloads]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        names = run_target(args)
    except WorkbenchError as err:
        print(f"{PREFIX} error: {err}", file=sys.stderr, flush=True)
        return 2
    print(f"{DONE}: ran {', '.join(names)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
