"""`workbench bench dense`: every dense backend over all dense projections of one layer, against
its roofline floor (bytes at the copy bandwidth or FLOPs at the peak of the dtype it computes
in, both measured in the same run), plus the seed's dense A/B table.

A row times one layer's dense GEMMs (query LoRA, query heads, latent KV, indexer, the output
projection's groups, as one call where the backend has one (`kernels.dense.grouped`), and
its second half, the shared expert) at M tokens, each projection checked first against an
fp32 GEMM on the weights the backend holds (`rel_error`, dequantised FP8 for the FP8
backends), then timed as CUDA graph replays at every M (dense GEMMs have no host-side control
flow, so the row is the GPU's time, not Python's launch path), every contender at one M in
turns (`bench_rows.check_then_time`); `error_vs_bf16` is the error against the unquantised
weights, what FP8 costs in accuracy (the kernel-level stand-in for the seed's GSM8K column).
Decode sizes cycle through a few copies of the layer so its weights come from HBM, not L2, as
in a 40-layer model.

The A/B table is the seed's "Dense backend" table at kernel level: the dense GEMM time of all
layers for decode with 1 and 4 streams (ms per step) and for a 46K-token prefill in 4096-token
chunks (one prompt, or four batched into the same chunks; ms for the whole prefill), from the
per-layer times at those chunk sizes, with tokens per second.

Peers (`--peers`, default every registered dense peer: `workbench.peers`) run at the same sizes
on the same activations, their rows named by the peer in `kernel` (`cublas_fp8`, `humming`)
and by what it is in `variant`, with the same columns. They take the weights in DeepSeek's
128x128 blocks (`bench_peers`), are checked like the workbench scheme they compute
(W8A8, W8A16 or W4A16) against the fp32 product on the weights they hold: those FP8 weights,
or, for a peer that requantises them (`humming_w4a16`, to INT4), what its `Peer.holds` says it
multiplies by; its roofline reads `Peer.weight_bytes`. Peers are left out of the A/B table.
A peer that cannot run is a `missing-peer` row with the reason in `note`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial

import pandas as pd
import torch
from tqdm.auto import tqdm

import kernels.dense as dense
from workbench.capture.bench_peers import (
    PEER_REF,
    Prepared,
    dense_conversion,
    peer_weights,
    prepare_peers,
    unrun_rows,
)
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
from workbench.capture.timing import GRAPH_TOKENS, Launch
from workbench.errors import WorkbenchError
from workbench.peers import PEER_BLOCK, Peer, get_peers, peer_names
from workbench.workloads.checks import relative_error, tolerance
from workbench.workloads.dense import Layer, activations, layer_flops

# decode (1-6), the middle sizes where W8A16 must hold cuBLAS (16-256) and prefill
M_SWEEP = (1, 4, 6, 16, 24, 32, 64, 128, 256, 4096, 16384)
BACKENDS = ("bf16", "w8a16", "w8a8", "hybrid")
AB_PROMPT, AB_CHUNK = 46_000, 4096
DECODE_COPIES = 3  # layer copies cycled at decode sizes: about 300 MB of weights, over L2
COLUMNS = [
    "kernel", "variant", "scenario", "m", "ms", "iqr_ms", "floor_ms", "ratio_to_floor",
    "tflops", "ratio_to_cublas", "tokens_per_s", "speedup_vs_bf16", "rel_error",
    "error_vs_bf16", "regs", "spills", "status", "note",
]  # fmt: skip
PRINTED = ("kernel", "variant", "scenario", "m", "ms", "ratio_to_floor", "ratio_to_cublas",
           "speedup_vs_bf16", "rel_error", "regs", "spills", "status")  # fmt: skip


def ab_chunks(prompt: int, streams: int, chunk: int) -> list[int]:
    """Token counts of the prefill steps: the streams' prompts batched into `chunk`-token steps."""
    total = prompt * streams
    return [min(chunk, total - start) for start in range(0, total, chunk)]


@dataclass(frozen=True)
class Contender:
    """What one row times: `linear(x, w)` over the layer's weights in the form it takes (a list
    per layer copy), and `linear_group(x, members)` over the output projection's group
    (`Layer.calls`), checked against the reference on the weights it holds (`held`, a key of
    `_references`) with `tolerance`; `weight_bytes` of one copy, and the M above which it
    multiplies in FP8 (None: never) for its roofline's tensor-core rate."""

    kernel: str
    variant: str
    linear: Callable
    linear_group: Callable
    copies: list[list]
    held: str
    tolerance: float
    weight_bytes: int
    fp8_above: int | None


def layer_copies(device: torch.device) -> int:
    """Copies of the layer a row cycles through: DECODE_COPIES on a GPU (weights from HBM,
    not L2), one under the interpreter."""
    return DECODE_COPIES if device.type == "cuda" else 1


def _ours(variant: str, layer: Layer, hybrid_m: int | None, **options: object) -> Contender:
    """One of the workbench's own backends, on the layer's weights in its format, with its
    keyword `options` (an A/B arm's settings)."""
    options = {**options, "hybrid_m": hybrid_m} if variant == "hybrid" else options
    linear = partial(dense.VARIANTS[variant], **options)
    linear_group = dense.group_linear(variant, linear, **options)
    fp8_above = {"w8a8": 0, "hybrid": dense.hybrid_threshold(hybrid_m)}.get(variant)
    return Contender("dense-layer", variant, linear, linear_group, layer.weights(variant),
                     dense.WEIGHT_FORMAT[variant], tolerance("dense", variant),
                     layer.weight_bytes(variant), fp8_above)  # fmt: skip


def _call(x: torch.Tensor, linear: Callable) -> torch.Tensor:
    """A peer's weight is its own linear(x), built once by its conversion."""
    return linear(x)


def _held_key(peer: Peer) -> str:
    """The references' key of what `peer` multiplies by: the peers' FP8 weights as handed, or
    its own key when it holds other numbers (`Peer.holds`)."""
    return PEER_REF if peer.holds is None else f"{PEER_REF}:{peer.name}"


def _peer(prepared: Prepared, weights: list[list]) -> Contender:
    """A converted peer, holding the peers' 128x128-block FP8 weights, or what it made of
    them (`Peer.holds`, with its bytes `Peer.weight_bytes`)."""
    peer = prepared.peer
    nbytes = peer.weight_bytes or (lambda w: w.nbytes)
    return Contender(peer.name, peer.variant, _call, partial(dense.one_by_one, _call),
                     prepared.converted, _held_key(peer),
                     tolerance("dense", peer.scheme), sum(nbytes(w) for w in weights[0]),
                     0 if peer.scheme == "w8a8" else None)  # fmt: skip


def _check(c: Contender, xs, layer: Layer, refs: dict) -> dict:
    """Errors of one layer's outputs: the worst projection against each reference."""
    facts: list[dict] = []
    errors, errors_bf16 = [], []
    for i, call in enumerate(layer.calls(c.linear, c.linear_group, xs, c.copies[0])):
        out = call_with_facts(call, facts)
        errors.append(relative_error(out, refs[c.held][i]))
        errors_bf16.append(relative_error(out, refs["bf16"][i]))
    return {"rel_error": max(errors), "error_vs_bf16": max(errors_bf16), **compile_facts(facts)}


def _held(layer: Layer, prepared: list[Prepared], peers_hold: list | None) -> dict[str, list]:
    """The weights of the first layer copy that references are computed on, by key: the bf16
    masters, the dequantised FP8 and, when peers run, their 128x128-block FP8 and, for each
    peer that holds other numbers, those (`Peer.holds` of each weight it was handed)."""
    held = {"bf16": layer.masters[0], "fp8": layer.fp8[0]}
    if peers_hold:
        held[PEER_REF] = peers_hold[0]
        for p in prepared:
            if p.peer.holds is not None:
                held[_held_key(p.peer)] = [p.peer.holds(w) for w in peers_hold[0]]
    return held


def _references(xs: dict[int, torch.Tensor], layer: Layer, held: dict[str, list]) -> dict:
    """fp32 outputs of the first layer copy on each set of `held` weights (`_held`)."""
    reference = dense.linear_reference
    group = partial(dense.one_by_one, reference)
    return {
        key: [call() for call in layer.calls(reference, group, xs, ws)] for key, ws in held.items()
    }


def _layer_plan(c: Contender, m: int, xs, layer: Layer, refs, ctx: dict) -> RowPlan:
    """One row's plan: a layer's dense GEMMs by one contender at M tokens, to be checked, timed
    (per layer copy) and judged against its floor."""
    sets = c.copies if m <= GRAPH_TOKENS else c.copies[:1]
    calls = [
        call for weights in sets for call in layer.calls(c.linear, c.linear_group, xs, weights)
    ]

    def run_all() -> None:
        for call in calls:
            call()

    def judge(row: dict) -> dict:
        ceilings, ms = ctx["ceilings"], row["ms"]
        fp8_math = c.fp8_above is not None and m > c.fp8_above
        flops = layer_flops(m, layer.projections)
        nbytes = c.weight_bytes + layer.activation_bytes(m)
        peak = "fp8_flops" if fp8_math else "bf16_flops"
        floor_ms = roofline_ms(nbytes, flops, ceilings, peak)
        tflops = flops / (ms / 1e3) / 1e12
        return {
            "floor_ms": floor_ms,
            "ratio_to_floor": ms / floor_ms,
            "tflops": tflops,
            "ratio_to_cublas": tflops * 1e12 / ceilings["bf16_flops"],
            "tokens_per_s": m / (ms * ctx["layers"] / 1e3),
        }

    row = {"kernel": c.kernel, "variant": c.variant, "scenario": f"m={m}", "m": m}
    check = partial(_check, c, xs, layer, refs)
    return RowPlan(row, check, c.tolerance, Launch(run_all, m, graph=True, units=len(sets)), judge)


def layer_row_plan(variant: str, m: int, layer: Layer, xs: dict[int, torch.Tensor],
                   options: dict) -> RowPlan:  # fmt: skip
    """A backend's layer at M rows, with keyword `options`, checked and timed as a bench row
    checks and times it (`workbench ab dense`: one arm's measurement)."""
    options = dict(options)
    contender = _ours(variant, layer, options.pop("hybrid_m", None), **options)
    refs = _references(xs, layer, _held(layer, [], None))
    return _layer_plan(contender, m, xs, layer, refs, {})


def _ab_rows(layer_rows: pd.DataFrame, variants, layers: int, prompt: int, chunk: int) -> list:
    """The seed's A/B scenarios from per-layer times: dense time of all layers and tokens/s."""
    scenarios = {"decode-1": [1], "decode-4": [4]}
    for streams in (1, 4):
        scenarios[f"prefill-{prompt}-{streams}"] = ab_chunks(prompt, streams, chunk)
    rows = []
    for variant in variants:
        mine = layer_rows[layer_rows["variant"] == variant].set_index("m")
        for name, steps in scenarios.items():
            parts = mine.loc[sorted(set(steps))]
            row = {"kernel": "dense-ab", "variant": variant, "scenario": name, "m": sum(steps),
                   "rel_error": parts["rel_error"].max(),
                   "error_vs_bf16": parts["error_vs_bf16"].max()}  # fmt: skip
            bad = parts[~parts["status"].isin(["ok", "spills"])]
            if len(bad):
                rows.append(row | {"status": f"{bad['status'].iloc[0]} (m={bad.index[0]})"})
                continue
            ms = layers * sum(mine.loc[m, "ms"] for m in steps)  # decode: one step
            rows.append(row | {"ms": ms, "tokens_per_s": sum(steps) / (ms / 1e3), "status": "ok"})
    return rows


def _speedups(table: pd.DataFrame) -> pd.Series:
    """Each row's time against bf16's in the same scenario, a peer's against the workbench's
    bf16 layer row (>1: faster than cuBLAS)."""
    base = table[table["variant"] == "bf16"].set_index(["kernel", "scenario"])["ms"]
    kernel = table["kernel"].where(table["kernel"] == "dense-ab", "dense-layer")
    keys = pd.MultiIndex.from_arrays([kernel, table["scenario"]])
    return pd.Series(base.reindex(keys).to_numpy() / table["ms"].to_numpy(), index=table.index)


def bench_dense(
    ms: Sequence[int] = M_SWEEP,
    variants: Sequence[str] = BACKENDS,
    ab: bool = True,
    block: int = dense.DEFAULT_BLOCK,
    hybrid_m: int | None = None,
    preset: str = "dsv4-flash-tp2",
    out: str = "raw",
    seed: int = 0,
    device: str = "cuda",
    ceilings: dict | None = None,
    progress: bool = True,
    ab_prompt: int = AB_PROMPT,
    ab_chunk: int = AB_CHUNK,
    peers: Sequence[str] | None = None,
    **shape_overrides: int,
) -> pd.DataFrame:
    """Benchmark every dense backend and peer (None: every dense peer) on one layer's
    projections at every M, then the A/B of the backends."""
    unknown = sorted(set(variants) - set(dense.VARIANTS))
    if unknown:
        raise WorkbenchError(
            f"unknown dense variants {unknown}; known: {', '.join(dense.VARIANTS)}"
        )
    peers = get_peers(peer_names("dense") if peers is None else list(peers), "dense")
    setup = bench_setup(preset, device, seed, ceilings, shape_overrides)
    dev, s, dtype, chosen = setup.device, setup.shapes, setup.dtype, setup.preset
    layer = Layer(s, layer_copies(dev), block, dtype, dev, seed)
    sizes = sorted(set(ms))
    if ab:
        steps = [1, 4, *ab_chunks(ab_prompt, 1, ab_chunk), *ab_chunks(ab_prompt, 4, ab_chunk)]
        sizes = sorted(set(sizes) | set(steps))
    # conversions and JIT, before anything is timed
    peer_run = prepare_peers(peers, "dense", partial(peer_weights, layer), dense_conversion)
    contenders = [_ours(v, layer, hybrid_m) for v in variants]
    contenders += [_peer(p, peer_run.weights) for p in peer_run.prepared]
    held = _held(layer, peer_run.prepared, peer_run.weights)
    ctx = {"device": dev, "ceilings": setup.ceilings, "layers": chosen.layers}
    rows = []
    total = len(sizes) * (len(contenders) + len(peer_run.unrun))
    with tqdm(total=total, desc="bench dense", disable=not progress) as bar:
        for m in sizes:
            xs = activations(m, layer.input_widths, seed, dev, dtype)
            refs = _references(xs, layer, held)
            plans = [_layer_plan(c, m, xs, layer, refs, ctx) for c in contenders]
            for row in check_then_time(plans, dev) + unrun_rows(peer_run, m):
                rows.append(row)
                print_row(bar, row, PRINTED)
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    if ab:
        ours = table[table["kernel"] == "dense-layer"]
        ab_rows = _ab_rows(ours, variants, chosen.layers, ab_prompt, ab_chunk)
        table = pd.concat([table, pd.DataFrame(ab_rows)], ignore_index=True).reindex(
            columns=COLUMNS
        )
    if "bf16" in variants:
        table["speedup_vs_bf16"] = _speedups(table)
    params = {"ms": list(ms), "variants": list(variants), "ab": ab, "block": block,
              "hybrid_m": dense.hybrid_threshold(hybrid_m), "preset": preset, "seed": seed,
              "device": device, "ab_prompt": ab_prompt, "ab_chunk": ab_chunk,
              "peers": [p.name for p in peers], "peer_block": PEER_BLOCK,
              "shape_overrides": shape_overrides}  # fmt: skip
    projections = [asdict(p) for p in layer.projections]
    return save_bench("dense", setup, out, params, table, rows, graph=True,
                      projections=projections, layers=chosen.layers,
                      peers=peer_run.meta)  # fmt: skip
