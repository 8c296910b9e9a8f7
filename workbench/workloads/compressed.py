"""DeepSeek-V4's compressed attention layers in the synthetic model: the compressor, the cache
of entries and the rows each query attends to.

A compressed layer pools each group of `ratio` consecutive tokens into one cache entry: per
channel, the tokens' latent rows (and, in a CSA layer, their indexer keys) weighted by a
softmax of their gates over the group. Entry e covers positions [e * ratio, (e + 1) * ratio)
and is visible from its last position on, so a query at position p sees entries up to
(p + 1) // ratio - 1, its *entry position*. CSA layers (`C`) score the visible entries with
the indexer and attend to its top-k; HCA layers (`H`) attend to every visible entry; both,
and window layers (`W`), attend to the last `window` raw tokens as well. The steps are the
attention variant's own (`kernels.attention`): the indexer and the select take entry
positions as query positions and no window, and the sparse attention reads raw rows and
entries from one latent buffer.

A layer's latent buffer holds the raw rows (the prompt, then each stream's tail, as
`model_state.Cache`), then the entries, then one scratch row; a CSA layer's indexer keys hold
the entries and the scratch row. Entries wholly inside the prompt are shared; the one that
straddles the prompt's end and the later ones belong to each stream, `tail_entries` of them
after the prompt's, by the raw rows' split-and-shift rule in entry units. At decode each
stream's open group waits in `Pending`; every step pools it, and the step that completes it
writes the entry where it belongs, the others the scratch row, so a CUDA graph replays the
same launches every step.

Not modelled: V4's overlapping groups for CSA, the entry's own position encoding, and work
a server would not do: the layers without an indexer still compute its projections (their
share of `qkv_a` and `q_up`), HCA layers the compressor's gates of indexer keys, and the
compressor is its own GEMM where a server might fuse it with `qkv_a` (one launch a layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from kernels.attention import AttentionVariant, QuantizedKeys, cache_rows
from workbench.presets import RankShapes


@dataclass(frozen=True)
class EntryLayout:
    """Where a compressed layer's entries live, for one run's prompt, tail and streams."""

    kind: str  # "C" (CSA) or "H" (HCA)
    ratio: int
    raw_rows: int  # the entries start here in the latent buffer
    prompt_entries: int  # complete in the prompt, shared by the streams
    tail_entries: int  # each stream's own: the one straddling the prompt's end and later ones
    streams: int

    @classmethod
    def of(cls, kind: str, ratio: int, prompt: int, tail: int, streams: int) -> EntryLayout:
        """The entries complete by the end of a run: a stream's tail completes the group its
        prompt left open and then a group every `ratio` steps."""
        return cls(kind, ratio, prompt + streams * tail, prompt // ratio,
                   (prompt % ratio + tail) // ratio, streams)  # fmt: skip

    @property
    def entries(self) -> int:
        """Entry rows, the scratch row not counted (it follows them)."""
        return self.prompt_entries + self.streams * self.tail_entries

    @property
    def visible_max(self) -> int:
        """Entries one stream sees at the end of its tail."""
        return self.prompt_entries + self.tail_entries


@dataclass(frozen=True)
class EntryStep:
    """What every layer of one kind shares in a decode step, computed once a step
    (`DecodeState.advance`): each stream's slot in its open group, its entry position, the
    entry row the step writes (the scratch row unless the step completes the group), and for
    HCA every row a stream attends to: each entry it sees (-1 the others), then its window."""

    slot: Tensor
    entry_pos: Tensor
    query_pos: Tensor  # entry_pos, 0 where it is -1 (`AttentionVariant.choose_entries`)
    write_rows: Tensor
    attend_rows: Tensor | None

    @classmethod
    def of(cls, layout: EntryLayout, shift: Tensor, pos: Tensor, window: Tensor) -> EntryStep:
        r, split = layout.ratio, layout.prompt_entries
        slot, entry_pos = pos % r, entry_position(pos, r)
        own = cache_rows(entry_pos[:, None].clamp(min=0), split, shift)[:, 0]
        write_rows = torch.where(slot == r - 1, own, layout.entries)
        attend_rows = None
        if layout.kind == "H":
            seen = every_entry(layout, entry_pos, layout.visible_max, split, shift)
            attend_rows = torch.cat([seen, window], 1)
        return cls(slot, entry_pos, entry_pos.clamp(min=0), write_rows, attend_rows)


class Pending(NamedTuple):
    """Each decode stream's open group: its tokens' values and gates by slot (position %
    ratio), (streams, ratio, width)."""

    values: Tensor
    gates: Tensor


def entry_position(pos: Tensor, ratio: int) -> Tensor:
    """The last entry complete at each position (-1 before the first is)."""
    return torch.div(pos + 1, ratio, rounding_mode="floor") - 1


def window_rows(pos: Tensor, window: int, split: int | None = None, shift: Tensor | None = None):
    """(Q, window) raw cache rows of positions pos, pos - 1, ..., -1 before position 0."""
    recent = pos[:, None] - torch.arange(window, device=pos.device)
    return cache_rows(recent.masked_fill(recent < 0, -1), split, shift)


def every_entry(layout: EntryLayout, entry_pos: Tensor, length: int, split: int | None = None,
                shift: Tensor | None = None) -> Tensor:  # fmt: skip
    """(Q, length) latent-buffer rows of entries 0 .. length - 1 for each query, -1 where
    the query does not see the entry yet: what an HCA layer attends to besides its window."""
    every = torch.arange(length, device=entry_pos.device).expand(entry_pos.shape[0], -1)
    rows = cache_rows(every, split, shift) + layout.raw_rows
    return torch.where(every <= entry_pos[:, None], rows, -1)


class CompressedAttention:
    """One compressed or window layer's attention over its caches, at prefill and decode."""

    def __init__(self, attn: AttentionVariant, shapes: RankShapes, kind: str):
        self.attn, self.shapes, self.kind = attn, shapes, kind

    def values(self, kv: Tensor, index_k: Tensor) -> Tensor:
        """What an entry pools: the latent row, and in CSA the indexer key beside it."""
        return torch.cat([kv, index_k], 1) if self.kind == "C" else kv

    def _write_entries(self, kv_buf: Tensor, keys, layout: EntryLayout, first: int,
                       entries: Tensor):  # fmt: skip
        """Store a prefill chunk's entries from entry row `first` on."""
        d = self.shapes.head_dim
        region = kv_buf[layout.raw_rows :]
        if self.kind == "C":
            self.attn.write_cache(region, keys, first, entries[:, :d], entries[:, d:])
        else:
            region[first : first + entries.shape[0]] = entries

    def _csa_rows(
        self,
        index_q: Tensor,
        index_w: Tensor,
        keys,
        layout: EntryLayout,
        entry_pos: Tensor,
        query_pos: Tensor,
        window: Tensor,
        length: int,
        split: int | None = None,
        shift: Tensor | None = None,
    ) -> Tensor:
        """(Q, index_topk + window) latent-buffer rows a CSA query attends to: the entries the
        indexer picks among the `length` it may see (-1 unused), then its window rows
        (`AttentionVariant.choose_entries`: from query_pos, the entry position where there is
        one, else 0, with the picks masked; or the variant's `entry_select`)."""
        if length == 0:
            picked = entry_pos.new_full((entry_pos.shape[0], self.shapes.index_topk), -1)
            return self.attn.csa_rows(picked, entry_pos, window, layout.raw_rows)
        return self.attn.choose_entries(index_q, index_w, keys, entry_pos, query_pos, length,
                                        self.shapes.index_topk, window, layout.raw_rows, split,
                                        shift)  # fmt: skip

    def prefill(self, cache, layer: int, start: int, q, kv, index_q, index_k, index_w, gates):
        """A prefill chunk from `start` (a multiple of the ratio): raw rows and the chunk's
        complete groups written, then its attention."""
        s, end = self.shapes, start + kv.shape[0]
        kv_buf, layout = cache.kv[layer], cache.layouts[layer]
        kv_buf[start:end] = kv
        pos = torch.arange(start, end, device=kv.device)
        window = window_rows(pos, s.window)
        if layout is None:  # a window layer
            return self.attn.attend(q, kv_buf, window)
        r, first = layout.ratio, start // layout.ratio
        values = self.values(kv, index_k)
        gates = gates[:, : values.shape[1]]
        complete = (kv.shape[0] // r) * r
        if complete:
            entries = self.attn.pool_groups(values[:complete], gates[:complete], r)
            self._write_entries(kv_buf, cache.keys[layer], layout, first, entries)
        if end == cache.prompt and complete < kv.shape[0]:  # the prompt's open group
            pending = cache.pending[layer]
            pending.values[:, : kv.shape[0] - complete] = values[complete:]
            pending.gates[:, : kv.shape[0] - complete] = gates[complete:]
        entry_pos, seen = entry_position(pos, r), first + complete // r
        if self.kind == "C":
            rows = self._csa_rows(index_q, index_w, cache.keys[layer], layout, entry_pos,
                                  entry_pos.clamp(min=0), window, seen)  # fmt: skip
        else:
            rows = torch.cat([every_entry(layout, entry_pos, seen), window], 1)
        return self.attn.attend(q, kv_buf, rows)

    def decode(self, cache, layer: int, state, q, kv, index_q, index_k, index_w, gates):
        """One decode step of every stream: its raw row written, its open group pooled (the
        entry written where the step completes it, else to the scratch row), then attention
        over the stream's entries and window. The rows that depend on the step alone come
        from `state` (`DecodeState.advance`, once a step)."""
        kv_buf, layout = cache.kv[layer], cache.layouts[layer]
        if layout is None:
            kv_buf.index_copy_(0, state.rows, kv)
            return self.attn.attend(q, kv_buf, state.window_rows)
        step = state.entry_steps[self.kind]
        self.attn.compress_step(kv_buf, cache.keys[layer], cache.pending[layer], state.rows,
                                step.slot, step.write_rows, layout.raw_rows, kv,
                                index_k if self.kind == "C" else None, gates)  # fmt: skip
        if self.kind == "H":
            return self.attn.attend(q, kv_buf, step.attend_rows)
        rows = self._csa_rows(index_q, index_w, cache.keys[layer], layout, step.entry_pos,
                              step.query_pos, state.window_rows, layout.visible_max,
                              layout.prompt_entries, cache.kinds[self.kind][1])  # fmt: skip
        return self.attn.attend(q, kv_buf, rows)


def layer_caches(attn: AttentionVariant, s: RankShapes, layout: EntryLayout | None, raw: int,
                 streams: int, device, dtype):  # fmt: skip
    """(latent buffer, indexer keys or None, Pending or None) of a window or compressed layer:
    raw rows, then (compressed) the entries and the scratch row."""
    if layout is None:
        return torch.empty(raw, s.head_dim, device=device, dtype=dtype), None, None
    kv = torch.empty(raw + layout.entries + 1, s.head_dim, device=device, dtype=dtype)
    keys: Tensor | QuantizedKeys | None = None
    width = s.head_dim
    if layout.kind == "C":
        keys = attn.empty_keys(layout.entries + 1, s.index_dim, device, dtype)
        width += s.index_dim
    shape = (streams, layout.ratio, width)
    pending = Pending(torch.zeros(shape, device=device, dtype=dtype),
                      torch.zeros(shape, device=device, dtype=dtype))  # fmt: skip
    return kv, keys, pending
