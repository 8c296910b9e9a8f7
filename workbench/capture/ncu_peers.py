"""Peers as ncu targets: `workbench ncu dense deepgemm`, `workbench ncu moe humming`.

Why: a bench row says a peer is faster; only its Nsight Compute report says why (its tensor
pipe, its stalls, its tile grid), and a diff of that report against the workbench's kernel on
the same GEMM (`workbench ncu-report ours.ncu-rep --baseline theirs.ncu-rep --select REGEX`)
says what the workbench's kernel would need. So a peer is profiled on exactly what bench dense
and bench moe time it on: the same masters quantised to FP8 in DeepSeek's 128x128 blocks
(`workbench.peers.PEER_BLOCK`), converted once by the peer's own adapter (its JIT compilation
included), checked against the fp32 reference on the weights it holds at its scheme's
tolerance, and only then launched once per token count inside the NVTX range. What the peer's
call does around its GEMM (an activation quantiser, torch glue for a MoE layer) is inside the
range too, as it is inside the timed call; the report lists those launches by name.
"""

from __future__ import annotations

from functools import partial

from kernels.dense import DenseWeights, linear_reference
from workbench.capture.ncu_args import TargetArgs, Workload, range_name
from workbench.capture.ncu_workload_parts import (
    DEFAULT_PROJECTION,
    check_output,
    dense_projection,
    device_for,
    marked,
)
from workbench.errors import WorkbenchError
from workbench.peers import PEER_BLOCK, Peer, peer_of
from workbench.presets import get_preset
from workbench.workloads.checks import tolerance
from workbench.workloads.dense import activations, projection_master
from workbench.workloads.moe import expert_weights, moe_problem, reference
from workbench.workloads.seeds import serving_dtype

HINT = "the peer's tests (tests/test_peers*.py, WORKBENCH_GPU_TESTS=1)"


def peer_record(kernel: str, variant: str) -> dict | None:
    """What a capture's metadata says of a peer target: its name, what it runs and what
    `available()` said (the package and its version when it runs); None for the workbench's
    own kernels."""
    peer = peer_of(kernel, variant)
    if peer is None:
        return None
    ok, why = peer.available()
    return {"name": peer.name, "variant": peer.variant_for(kernel), "scheme": peer.scheme,
            "available": ok, "why": why}  # fmt: skip


def _options(peer: Peer, kernel: str, params: dict, taken: dict[str, object]) -> dict:
    """`params` with the ones a peer target takes (`taken`: name -> the only value a peer
    allows, or None for any) popped and checked; refuses any other."""
    options, chosen = dict(params), {}
    for name, only in taken.items():
        if name not in options:
            continue
        value = options.pop(name)
        if only is not None and str(value) != str(only):
            raise WorkbenchError(
                f"{kernel} peer '{peer.name}' runs {name}={only} only (the FP8 in DeepSeek's "
                f"{PEER_BLOCK}x{PEER_BLOCK} blocks that bench {kernel} gives every peer); drop "
                f"{name}={value}."
            )
        chosen[name] = value
    if options:
        raise WorkbenchError(
            f"{kernel} peer '{peer.name}' has no parameter {', '.join(sorted(options))}; its "
            f"parameters: {', '.join(taken)}."
        )
    return chosen


def _adapter(peer: Peer, kernel: str):
    """The peer's conversion for `kernel`, once it says it can run here."""
    adapter = peer.adapter(kernel)
    ok, why = peer.available()
    if adapter is None or not ok:
        raise WorkbenchError(f"{kernel} peer '{peer.name}' cannot run here: {why}")
    return adapter


def build_dense_peer(args: TargetArgs, peer: Peer) -> list[Workload]:
    """One call of the peer's linear(x) per M on one projection of a layer (`projection`,
    default o_b), its weight as bench dense hands it over."""
    chosen = _options(peer, "dense", args.params, {"projection": None, "block": PEER_BLOCK})
    p = dense_projection(args.preset, str(chosen.get("projection", DEFAULT_PROJECTION)))
    prepare = _adapter(peer, "dense")
    device = device_for(args.device)
    weight = DenseWeights.quantize(projection_master(p, args.seed, device, serving_dtype(device)),
                                   "fp8", PEER_BLOCK)  # fmt: skip
    linear = prepare(weight)  # converted and compiled once, as bench dense does
    held = weight if peer.holds is None else peer.holds(weight)
    workloads = []
    for tokens in args.tokens:
        x = activations(tokens, [p.k], args.seed, device, serving_dtype(device))[p.k]
        call = partial(linear, x)
        name = range_name("dense", peer.name, tokens)
        check = partial(check_output, call, partial(linear_reference, x, held), name,
                        tolerance("dense", peer.scheme), HINT)  # fmt: skip
        workloads.append(Workload(name, check, call, marked(call, name)))
    return workloads


def build_moe_peer(args: TargetArgs, peer: Peer) -> list[Workload]:
    """One call of the peer's MoE layer per token count at the rank's shapes, its experts as
    bench moe hands them over."""
    _options(peer, "moe", args.params, {"fmt": "fp8", "block": PEER_BLOCK})
    prepare = _adapter(peer, "moe")
    device = device_for(args.device)
    dtype = serving_dtype(device)
    shapes = get_preset(args.preset).rank_shapes()
    weights = expert_weights(shapes, "fp8", args.seed, device, dtype, block=PEER_BLOCK)
    moe = prepare(weights)
    workloads = []
    for tokens in args.tokens:
        problem = moe_problem(shapes, tokens, args.routing, args.seed, device, dtype)
        call = partial(moe, *problem.args())
        name = range_name("moe", peer.name, tokens)
        check = partial(check_output, call, partial(reference, problem, weights), name,
                        tolerance("moe", peer.scheme), HINT)  # fmt: skip
        workloads.append(Workload(name, check, call, marked(call, name)))
    return workloads
