"""Peers: other projects' kernels, timed beside the workbench's on the same workload.

A kernel engineer's first question is "against what does a serving engine run?", so each peer
is an adapter with one contract (docs/design.md, "Peers and formats"; docs/peers.md):

- `available() -> (bool, why)`: whether it can run here, and if not exactly what is missing
  and how to get it, so an absent peer becomes a `missing-peer` row, never an exception;
- `prepare(weights) -> linear`: a one-time conversion of the workbench's FP8 `DenseWeights`
  (E4M3 values, fp32 scales per 128x128 block, DeepSeek's layout) into the peer's layout and
  scales, with any JIT compilation done here, outside the timed region;
- `linear(x) -> y`: y = x @ W.T in bf16 for x (M, K) in bf16, what the workbench's
  `linear(x, w)` computes, with whatever a server runs around the GEMM (an activation
  quantiser) inside the call;
- for a MoE peer, `prepare_moe(experts) -> moe`: the same one-time conversion of the
  workbench's FP8 `MoeWeights` (E4M3, fp32 scales per 128x128 block), and `moe(x, ids, route)
  -> y`, the routed experts' output as `kernels.moe.moe_reference` computes it, with whatever
  glue the peer does not do itself (sorting, SiLU, combine) inside the call, named in `variant`;
- for a dense peer that computes with other numbers than the FP8 it is handed (it requantises
  them, e.g. to INT4), `holds(weights)`: the weight it multiplies by (a `DenseWeights` or an
  fp32 (N, K) tensor), which its check is made against, and `weight_bytes(weights)`: the
  bytes its GEMM reads for one weight, for its roofline floor.

PEERS lists them by the names bench rows use in their `kernel` column. A placeholder is a peer
with no `prepare`: it only says what would make it work, and never stands in for the peer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from kernels.dense import DenseWeights
from kernels.moe import MoeWeights
from workbench.errors import WorkbenchError
from workbench.peers import (
    cublas_fp8,
    deepgemm,
    humming_kernels,
    humming_moe,
    humming_w4a16,
    placeholders,
)

PEER_BLOCK = 128  # the weight block every peer takes: DeepSeek's 128x128 checkpoints

Linear = Callable[[Tensor], Tensor]
MoeCall = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Peer:
    """One peer: its row name, the workloads it serves, what it is (the rows' `variant`, and
    `moe_variant` for its MoE rows), the workbench scheme it computes ("w8a8", "w8a16" or
    "w4a16": its check's tolerance and the tensor-core rate of its roofline follow), and its
    adapter: a dense `prepare`, a MoE `prepare_moe`, neither for a placeholder. A dense peer
    that requantises what it is handed says what it then holds (`holds`, checked against) and
    how many bytes that is (`weight_bytes`); None: the handed weights, as they are."""

    name: str
    workloads: tuple[str, ...]
    variant: str
    scheme: str
    available: Callable[[], tuple[bool, str]]
    prepare: Callable[[DenseWeights], Linear] | None = None
    prepare_moe: Callable[[MoeWeights], MoeCall] | None = None
    moe_variant: str = ""
    holds: Callable[[DenseWeights], DenseWeights | Tensor] | None = None
    weight_bytes: Callable[[DenseWeights], int] | None = None

    def variant_for(self, workload: str) -> str:
        """What the peer runs for `workload` ("dense" or "moe"), as its rows' `variant` say."""
        return self.moe_variant if workload == "moe" else self.variant

    def adapter(self, workload: str) -> Callable | None:
        """The conversion for `workload` ("dense" or "moe"); None when the peer has none."""
        return self.prepare if workload == "dense" else self.prepare_moe


PEERS: dict[str, Peer] = {
    "cublas_fp8": Peer(
        "cublas_fp8", ("dense",), "w8a8-block128", "w8a8",
        cublas_fp8.available, cublas_fp8.prepare,
    ),
    "humming": Peer(
        "humming", ("dense", "moe"), "w8a16-block128", "w8a16",
        humming_kernels.available, humming_kernels.prepare, humming_moe.prepare,
        humming_moe.VARIANT,
    ),
    "humming_w4a16": Peer(
        "humming_w4a16", ("dense",), humming_w4a16.VARIANT, "w4a16",
        humming_w4a16.available, humming_w4a16.prepare,
        holds=humming_w4a16.holds, weight_bytes=humming_w4a16.weight_bytes,
    ),
    "deepgemm": Peer(
        "deepgemm", ("dense", "moe"), "w8a8-block128", "w8a8", deepgemm.available,
        deepgemm.prepare, deepgemm.prepare_moe, "w8a8-block128 masked/contiguous + torch glue",
    ),
    "marlin": Peer("marlin", ("dense", "moe"), "w8a16-block128", "w8a16", placeholders.marlin),
    "vllm_fused_moe": Peer(
        "vllm_fused_moe", ("moe",), "w8a8-block128", "w8a8", placeholders.vllm_fused_moe
    ),
}  # fmt: skip


def peer_names(workload: str) -> list[str]:
    """The registered peers of `workload` ("dense" or "moe"), in registry order."""
    return [name for name, peer in PEERS.items() if workload in peer.workloads]


def peer_of(workload: str, name: str) -> Peer | None:
    """The registered peer of `workload` called `name`, else None."""
    return PEERS[name] if name in peer_names(workload) else None


def get_peers(names: list[str] | tuple[str, ...], workload: str) -> list[Peer]:
    """The peers called `names`, each checked to exist and to serve `workload`."""
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise WorkbenchError(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    wrong = [n for n in names if workload not in PEERS[n].workloads]
    if wrong:
        raise WorkbenchError(
            f"peers {wrong} do not run the {workload} workload; {workload} peers: "
            f"{', '.join(peer_names(workload))}"
        )
    return [PEERS[n] for n in names]
