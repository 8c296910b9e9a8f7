"""What one run of the synthetic model computes and holds: the plan, the KV cache and the
static buffers of a decode step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from workbench.errors import WorkbenchError
from workbench.presets import Preset, RankShapes
from workbench.workloads.compressed import EntryLayout, EntryStep, layer_caches, window_rows

if TYPE_CHECKING:
    from workbench.workloads.model import SyntheticModel


@dataclass(frozen=True)
class Plan:
    """What one run computes: a chunked prefill of the prompt, then batched decode steps."""

    prompt_tokens: int
    decode_tokens: int
    streams: int = 1
    prefill_chunk: int | None = 4096

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "decode_tokens", "streams"):
            value = getattr(self, name)
            if value < 1:
                raise WorkbenchError(f"{name}={value} is below 1; give a count of at least 1.")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise WorkbenchError(
                f"prefill_chunk={self.prefill_chunk} is below 1; give a positive chunk size "
                "or None for one pass."
            )

    def chunks(self) -> list[tuple[int, int]]:
        """(first position, size) of every prefill chunk."""
        size = self.prefill_chunk or self.prompt_tokens
        return [
            (start, min(size, self.prompt_tokens - start))
            for start in range(0, self.prompt_tokens, size)
        ]

    def warmup(self) -> Plan:
        """A short plan with the same kernel specialisations: one chunk of each distinct size."""
        sizes = sorted({size for _, size in self.chunks()}, reverse=True)
        return Plan(sum(sizes), min(2, self.decode_tokens), self.streams, sizes[0])


class Cache:
    """Per-layer latent KV and indexer keys: the prompt first, then each stream's decode tail.

    A stream's token at decode step t sits at flat row `prompt + stream * tail + t`, and at
    *virtual* position `prompt + t` in its own sequence (the prompt, then its own tail): from
    virtual position `prompt` on, stream s reads rows `s * tail` further on (its `shift`).
    Keys are held in the attention variant's format (bf16, or FP8 with per-key scales); window
    and compressed layers hold none for raw rows (`compressed`).
    """

    def __init__(
        self, s: RankShapes, layers: int, plan: Plan, device, dtype, attention, preset: Preset
    ):
        """`preset` says each layer's attention: a sparse layer (D) holds a latent row and an
        indexer key a row; window and compressed layers hold what `compressed` lays out (one
        layout a kind, `kinds`, each with its streams' entry shifts)."""
        self.prompt = plan.prompt_tokens
        self.tail = plan.decode_tokens
        rows = plan.prompt_tokens + plan.streams * plan.decode_tokens
        self.kinds: dict[str, tuple[EntryLayout, torch.Tensor]] = {}
        for kind in sorted({preset.attention_kind(i) for i in range(layers)} & set("CH")):
            ratio = preset.compress_ratio(kind)
            check_chunks(plan, ratio, preset.name)
            layout = EntryLayout.of(kind, ratio, self.prompt, self.tail, plan.streams)
            shift = torch.arange(plan.streams, device=device) * layout.tail_entries
            self.kinds[kind] = (layout, shift)
        self.kv, self.keys, self.layouts, self.pending = [], [], [], []
        for layer in range(layers):
            kind = preset.attention_kind(layer)
            layout = self.kinds[kind][0] if kind in self.kinds else None
            if kind == "D":
                kv = torch.empty(rows, s.head_dim, device=device, dtype=dtype)
                keys, pending = attention.empty_keys(rows, s.index_dim, device, dtype), None
            else:
                kv, keys, pending = layer_caches(attention, s, layout, rows, plan.streams,
                                                 device, dtype)  # fmt: skip
            self.kv.append(kv)
            self.keys.append(keys)
            self.layouts.append(layout)
            self.pending.append(pending)


def check_chunks(plan: Plan, ratio: int, preset: str) -> None:
    """Prefill chunks must start on group boundaries: a compressed layer pools each chunk's
    whole groups into entries as the chunk goes (the prompt's last group may stay open)."""
    starts = [start for start, _ in plan.chunks() if start % ratio]
    if starts:
        raise WorkbenchError(
            f"a prefill chunk starts at {starts[0]}, not a multiple of {ratio}, the tokens preset "
            f"'{preset}' pools into one cache entry; use a prefill_chunk that is a multiple of "
            f"{ratio} (e.g. 4096) or none."
        )


class DecodeState:
    """Static buffers of a decode step, so that every step has the same shapes and pointers.

    The step index lives in a device tensor and the step's inputs are copied into fixed
    buffers: one CUDA graph then serves every decode step, and an eager run does exactly the
    same work as a replay.
    """

    def __init__(self, model: SyntheticModel, plan: Plan):
        dev, s = model.device, model.shapes
        self.cache = Cache(s, model.layers, plan, dev, model.dtype, model.attention,
                           model.preset)  # fmt: skip
        self.streams = plan.streams
        self.step = torch.zeros((), dtype=torch.int64, device=dev)
        self.x = torch.zeros(plan.streams, s.hidden, device=dev, dtype=model.dtype)
        # Every layer's routing of this step: (layers, streams, K), one copy each a step.
        self.ids = torch.zeros(model.layers, plan.streams, s.top_k, dtype=torch.int32, device=dev)
        self.weights = torch.full((model.layers, plan.streams, s.top_k), 1.0 / s.top_k,
                                  device=dev)  # fmt: skip
        self.shift = torch.arange(plan.streams, device=dev) * plan.decode_tokens
        self.stream_rows = plan.prompt_tokens + self.shift
        # This step's cache rows and virtual positions, computed once a step (`advance`).
        self.rows = self.stream_rows.clone()
        self.pos = torch.full((plan.streams,), plan.prompt_tokens, device=dev)
        self.tokens = torch.zeros(plan.streams, dtype=torch.int64, device=dev)
        # Window and compressed layers' per-step rows (`advance`): None without such layers.
        compact = any(model.preset.attention_kind(i) != "D" for i in range(model.layers))
        self.window = s.window if compact else None
        self.window_rows: torch.Tensor | None = None
        self.entry_steps: dict[str, EntryStep] = {}
        self.hidden = torch.zeros(plan.streams, s.hidden, device=dev, dtype=model.dtype)

    def advance(self) -> None:
        """This step's cache rows and query positions from the step counter, on the device (two
        launches a step, part of the replayed graph), shared by every layer; with window or
        compressed layers, also their window rows and each kind's entry rows (`EntryStep`),
        once a step rather than once a layer, as a server computes its metadata."""
        torch.add(self.stream_rows, self.step, out=self.rows)
        torch.add(self.step.expand(self.streams), self.cache.prompt, out=self.pos)
        if self.window is not None:
            self.window_rows = window_rows(self.pos, self.window, self.cache.prompt, self.shift)
            self.entry_steps = {kind: EntryStep.of(layout, shift, self.pos, self.window_rows)
                                for kind, (layout, shift) in self.cache.kinds.items()}  # fmt: skip

    def load(self, inputs: dict, step: int) -> None:
        """Copy decode step `step`'s inputs into the static buffers (outside any graph)."""
        ids, weights = inputs["decode_routing"]
        self.step.fill_(step)
        self.x.copy_(inputs["decode"][step])
        self.ids.copy_(ids[step])
        self.weights.copy_(weights[step])
