"""DeepSeek-V4's compressed attention layers (`workbench.workloads.compressed`) against a
brute-force reference: every stream's whole sequence (the prompt, then its own tail) pooled
into entries group by group, each query's entries and window picked by position, attention
over them. Prefill runs in chunks and decode a step at a time for two streams, as the model
runs them, so the cache layout (shared prompt entries, each stream's own entries from the
one straddling the prompt's end, the scratch row, the open groups at decode) is what is
checked. The torch variant here; the Triton ones under the interpreter below."""

from types import SimpleNamespace

import pytest
import torch
from conftest import GPU_TESTS
from helpers import relative_error

import kernels.attention as attention
from kernels.attention.compress import pool_groups
from kernels.attention.reference import indexer_scores, sparse_attention
from workbench.errors import WorkbenchError
from workbench.presets import get_preset, with_overrides
from workbench.workloads.compressed import (
    CompressedAttention,
    EntryLayout,
    EntryStep,
    layer_caches,
    window_rows,
)
from workbench.workloads.model import Plan, SyntheticModel
from workbench.workloads.model_state import Cache

PROMPT, TAIL, STREAMS, CHUNK = 45, 7, 2, 16
SHAPES = SimpleNamespace(head_dim=16, index_dim=8, index_heads=2, index_topk=5, window=6)
HEADS = 3


def tokens(n: int, seed: int) -> dict:
    """n tokens' attention inputs, fp32: what the model's attention block hands a layer.
    The indexer's queries and keys are positive, so no ReLU zeros tie its scores."""
    gen = torch.Generator().manual_seed(seed)
    d, di = SHAPES.head_dim, SHAPES.index_dim
    return {
        "q": torch.randn(n, HEADS, d, generator=gen),
        "kv": torch.randn(n, d, generator=gen),
        "index_q": torch.randn(n, SHAPES.index_heads, di, generator=gen).abs(),
        "index_k": torch.randn(n, di, generator=gen).abs(),
        "index_w": torch.randn(n, SHAPES.index_heads, generator=gen),
        "gates": torch.randn(n, d + di, generator=gen),
    }


def sequences(prompt: int = PROMPT, tail: int = TAIL, streams: int = STREAMS) -> list[dict]:
    """Each stream's whole sequence: the shared prompt, then its own tail."""
    shared = tokens(prompt, 0)
    tails = [tokens(tail, 10 + s) for s in range(streams)]
    return [{k: torch.cat([shared[k], own[k]]) for k in shared} for own in tails]


def reference(seq: dict, kind: str, ratio: int) -> torch.Tensor:
    """Attention of every position of one stream's sequence, straight from the definition."""
    n, d = seq["kv"].shape
    rows = [seq["kv"]]
    entries_k = None
    if kind in "CH":
        complete = n // ratio * ratio
        values = seq["kv"] if kind == "H" else torch.cat([seq["kv"], seq["index_k"]], 1)
        pooled = pool_groups(values[:complete], seq["gates"][:complete, : values.shape[1]], ratio)
        rows.append(pooled[:, :d])
        entries_k = pooled[:, d:]
    kv = torch.cat(rows)
    out = []
    for p in range(n):
        window = [j for j in range(p - SHAPES.window + 1, p + 1) if j >= 0]
        chosen = []
        visible = (p + 1) // ratio if kind in "CH" else 0
        if kind == "H":
            chosen = list(range(visible))
        elif kind == "C" and visible:
            scores = indexer_scores(seq["index_q"][p : p + 1], seq["index_w"][p : p + 1],
                                    entries_k[:visible])[0]  # fmt: skip
            chosen = scores.topk(min(SHAPES.index_topk, visible)).indices.tolist()
        index = torch.tensor([[n + e for e in chosen] + window])
        out.append(sparse_attention(seq["q"][p : p + 1], kv, index))
    return torch.cat(out)


def run_layer(
    kind: str,
    ratio: int,
    variant: str,
    layout_of: tuple[int, int, int, int | None] = (PROMPT, TAIL, STREAMS, CHUNK),
    poison: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(prefill output for the prompt, each stream's decode outputs) of one layer, for a
    (prompt, tail, streams, chunk) layout; `poison` fills every buffer with NaN first, so a
    read of a row or slot never written shows."""
    prompt, tail, streams, chunk = layout_of
    attn = attention.VARIANTS[variant]
    raw = prompt + streams * tail
    layout = EntryLayout.of(kind, ratio, prompt, tail, streams) if kind in "CH" else None
    kv, keys, pending = layer_caches(attn, SHAPES, layout, raw, streams, "cpu", torch.float32)
    if poison:
        for t in (kv, *(() if keys is None else [keys] if torch.is_tensor(keys) else keys),
                  *(() if pending is None else (pending.values, pending.gates))):  # fmt: skip
            t.fill_(float("nan"))
    shift = None if layout is None else torch.arange(streams) * layout.tail_entries
    cache = SimpleNamespace(kv=[kv], keys=[keys], layouts=[layout], pending=[pending],
                            kinds={kind: (layout, shift)}, prompt=prompt)  # fmt: skip
    layer = CompressedAttention(attn, SHAPES, kind)
    seqs = sequences(prompt, tail, streams)
    names = ("q", "kv", "index_q", "index_k", "index_w", "gates")
    prefill = []
    for start in range(0, prompt, chunk or prompt):
        part = [seqs[0][k][start : min(start + (chunk or prompt), prompt)] for k in names]
        prefill.append(layer.prefill(cache, 0, start, *part))
    state = SimpleNamespace(shift=torch.arange(streams) * tail)
    decoded = []
    for t in range(tail):
        state.pos = torch.full((streams,), prompt + t)
        state.rows = prompt + state.shift + t
        state.window_rows = window_rows(state.pos, SHAPES.window, prompt, state.shift)
        if layout is not None:
            state.entry_steps = {kind: EntryStep.of(layout, shift, state.pos, state.window_rows)}
        step = [torch.stack([seq[k][prompt + t] for seq in seqs]) for k in names]
        decoded.append(layer.decode(cache, 0, state, *step))
    per_stream = [torch.stack([out[s] for out in decoded]) for s in range(streams)]
    return torch.cat(prefill), per_stream


CASES = [("W", 0), ("C", 4), ("H", 16), ("C", 16)]  # 45 = 4 x 11 + 1 = 16 x 2 + 13


# (prompt, tail, streams, chunk): the default; a prompt of whole groups; a prompt shorter than
# a group; one stream over several groups of tail; three streams and one prefill pass
LAYOUTS = [(PROMPT, TAIL, STREAMS, CHUNK), (32, 9, 2, 16), (3, 10, 2, 16), (21, 18, 1, 16),
           (30, 5, 3, None)]  # fmt: skip


@pytest.mark.parametrize("layout_of", LAYOUTS)
@pytest.mark.parametrize(("kind", "ratio"), CASES)
def test_layers_match_the_definition_at_prefill_and_for_each_decode_stream(kind, ratio, layout_of):
    prompt, tail, streams, _ = layout_of
    prefill, decoded = run_layer(kind, ratio, "torch", layout_of, poison=True)
    for s, seq in enumerate(sequences(prompt, tail, streams)):
        want = reference(seq, kind, ratio)
        assert relative_error(prefill, want[:prompt]) < 1e-5
        assert relative_error(decoded[s], want[prompt:]) < 1e-5, f"stream {s}"


def matching_rows(got: torch.Tensor, want: torch.Tensor) -> float:
    """The share of query rows whose attention output matches to 1e-4."""
    scale = want.abs().amax(dim=(1, 2)).clamp(min=1e-6)
    return float(((got - want).abs().amax(dim=(1, 2)) / scale < 1e-4).float().mean())


@pytest.mark.skipif(GPU_TESTS, reason="the Triton variants on the CPU need the interpreter")
@pytest.mark.parametrize("variant", ["triton", "fp8"])
@pytest.mark.parametrize(("kind", "ratio"), [("C", 4), ("H", 16)])
def test_the_triton_variants_pick_the_same_entries(kind, ratio, variant):
    # HCA takes every visible entry: the same rows exactly. CSA's sampled select fixes 16 bits
    # of each score (a pick within 1% of the exact cut, as its own tests hold it to) and fp8
    # rounds the scores, so a near-tie may go the other way: 2 or 3 of the 45 prompt rows,
    # at most one of a stream's 7 decode rows (fp8's fused indexer and select at decode).
    prefill, decoded = run_layer(kind, ratio, variant, poison=True)
    want_prefill, want_decoded = run_layer(kind, ratio, "torch")
    assert matching_rows(prefill, want_prefill) >= (1.0 if kind == "H" else 0.9)
    for got, want in zip(decoded, want_decoded, strict=True):
        assert matching_rows(got, want) >= (1.0 if kind == "H" else 0.85)


@pytest.mark.skipif(GPU_TESTS, reason="the Triton variants on the CPU need the interpreter")
@pytest.mark.parametrize("variant", ["triton", "fp8"])
def test_decode_rows_hold_no_entry_before_a_stream_completes_one(variant):
    # A 3-token prompt and groups of 16: a stream's first 12 decode steps see no entry (the
    # fp8 variant's indexer then scores from entry position -1, which has no candidates),
    # the last six see one, which every query picks: the same rows as torch's, exactly.
    layout_of = (3, 18, 1, 16)
    _, decoded = run_layer("C", 16, variant, layout_of, poison=True)
    _, want = run_layer("C", 16, "torch", layout_of)
    assert matching_rows(decoded[0], want[0]) == 1.0


def test_entries_pool_each_group_by_a_softmax_of_its_gates():
    values = torch.arange(8.0).view(8, 1)
    gates = torch.zeros(8, 1)
    gates[3] = 100.0  # the first group's last token takes all its weight
    assert pool_groups(values, gates, 4).flatten().tolist() == [3.0, 5.5]  # second: an even mean


def test_the_layout_of_entries():
    layout = EntryLayout.of("C", 4, prompt=33_863, tail=64, streams=2)
    # 8,465 entries complete in the prompt; each stream's 67 tokens (3 of the prompt's, 64 of
    # its own) complete 16 entries, the first straddling the prompt's end
    assert (layout.prompt_entries, layout.tail_entries) == (8_465, 16)
    assert layout.raw_rows == 33_863 + 2 * 64 and layout.entries == 8_465 + 32
    assert layout.visible_max == 8_481
    assert EntryLayout.of("H", 128, 33_863, 64, 1).tail_entries == 1  # 71 + 64 >= 128


def test_a_compressed_preset_runs_and_wants_chunks_on_group_boundaries():
    preset = with_overrides(get_preset("tiny"), layers=4, attention_layers="WCHD", hca_ratio=16)
    model = SyntheticModel(preset)
    plan = Plan(prompt_tokens=61, decode_tokens=3, streams=2, prefill_chunk=32)
    ids = model.run(plan, model.inputs(plan))
    assert ids.shape == (3, 2)
    assert model.weights[0].compress is not None  # the compressor's gates, drawn last
    bad = Plan(prompt_tokens=61, decode_tokens=3, prefill_chunk=24)
    with pytest.raises(WorkbenchError, match="starts at 24, not a multiple of 16"):
        Cache(model.shapes, 4, bad, "cpu", torch.float32, model.attention, preset)
    # one chunk, or chunks from group boundaries, whatever the prompt; and the warm-up plans
    for fine in (Plan(61, 3, 2, None), Plan(61, 3, 2, 4096), Plan(61, 3, 2, 32)):
        for plan in (fine, fine.warmup()):
            Cache(model.shapes, 4, plan, "cpu", torch.float32, model.attention, preset)


def test_presets_describe_every_layer():
    v4 = get_preset("dsv4-flash-v4-tp2")
    assert len(v4.attention_layers) == v4.layers == 43
    assert [v4.attention_layers.count(k) for k in "WCH"] == [2, 21, 20]
    assert v4.compress_ratio("C") == 4 and v4.compress_ratio("H") == 128
    assert not get_preset("dsv4-flash-tp2").compressed
    with pytest.raises(WorkbenchError, match="one of D"):
        with_overrides(get_preset("tiny"), attention_layers="DX").validate()
    with pytest.raises(WorkbenchError, match="each of the 2 layers"):
        with_overrides(get_preset("tiny"), attention_layers="W").validate()
    with_overrides(v4, layers=4).validate()  # W W C H: the first four letters
