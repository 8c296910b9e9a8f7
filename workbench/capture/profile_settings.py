"""What a profile's backend settings resolve to on the device, and which are refused.

Kept apart from the capture (`profile_run`) because the A/B harness checks its arms with the
same rules before any worker starts (`experiment_checks`): unset backends become the served
configuration on a GPU and the torch references on the CPU, a peer must serve its category and
be available here, and every other setting is refused with its name and the fix.
"""

from __future__ import annotations

from kernels.dense import hybrid_threshold
from kernels.moe import FORMATS as MOE_FORMATS
from workbench.errors import WorkbenchError
from workbench.peers import PEERS, peer_names
from workbench.workloads.model import SyntheticModel

# The seed's served configuration on a GPU (dense W8A16, the sparse attention as DeepSeek
# serves it: FP8 indexer keys, FP8 experts: INT4's kernels still spill); the CPU stand-in runs
# the torch references in bf16.
SERVED_ON_GPU = {"dense": "w8a16", "attention": "fp8", "moe_format": "fp8"}
REFERENCE_ON_CPU = {"dense": "bf16", "attention": "torch", "moe_format": "bf16"}


# A dense peer converts the FP8 projections the model builds for this variant (128x128 blocks).
PEER_DENSE_BASE = "w8a16"


def device_defaults(params: dict, on_gpu: bool) -> dict:
    """`params` with the backends left unset (None) filled in for the device: the seed's
    served configuration on a GPU, the torch references on the CPU. A MoE peer converts the
    experts itself from the bf16 masters, so its format stays bf16."""
    defaults = SERVED_ON_GPU if on_gpu else REFERENCE_ON_CPU
    filled = {k: defaults[k] if params.get(k) is None else params[k] for k in defaults}
    if params.get("moe_format") is None and params.get("moe") in PEERS:
        filled["moe_format"] = "bf16"
    return params | filled


def check_backends(*, moe: str, dense: str, attention: str, on_gpu: bool) -> None:
    """Refuse an unknown backend, listing the workbench's variants and the peers; a peer
    (`workbench.peers`) must serve the category and be available here, or its reason is the
    error."""
    chosen = {"moe": moe, "dense": dense}
    for kind, name in chosen.items():
        if name not in PEERS:
            continue
        peer = PEERS[name]
        if peer.adapter(kind) is None:
            raise WorkbenchError(
                f"{kind}={name!r}: the peer {name} has no {kind} adapter; {kind} peers: "
                f"{', '.join(n for n in peer_names(kind) if PEERS[n].adapter(kind))}"
            )
        ok, why = peer.available()
        if not ok:
            raise WorkbenchError(f"{kind}={name!r} cannot run here: {why}")
        chosen[kind] = "stock" if kind == "moe" else PEER_DENSE_BASE
    try:
        SyntheticModel.check_variants(attention=attention, **chosen)
    except WorkbenchError as err:
        raise WorkbenchError(f"{err}; or a peer: {', '.join(PEERS)}") from None


def check_moe_format(moe: str, moe_format: object) -> None:
    """Refuse an unknown expert format, and any but the default with a MoE peer: a peer takes
    the experts as FP8 in 128x128 blocks, converted by its own `prepare_moe`."""
    if moe_format not in MOE_FORMATS:
        raise WorkbenchError(
            f"moe_format={moe_format!r} is not a format of the routed experts; give one of "
            f"{', '.join(MOE_FORMATS)} (fp8: 128x128 blocks, int4: groups of 128)."
        )
    if moe in PEERS and moe_format != "bf16":
        raise WorkbenchError(
            f"moe_format={moe_format!r} applies to the workbench's MoE kernels, not to the peer "
            f"moe={moe!r}, which converts the experts itself from FP8 in 128x128 blocks; drop "
            "moe_format."
        )


def check_dense_pdl(dense: str, dense_pdl: bool | None, on_gpu: bool) -> None:
    """Refuse programmatic dependent launch where no W8A16 GEMM would take it."""
    if dense_pdl is False:
        return
    if dense not in ("w8a16", "hybrid"):
        raise WorkbenchError(
            f"dense_pdl={dense_pdl} applies to the W8A16 GEMMs of dense='w8a16' or 'hybrid', "
            f"not dense='{dense}'; drop it or pick one of those."
        )
    if dense_pdl is True and not on_gpu:
        raise WorkbenchError(
            "dense_pdl=True needs a Hopper or newer GPU; a CPU run uses the torch references. "
            "Drop it, or pass dense_pdl=auto to use it where available."
        )


def hybrid_m_for(dense: str, hybrid_m: int | None) -> int | None:
    """The hybrid threshold the run will use (given, else $DENSE_HYBRID_M, else 128), so the
    run's metadata records it; None for the other dense variants, which take none."""
    if dense != "hybrid":
        if hybrid_m is not None:
            raise WorkbenchError(
                f"hybrid_m={hybrid_m} applies to dense='hybrid' only, not dense='{dense}'; "
                "drop it or pick the hybrid variant."
            )
        return None
    try:
        return hybrid_threshold(hybrid_m)
    except ValueError as err:
        raise WorkbenchError(str(err)) from None


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """An integer setting, refused with its name when it is not a whole number >= minimum
    (a string, a float such as 16.7, None, or a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkbenchError(
            f"{name}={value!r} is not a whole number; give an integer such as {name}=4096."
        )
    if value < minimum:
        raise WorkbenchError(f"{name}={value} is below {minimum}; give at least {minimum}.")
    return value
