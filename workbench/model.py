"""A synthetic layer stack built from the workbench's kernels, for profiling at real shapes.

Every op runs inside a `torch.profiler.record_function` scope that names its category
(`moe`, `dense`, `attention`, `allreduce`, `other`), inside structural scopes that name the
phase and step (`wb.prefill#<chunk>`, `wb.decode#<step>`) and the layer (`wb.layer#<i>`).
The trace links every GPU kernel to its launching CPU op, so the analysis layer reads the
category, phase, step and layer of each kernel from these scopes (see `analysis/rules.py`).

Routing is drawn at random with a seed (`presets.draw_routing`) so that its skew is under
control; the router GEMM and its top-k still run, for their cost, but their choice is replaced
by the draw.

Dense projections run the chosen dense variant; an FP8 variant gets its weights quantised once,
when the model is built. The router (part of the MoE) and the LM head stay in bf16, as FP8
checkpoints of DeepSeek-style models ship them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function

import kernels.attention as attention_kernels
import kernels.dense as dense_kernels
import kernels.moe as moe_kernels
from kernels.norm import rms_norm
from workbench.errors import WorkbenchError
from workbench.presets import Preset, RankShapes, draw_routing

# Variants that are Triton kernels, so they need a GPU; on the CPU their torch reference runs.
TORCH_REFERENCE = {"moe": "reference", "dense": "bf16", "attention": "torch"}
# The dense projections of a layer: each a weight that SyntheticModel.linear multiplies by.
DENSE_WEIGHTS = ("q_a", "q_b", "kv", "index_q", "index_k", "index_w", "o_b", "shared_gate_up",
                 "shared_down")  # fmt: skip


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _pick(kind: str, name: str, table: dict) -> Callable:
    try:
        return table[name]
    except KeyError:
        raise WorkbenchError(
            f"unknown {kind} variant '{name}'; known {kind} variants: {', '.join(table)}"
        ) from None


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


@dataclass(frozen=True)
class Shard:
    """Which slice of the model this process holds: rank `rank` of tensor parallelism `tp`.

    `group` is the torch.distributed process group of a real multi-rank run; without one the
    process simulates rank 0 alone and no collective runs (the preset's one-rank profile).
    """

    tp: int = 1
    rank: int = 0
    group: object | None = None

    def part(self, size: int) -> slice:
        """This rank's contiguous share of a dimension of `size`."""
        n = size // self.tp
        return slice(self.rank * n, (self.rank + 1) * n)


class _SeededInit:
    """Weights drawn at the *whole* model's shapes from one seed, keeping this rank's slice.

    Every tensor-parallel degree therefore slices the same weights, and TP1 and TPn compute
    the same function. Scaled by the whole fan-in so activations stay O(1) through 40 layers.
    Drawn in chunks of the leading dimension (experts) so the full size never sits in memory.
    """

    CHUNK = 16

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int):
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device, self.dtype = device, dtype

    def _draw(self, shape: tuple[int, ...]) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen, device=self.device, dtype=self.dtype)
        return t.mul_(shape[-1] ** -0.5)

    def take(self, shape: tuple[int, ...], rows: list[slice] | None = None, cols=None):
        """The tensor of `shape`, keeping `rows` (of dim -2) and `cols` (of dim -1) slices."""

        def keep(t: torch.Tensor) -> torch.Tensor:
            if rows is not None:
                t = torch.cat([t[..., r, :] for r in rows], dim=-2)
            return t[..., cols] if cols is not None else t

        if len(shape) < 3:
            return keep(self._draw(shape)).contiguous()
        out = None
        for i in range(0, shape[0], self.CHUNK):
            part = keep(self._draw((min(self.CHUNK, shape[0] - i), *shape[1:])))
            if out is None:  # the shard alone is allocated; chunks of the full size come and go
                out = torch.empty((shape[0], *part.shape[1:]), device=self.device, dtype=self.dtype)
            out[i : i + part.shape[0]].copy_(part)
        return out


class LayerWeights:
    """One distinct weight set, this rank's shard of it; layers cycle through a few sets.

    Column-parallel (split by output rows): query heads, expert and shared-expert gate/up.
    Row-parallel (split by input columns, summed by an all-reduce): the output projection's
    second half and the expert and shared-expert down projections. Replicated: the single KV
    head, the query LoRA, the indexer, the router and the norms.
    """

    def __init__(self, full: RankShapes, shard: Shard, device, dtype, seed: int):
        init = _SeededInit(device, dtype, seed)
        h, d = full.hidden, full.head_dim
        self.attn_norm = torch.ones(h, device=device, dtype=dtype)
        self.q_norm = torch.ones(full.q_lora_rank, device=device, dtype=dtype)
        self.kv_norm = torch.ones(d, device=device, dtype=dtype)
        self.ffn_norm = torch.ones(h, device=device, dtype=dtype)
        self.q_a = init.take((full.q_lora_rank, h))
        heads = shard.part(full.q_heads)
        self.q_b = init.take(
            (full.q_heads * d, full.q_lora_rank), rows=[slice(heads.start * d, heads.stop * d)]
        )
        self.kv = init.take((d, h))
        self.index_q = init.take((full.index_heads * full.index_dim, full.q_lora_rank))
        self.index_k = init.take((full.index_dim, h))
        self.index_w = init.take((full.index_heads, h))
        per_group = (full.q_heads // full.o_groups) * d
        o_a = [init.take((full.o_group_rank, per_group)) for _ in range(full.o_groups)]
        groups = shard.part(full.o_groups)
        self.o_a = o_a[groups]
        ranks = slice(groups.start * full.o_group_rank, groups.stop * full.o_group_rank)
        self.o_b = init.take((h, full.o_groups * full.o_group_rank), cols=ranks)
        self.router = init.take((full.experts, h))
        inter = full.expert_intermediate
        mine = shard.part(inter)
        gate_up_rows = [mine, slice(inter + mine.start, inter + mine.stop)]
        self.experts_gate_up = init.take((full.experts, 2 * inter, h), rows=gate_up_rows)
        self.experts_down = init.take((full.experts, h, inter), cols=mine)
        shared = full.shared_intermediate
        own = shard.part(shared)
        self.shared_gate_up = init.take(
            (2 * shared, h), rows=[own, slice(shared + own.start, shared + own.stop)]
        )
        self.shared_down = init.take((h, shared), cols=own)

    def quantize_dense(self, fmt: str) -> None:
        """Store every dense projection (and each output-projection group) as DenseWeights in
        `fmt`, replacing the bf16 tensors: done once, so no GEMM pays for quantisation."""
        for name in DENSE_WEIGHTS:
            setattr(self, name, dense_kernels.DenseWeights.quantize(getattr(self, name), fmt))
        self.o_a = [dense_kernels.DenseWeights.quantize(w, fmt) for w in self.o_a]


class Cache:
    """Per-layer latent KV and indexer keys: the prompt first, then each stream's decode tail.

    A stream's token at decode step t sits at flat row `prompt + stream * tail + t`, and at
    *virtual* position `prompt + t` in its own sequence (the prompt, then its own tail).
    """

    def __init__(self, s: RankShapes, layers: int, plan: Plan, device, dtype):
        self.prompt = plan.prompt_tokens
        self.tail = plan.decode_tokens
        rows = plan.prompt_tokens + plan.streams * plan.decode_tokens
        self.kv = [torch.empty(rows, s.head_dim, device=device, dtype=dtype) for _ in range(layers)]
        self.keys = [
            torch.empty(rows, s.index_dim, device=device, dtype=dtype) for _ in range(layers)
        ]

    def virtual_to_flat(self, virtual: torch.Tensor) -> torch.Tensor:
        """Map per-stream positions (prompt, then own tail) to flat cache rows; -1 stays -1."""
        stream = torch.arange(virtual.shape[0], device=virtual.device)[:, None]
        tail_row = self.prompt + stream * self.tail + (virtual - self.prompt)
        flat = torch.where(virtual >= self.prompt, tail_row, virtual)
        return torch.where(virtual < 0, virtual, flat)


class DecodeState:
    """Static buffers of a decode step, so that every step has the same shapes and pointers.

    The step index lives in a device tensor and the step's inputs are copied into fixed
    buffers: one CUDA graph then serves every decode step, and an eager run does exactly the
    same work as a replay.
    """

    def __init__(self, model: SyntheticModel, plan: Plan):
        dev, s = model.device, model.shapes
        self.cache = Cache(s, model.layers, plan, dev, model.dtype)
        self.streams = plan.streams
        self.step = torch.zeros((), dtype=torch.int64, device=dev)
        self.x = torch.zeros(plan.streams, s.hidden, device=dev, dtype=model.dtype)
        self.ids = [
            torch.zeros(plan.streams, s.top_k, dtype=torch.int32, device=dev)
            for _ in range(model.layers)
        ]
        self.weights = [
            torch.full((plan.streams, s.top_k), 1.0 / s.top_k, device=dev)
            for _ in range(model.layers)
        ]
        self.stream_rows = plan.prompt_tokens + torch.arange(plan.streams, device=dev) * (
            plan.decode_tokens
        )
        self.tokens = torch.zeros(plan.streams, dtype=torch.int64, device=dev)
        self.hidden = torch.zeros(plan.streams, s.hidden, device=dev, dtype=model.dtype)

    def load(self, inputs: dict, step: int) -> None:
        """Copy decode step `step`'s inputs into the static buffers (outside any graph)."""
        rows = slice(step * self.streams, (step + 1) * self.streams)
        self.step.fill_(step)
        self.x.copy_(inputs["decode"][step])
        for i, (ids, weights) in enumerate(inputs["decode_routing"]):
            self.ids[i].copy_(ids[rows])
            self.weights[i].copy_(weights[rows])


class SyntheticModel:
    """The layer stack at one rank's shapes, with a kernel variant chosen per category."""

    def __init__(
        self,
        preset: Preset,
        *,
        moe: str = "stock",
        dense: str = "bf16",
        attention: str = "torch",
        routing: str = "uniform",
        seed: int = 0,
        device: torch.device | str = "cpu",
        layers: int | None = None,
        shard: Shard | None = None,
        hybrid_m: int | None = None,
        interpret: bool = False,
    ):
        """`hybrid_m`: the largest row count the `hybrid` dense variant sends to W8A16 (None:
        $DENSE_HYBRID_M, else 128). `interpret`: run the chosen Triton variants on the CPU too,
        under TRITON_INTERPRET=1 (for tests; slow), instead of their torch references."""
        self.preset = preset
        # Without a shard, one process simulates rank 0 of the preset's own TP degree.
        self.shard = shard or Shard(tp=preset.simulated_tp)
        self.shapes = preset.rank_shapes(self.shard.tp)
        full = preset.rank_shapes(1)
        self.device = torch.device(device)
        # bf16 on the GPU, as served. The CPU stand-in computes in fp32: CPUs without bf16
        # matrix units run bf16 GEMMs some 30x slower, which would only measure the emulation.
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.layers = layers or preset.layers
        self.routing, self.seed = routing, seed
        self.variants = {"moe": moe, "dense": dense, "attention": attention}
        self.check_variants(**self.variants)
        self.on_gpu = self.device.type == "cuda"
        if interpret and not self.on_gpu and not _interpreting():
            raise WorkbenchError(
                "interpret=True runs the Triton kernels on the CPU, which needs TRITON_INTERPRET=1 "
                "set before triton is imported; set it or use a GPU."
            )
        # Triton kernels need a GPU (or the interpreter); the CPU runs the torch references,
        # and says so.
        self.kernels_run = {
            kind: name if self.on_gpu or interpret else TORCH_REFERENCE[kind]
            for kind, name in self.variants.items()
        }
        self.moe_fn = _pick("moe", self.kernels_run["moe"], moe_kernels.VARIANTS)
        dense_name = self.kernels_run["dense"]
        self.linear = _pick("dense", dense_name, dense_kernels.VARIANTS)
        if dense_name == "hybrid":
            self.linear = partial(self.linear, hybrid_m=hybrid_m)
        self.attention = _pick(
            "attention", self.kernels_run["attention"], attention_kernels.VARIANTS
        )
        distinct = min(preset.distinct_weight_sets, self.layers)
        self.weights = [
            LayerWeights(full, self.shard, self.device, self.dtype, seed * 1000 + i)
            for i in range(distinct)
        ]
        dense_format = dense_kernels.WEIGHT_FORMAT[dense_name]
        if dense_format != "bf16":
            for weights in self.weights:
                weights.quantize_dense(dense_format)
        self.vocab_part = self.shard.part(full.vocab)  # vocab-parallel LM head
        self.lm_head = _SeededInit(self.device, self.dtype, seed + 7).take(
            (full.vocab, full.hidden), rows=[self.vocab_part]
        )
        self.final_norm = torch.ones(full.hidden, device=self.device, dtype=self.dtype)

    @staticmethod
    def check_variants(**chosen: str) -> None:
        """Raise for an unknown variant name, listing the known ones."""
        tables = {
            "moe": moe_kernels.VARIANTS,
            "dense": dense_kernels.VARIANTS,
            "attention": attention_kernels.VARIANTS,
        }
        for kind, name in chosen.items():
            _pick(kind, name, tables[kind])

    # ---- inputs -------------------------------------------------------------------------
    def _routing(self, tokens: int, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, weights = draw_routing(
            tokens, self.shapes.experts, self.shapes.top_k, self.routing, self.seed + salt
        )
        return (
            torch.from_numpy(ids).to(self.device),
            torch.from_numpy(weights).to(self.device),
        )

    def inputs(self, plan: Plan) -> dict:
        """Hidden states and routing for a whole plan, made before profiling starts."""
        gen = torch.Generator(device=self.device).manual_seed(self.seed + 1)
        h = self.shapes.hidden
        return {
            "prompt": torch.randn(plan.prompt_tokens, h, generator=gen, device=self.device).to(
                self.dtype
            ),
            "decode": torch.randn(
                plan.decode_tokens, plan.streams, h, generator=gen, device=self.device
            ).to(self.dtype),
            "prefill_routing": [
                self._routing(plan.prompt_tokens, 10_000 + i) for i in range(self.layers)
            ],
            "decode_routing": [
                self._routing(plan.decode_tokens * plan.streams, 20_000 + i)
                for i in range(self.layers)
            ],
        }

    # ---- one layer ----------------------------------------------------------------------
    def _attention_block(
        self, x: torch.Tensor, w: LayerWeights, attend_to: Callable
    ) -> torch.Tensor:
        s = self.shapes
        with record_function("other"):
            xn = rms_norm(x, w.attn_norm)
        with record_function("dense"):
            q_low = self.linear(xn, w.q_a)
        with record_function("other"):
            q_low = rms_norm(q_low, w.q_norm)
        with record_function("dense"):
            q = self.linear(q_low, w.q_b).view(-1, s.q_heads, s.head_dim)
            kv = self.linear(xn, w.kv)
            index_q = self.linear(q_low, w.index_q).view(-1, s.index_heads, s.index_dim)
            index_k = self.linear(xn, w.index_k)
            index_w = self.linear(xn, w.index_w).float() * s.index_heads**-0.5
        with record_function("other"):
            kv = rms_norm(kv, w.kv_norm)
        out = attend_to(q, kv, index_q, index_k, index_w)
        with record_function("dense"):
            groups = out.view(-1, s.o_groups, (s.q_heads // s.o_groups) * s.head_dim)
            low = torch.cat([self.linear(groups[:, g], w.o_a[g]) for g in range(s.o_groups)], 1)
            partial = self.linear(low, w.o_b)
        return self._all_reduce(partial)

    def _all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum a row-parallel output over the ranks (nothing to do on a single process)."""
        if self.shard.group is None:
            return partial
        with record_function("allreduce"):
            dist.all_reduce(partial, group=self.shard.group)
        return partial

    def _ffn_block(
        self, x: torch.Tensor, w: LayerWeights, routing: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        with record_function("other"):
            xn = rms_norm(x, w.ffn_norm)
        with record_function("moe"):
            logits = torch.matmul(xn, w.router.T)
            moe_kernels.router_topk(logits, self.shapes.top_k)  # run for its cost only
            routed = self.moe_fn(xn, routing[0], routing[1], w.experts_gate_up, w.experts_down)
        with record_function("dense"):
            shared = moe_kernels.shared_expert(
                xn, w.shared_gate_up, w.shared_down, linear=self.linear
            )
        with record_function("other"):
            partial = routed + shared
        return self._all_reduce(partial)

    def _layer(self, i: int, x: torch.Tensor, attend_to: Callable, routing) -> torch.Tensor:
        w = self.weights[i % len(self.weights)]
        with record_function(f"wb.layer#{i}"):
            attn = self._attention_block(x, w, attend_to)
            with record_function("other"):
                x = x + attn
            ffn = self._ffn_block(x, w, routing)
            with record_function("other"):
                return x + ffn

    def _lm_head(self, x_last: torch.Tensor) -> torch.Tensor:
        with record_function("other"):
            xn = rms_norm(x_last, self.final_norm)
        with record_function("dense"):
            logits = dense_kernels.linear(xn, self.lm_head)  # bf16, as checkpoints ship it
        with record_function("other"):
            best, index = logits.max(-1)
            index = index + self.vocab_part.start
        if self.shard.group is None:
            return index
        with record_function("other"):  # ids up to 2**24 are exact in float32
            pairs = torch.stack([best.float(), index.float()])
            gathered = pairs.new_empty((self.shard.tp * 2, pairs.shape[1]))
        with record_function("allreduce"):  # argmax over the vocab shards: gather (max, id)
            dist.all_gather_into_tensor(gathered, pairs, group=self.shard.group)
        with record_function("other"):
            both = gathered.view(self.shard.tp, 2, -1)
            winner = both[:, 0].argmax(0)
            return both[:, 1].gather(0, winner[None]).squeeze(0).long()

    # ---- attention over the cache -------------------------------------------------------
    def _prefill_attention(self, cache: Cache, layer: int, start: int, size: int) -> Callable:
        s, end, attn = self.shapes, start + size, self.attention

        def attend_to(q, kv, index_q, index_k, index_w):
            with record_function("other"):
                cache.kv[layer][start:end] = kv
                cache.keys[layer][start:end] = index_k
            with record_function("attention"):
                pos = torch.arange(start, end, device=self.device)
                scores = attn.indexer_scores(index_q, index_w, cache.keys[layer][:end], pos)
                chosen = attn.select_positions(scores, pos, s.index_topk, s.window)
                return attn.attend(q, cache.kv[layer][:end], chosen)

        return attend_to

    def _decode_attention(self, state: DecodeState, layer: int) -> Callable:
        s, cache, attn = self.shapes, state.cache, self.attention
        prompt, tail, streams = cache.prompt, cache.tail, state.streams

        def attend_to(q, kv, index_q, index_k, index_w):
            keys = cache.keys[layer]
            with record_function("other"):
                rows = state.stream_rows + state.step
                cache.kv[layer][rows] = kv
                keys[rows] = index_k
            with record_function("attention"):
                prompt_scores = attn.indexer_scores(index_q, index_w, keys[:prompt])
                # Score each stream's whole tail buffer: slots after the current step hold
                # stale values, but select_positions never picks a position after the query.
                tail_keys = keys[prompt : prompt + streams * tail]
                both = attn.indexer_scores(index_q, index_w, tail_keys)
                own = both.view(streams, streams, tail).diagonal().T
                scores = torch.cat([prompt_scores, own], dim=1)
                pos = prompt + state.step.expand(streams)
                virtual = attn.select_positions(scores, pos, s.index_topk, s.window)
                return attn.attend(q, cache.kv[layer], cache.virtual_to_flat(virtual))

        return attend_to

    # ---- the run ------------------------------------------------------------------------
    @contextmanager
    def step_scope(self, name: str) -> Iterator[None]:
        """The scope of one prefill chunk or decode step (`wb.prefill#i`, `wb.decode#i`),
        synchronised at its end as a server does to sample. Subclasses extend it to mark a
        step (the ncu target wraps one decode step in an NVTX range)."""
        with record_function(name):
            yield
        if self.on_gpu:
            torch.cuda.synchronize(self.device)  # a server syncs each step to sample

    def new_state(self, plan: Plan) -> DecodeState:
        return DecodeState(self, plan)

    def prefill(
        self, state: DecodeState, plan: Plan, inputs: dict, tick: Callable[[int], None]
    ) -> None:
        """The prompt in chunks, eagerly, filling the cache."""
        for chunk, (start, size) in enumerate(plan.chunks()):
            with self.step_scope(f"wb.prefill#{chunk}"):
                with record_function("other"):
                    x = inputs["prompt"][start : start + size]
                for i in range(self.layers):
                    with record_function("other"):
                        ids, weights = inputs["prefill_routing"][i]
                        routing = (ids[start : start + size], weights[start : start + size])
                    attend_to = self._prefill_attention(state.cache, i, start, size)
                    x = self._layer(i, x, attend_to, routing)
                    tick(1)
                if start + size == plan.prompt_tokens:
                    with record_function("other"):
                        last = x[-1:]
                    self._lm_head(last)

    def decode_step(self, state: DecodeState) -> None:
        """One decode step on the static buffers: the same work eagerly or as a graph replay."""
        x = state.x
        for i in range(self.layers):
            attend_to = self._decode_attention(state, i)
            x = self._layer(i, x, attend_to, (state.ids[i], state.weights[i]))
        tokens = self._lm_head(x)
        with record_function("other"):
            state.tokens.copy_(tokens)
            state.hidden.copy_(x)

    @torch.inference_mode()
    def run(
        self,
        plan: Plan,
        inputs: dict,
        progress: Callable[[int], None] | None = None,
        state: DecodeState | None = None,
        replay: Callable[[], None] | None = None,
    ) -> np.ndarray:
        """Prefill, then decode, on `inputs(plan)`; returns the decoded ids (steps, streams).

        `replay`, when given, runs each decode step instead of `decode_step` (a CUDA graph of
        it captured on `state`). `progress(n)` is called after every n layers.
        """
        tick = progress or (lambda n: None)
        state = state or self.new_state(plan)
        self.prefill(state, plan, inputs, tick)
        tokens = []
        for step in range(plan.decode_tokens):
            with self.step_scope(f"wb.decode#{step}"):
                with record_function("other"):
                    state.load(inputs, step)
                if replay is None:
                    self.decode_step(state)
                else:
                    with record_function("wb.graph#decode"):
                        replay()
                tick(self.layers)
                with record_function("other"):
                    tokens.append(state.tokens.clone())
        return torch.stack(tokens).cpu().numpy()
