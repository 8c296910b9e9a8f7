"""The peers' side of `workbench bench dense` and `bench moe`: their weights, converted once,
and the rows of the peers that cannot run.

Peers take DeepSeek's layout, FP8 E4M3 with one fp32 scale per 128x128 block, whatever block
the workbench's own FP8 rows use (`--block`): the same bf16 masters through the same quantiser
(`DenseWeights.quantize`, `MoeWeights.quantize`), so every peer starts from the numbers the
workbench's FP8 kernels would hold at block 128, and is checked against the fp32 reference on
exactly those dequantised weights. Conversion (layout, scales, JIT compilation) happens here,
before any row is timed. A peer that is not available, or whose conversion fails, becomes one
row per size (`missing-peer`, or the error) with the reason in `note`, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernels.dense import DenseWeights
from workbench.peers import PEER_BLOCK, Peer
from workbench.workloads.dense import Layer

PEER_REF = "peer"  # the references' key of the fp32 outputs on the peers' weights


@dataclass(frozen=True)
class Prepared:
    """A peer ready to time: what its conversion built (dense: its linear(x) for each weight of
    each layer copy; MoE: its moe(x, ids, route))."""

    peer: Peer
    converted: Any


@dataclass
class PeerRun:
    """The peers of one benchmark: those prepared, the others' rows-to-be (name -> variant,
    status, note), the weights they were converted from (empty when none was) and, per peer,
    what `available()` said, for the run's metadata."""

    prepared: list[Prepared] = field(default_factory=list)
    unrun: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    weights: Any = None
    meta: dict[str, dict] = field(default_factory=dict)


def peer_weights(layer: Layer) -> list[list[DenseWeights]]:
    """Every copy of the layer's weights as FP8 in the peers' 128x128 blocks (the layer's own
    FP8 when it already uses that block)."""
    if layer.fp8[0][0].block == PEER_BLOCK:
        return layer.fp8
    return [[DenseWeights.quantize(w, "fp8", PEER_BLOCK) for w in ws] for ws in layer.masters]


def dense_conversion(prepare: Callable, weights: list[list[DenseWeights]]) -> list[list]:
    """A dense peer's linear(x) for every weight of every layer copy."""
    return [[prepare(w) for w in ws] for ws in weights]


def prepare_peers(
    peers: list[Peer],
    workload: str,
    weights: Callable[[], Any],
    convert: Callable[[Callable, Any], Any] = lambda prepare, w: prepare(w),
) -> PeerRun:
    """Ask each peer whether it can run `workload`; convert, with `convert(adapter, w)`, the
    peers' weights `w = weights()` (built once, only if some peer runs) for those that can."""
    run = PeerRun()
    for peer in peers:
        ok, why = peer.available()
        variant = peer.variant_for(workload)
        run.meta[peer.name] = {"available": ok, "why": why, "variant": variant}
        adapter = peer.adapter(workload)
        if not ok or adapter is None:
            run.unrun[peer.name] = (variant, "missing-peer", why)
            continue
        run.weights = weights() if run.weights is None else run.weights
        try:
            converted = convert(adapter, run.weights)
        except Exception as err:  # noqa: BLE001 (a peer that fails to convert is a row too)
            failure = f"{type(err).__name__}: {err}"
            run.unrun[peer.name] = (variant, f"error: {failure[:120]}", failure)
            run.meta[peer.name]["error"] = failure
            continue
        run.prepared.append(Prepared(peer, converted))
    if not run.prepared:
        run.weights = None
    return run


def unrun_rows(run: PeerRun, size: int, column: str = "m") -> list[dict]:
    """The rows at `size` tokens (in `column`) of the peers that do not run: status and
    reason, nothing timed."""
    scenario = {"scenario": f"m={size}"} if column == "m" else {}
    return [
        {"kernel": name, "variant": variant, **scenario, column: size, "status": status,
         "note": note}
        for name, (variant, status, note) in run.unrun.items()
    ]  # fmt: skip
