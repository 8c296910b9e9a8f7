"""A synthetic layer stack built from the workbench's kernels, for profiling at real shapes.

Every op runs inside a `torch.profiler.record_function` scope that names its category
(`moe`, `dense`, `attention`, `allreduce`, `other`), inside structural scopes that name the
phase and step (`wb.prefill#<chunk>`, `wb.decode#<step>`) and the layer (`wb.layer#<i>`).
The trace links every GPU kernel to its launching CPU op, so the analysis layer reads the
category, phase, step and layer of each kernel from these scopes (see `analysis/rules.py`).

Routing is drawn at random (`presets.draw_routing`), seeded by the one seed rule
(`workloads.seeds`), so that its skew is under control; the router GEMM and its top-k still
run, for their cost, but their choice is replaced by the draw.

Dense projections run the chosen dense variant; an FP8 variant gets its weights quantised once,
when the model is built. The router (part of the MoE) and the LM head stay in bf16, as FP8
checkpoints of DeepSeek-style models ship them. The routed experts are bf16, or quantised once
at build to the `moe_format` the MoE kernels read (fp8 in 128x128 blocks, int4 in groups of 128).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from torch.profiler import record_function

import kernels.attention as attention_kernels
import kernels.dense as dense_kernels
import kernels.moe as moe_kernels
from kernels.compiled import interpreting
from workbench.errors import WorkbenchError
from workbench.presets import Preset, draw_routing
from workbench.workloads.glue_ops import Glue
from workbench.workloads.model_attention import decode_attention, prefill_attention
from workbench.workloads.model_backends import quantize_experts
from workbench.workloads.model_state import DecodeState, Plan
from workbench.workloads.model_weights import (
    DENSE_WEIGHTS,
    LayerWeights,
    Shard,
    ShardedInit,
    q_up_split,
    qkv_a_split,
)
from workbench.workloads.seeds import derive, generator, serving_dtype

__all__ = ["DENSE_WEIGHTS", "DecodeState", "LayerWeights", "Plan", "Shard", "SyntheticModel"]

# Variants that are Triton kernels, so they need a GPU; on the CPU their torch reference runs.
TORCH_REFERENCE = {"moe": "reference", "dense": "bf16", "attention": "torch"}


def _pick(kind: str, name: str, table: dict) -> Callable:
    try:
        return table[name]
    except KeyError:
        raise WorkbenchError(
            f"unknown {kind} variant '{name}'; known {kind} variants: {', '.join(table)}"
        ) from None


class SyntheticModel:
    """The layer stack at one rank's shapes, with a kernel variant chosen per category."""

    def __init__(
        self,
        preset: Preset,
        *,
        moe: str = "stock",
        dense: str = "bf16",
        attention: str = "torch",
        moe_format: str = "bf16",
        routing: str = "uniform",
        seed: int = 0,
        device: torch.device | str = "cpu",
        layers: int | None = None,
        shard: Shard | None = None,
        hybrid_m: int | None = None,
        dense_pdl: bool | None = False,
        interpret: bool = False,
    ):
        """`moe_format`: the routed experts' weights, one of `kernels.moe.FORMATS` (bf16; fp8
        in 128x128 blocks; int4 in groups of 128), quantised once here. `hybrid_m`: the largest
        row count the `hybrid` dense variant sends to W8A16 (None: $DENSE_HYBRID_M, else 128).
        `dense_pdl`: the W8A16 GEMMs' `pdl` option (kernels.pdl): False, None (where the GPU
        has it) or True.
        `interpret`: run the chosen Triton variants on the CPU too, under TRITON_INTERPRET=1
        (for tests; slow), instead of their torch references."""
        self.preset = preset
        # Without a shard, one process simulates rank 0 of the preset's own TP degree.
        self.shard = shard or Shard(tp=preset.simulated_tp)
        self.shapes = preset.rank_shapes(self.shard.tp)
        full = preset.rank_shapes(1)
        self.device = torch.device(device)
        # bf16 on the GPU, as served. The CPU stand-in computes in fp32: CPUs without bf16
        # matrix units run bf16 GEMMs some 30x slower, which would only measure the emulation.
        self.dtype = serving_dtype(self.device)
        self.layers = layers or preset.layers
        self.routing, self.seed = routing, seed
        self.variants = {"moe": moe, "dense": dense, "attention": attention}
        self.check_variants(**self.variants)
        if moe_format not in moe_kernels.FORMATS:
            raise WorkbenchError(
                f"unknown moe_format '{moe_format}'; the experts' formats are "
                f"{', '.join(moe_kernels.FORMATS)}"
            )
        if moe in moe_kernels.W8A8_VARIANTS and moe_format != "fp8":
            raise WorkbenchError(
                f"moe={moe} multiplies FP8 experts (W8A8); got moe_format={moe_format}: add "
                "moe_format=fp8"
            )
        self.moe_format = moe_format
        self.on_gpu = self.device.type == "cuda"
        self.glue = Glue(fused=self.on_gpu)  # as a server runs it; torch references on the CPU
        if interpret and not self.on_gpu and not interpreting():
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
        options = {"hybrid_m": hybrid_m} if dense_name == "hybrid" else {}
        if dense_name in ("w8a16", "hybrid"):
            options["pdl"] = dense_pdl
        if options:
            self.linear = partial(self.linear, **options)
        self.linear_group = dense_kernels.group_linear(dense_name, self.linear, **options)
        self.attention = _pick(
            "attention", self.kernels_run["attention"], attention_kernels.VARIANTS
        )
        distinct = min(preset.distinct_weight_sets, self.layers)
        self.weights = []
        for i in range(distinct):
            weights = LayerWeights(full, self.shard, self.device, self.dtype, seed, i,
                                   compressor=preset.compressed)  # fmt: skip
            if moe_format != "bf16":
                # Quantised as each set is drawn, so one set's bf16 experts are alive at a
                # time. The kernels take MoeWeights in the gate_up slot, with no w_down.
                weights.experts_gate_up = quantize_experts(
                    weights.experts_gate_up, weights.experts_down, moe_format
                )
                weights.experts_down = None
            self.weights.append(weights)
        dense_format = dense_kernels.WEIGHT_FORMAT[dense_name]
        if dense_format != "bf16":
            for weights in self.weights:
                weights.quantize_dense(dense_format)
        self.vocab_part = self.shard.part(full.vocab)  # vocab-parallel LM head
        self.lm_head = ShardedInit(self.device, self.dtype, seed, "model", "lm_head").take(
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
    def _routing(self, tokens: int, phase: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        seed = derive(self.seed, "model", "routing", self.routing, phase, layer)
        ids, weights = draw_routing(tokens, self.shapes.experts, self.shapes.top_k, self.routing,
                                    seed)  # fmt: skip
        return (
            torch.from_numpy(ids).to(self.device),
            torch.from_numpy(weights).to(self.device),
        )

    def inputs(self, plan: Plan) -> dict:
        """Hidden states and routing for a whole plan, made before profiling starts."""
        h, dev = self.shapes.hidden, self.device
        prompt = generator(dev, self.seed, "model", "prompt", plan.prompt_tokens)
        decode = generator(dev, self.seed, "model", "decode", plan.decode_tokens, plan.streams)
        return {
            "prompt": torch.randn(plan.prompt_tokens, h, generator=prompt, device=dev).to(
                self.dtype
            ),
            "decode": torch.randn(
                plan.decode_tokens, plan.streams, h, generator=decode, device=dev
            ).to(self.dtype),
            "prefill_routing": self._routings(plan.prompt_tokens, "prefill"),
            "decode_routing": self._decode_routing(plan),
        }

    def _decode_routing(self, plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
        """Every decode step's routing of every layer as two tensors, ids (steps, layers,
        streams, K) int32 and weights alike in fp32, so that a step loads all of its layers'
        routing with two copies (`DecodeState.load`) rather than two a layer: at 40 layers
        those copies were 80 launches of a decode step."""
        per_layer = self._routings(plan.decode_tokens * plan.streams, "decode")
        shape = (plan.decode_tokens, plan.streams, self.layers, self.shapes.top_k)
        ids, weights = (
            torch.stack([layer[part] for layer in per_layer], 1).view(shape).transpose(1, 2)
            .contiguous()
            for part in (0, 1)
        )  # fmt: skip
        return ids, weights

    def _routings(self, tokens: int, phase: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's routing for `phase`, drawn on threads: each layer has its own seed, so
        the draws are independent and identical to drawing them one by one, and numpy's
        random fills run without the GIL. A 33,863-token prompt at 384 experts draws 13M keys
        a layer; the H200 box's run.json put 7.6 s of "inputs" on 40 layers drawn one by one."""
        with ThreadPoolExecutor(max_workers=min(self.layers, os.cpu_count() or 1)) as pool:
            return list(pool.map(lambda i: self._routing(tokens, phase, i), range(self.layers)))

    # ---- one layer ----------------------------------------------------------------------
    def _attention_block(
        self,
        xn: torch.Tensor,
        w: LayerWeights,
        attend_to: Callable,
        positions: torch.Tensor | int,
        compress: bool = False,
    ) -> torch.Tensor:
        """The attention block of the normalised hidden states `xn` (the norm is fused with
        the previous layer's residual add, in `_layer`) of the tokens at `positions` (a
        device tensor, or the first of consecutive ones); with `compress`, the compressor's
        gates too (a layer that pools tokens into entries, `compressed`)."""
        s = self.shapes
        with record_function("dense"):
            q_low, kv, index_k, index_w = self.linear(xn, w.qkv_a).split(qkv_a_split(s), 1)
            gates = self.linear(xn, w.compress) if compress else None
        with record_function("other"):
            q_low = self.glue.norm(q_low, w.q_norm)
        with record_function("dense"):
            q_all = self.linear(q_low, w.q_up)
        with record_function("other"):
            kv = self.glue.norm(kv, w.kv_norm)
            self.glue.rope(q_all, (s.q_heads, s.index_heads), kv, index_k, positions, s.rope_dim)
            q, index_q = q_all.split(q_up_split(s), 1)
            q = q.view(-1, s.q_heads, s.head_dim)
            index_q = index_q.view(-1, s.index_heads, s.index_dim)
        out = attend_to(q, kv, index_q, index_k, index_w, gates)
        with record_function("dense"):
            groups = out.view(-1, s.o_groups, (s.q_heads // s.o_groups) * s.head_dim)
            low = self.linear_group(groups, w.o_a)
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
        self, xn: torch.Tensor, w: LayerWeights, routing: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """The MoE block of the normalised hidden states `xn` (the norm is fused with the
        residual add before it, in `_layer`)."""
        # the routing was drawn over the experts (`draw_routing`): in range by construction
        with record_function("moe"), moe_kernels.trusted_routing():
            logits = torch.matmul(xn, w.router.T)
            self.glue.router_topk(logits, self.shapes.top_k)  # run for its cost only
            routed = self.moe_fn(xn, routing[0], routing[1], w.experts_gate_up, w.experts_down)
        with record_function("dense"):
            shared = moe_kernels.shared_expert(
                xn, w.shared_gate_up, w.shared_down, linear=self.linear, act=self.glue.silu_mul
            )
        with record_function("other"):
            partial = routed + shared
        return self._all_reduce(partial)

    def _layer(
        self,
        i: int,
        x: torch.Tensor,
        pending: torch.Tensor | None,
        attend_to: Callable,
        routing: tuple[torch.Tensor, torch.Tensor],
        positions: torch.Tensor | int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `i` on the residual stream `x` plus `pending`, the previous layer's FFN output
        (None for the first layer). Returns (the residual stream, this layer's FFN output): the
        residual add is left to the next norm, which fuses it (`add_norm`), as engines do."""
        w = self.weights[i % len(self.weights)]
        with record_function(f"wb.layer#{i}"):
            with record_function("other"):
                x, xn = self.glue.add_norm(x, pending, w.attn_norm)
            compress = self.preset.attention_kind(i) in "CH"
            attn = self._attention_block(xn, w, attend_to, positions, compress)
            with record_function("other"):
                x, xn = self.glue.add_norm(x, attn, w.ffn_norm)
            return x, self._ffn_block(xn, w, routing)

    def _lm_head(self, xn: torch.Tensor) -> torch.Tensor:
        """The greedy next token of the final-normed hidden states `xn`."""
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

    # ---- the run ------------------------------------------------------------------------
    @contextmanager
    def step_scope(self, name: str, sync: bool = True) -> Iterator[None]:
        """The scope of one prefill chunk or decode step (`wb.prefill#i`, `wb.decode#i`),
        synchronised at its end as a server does to sample, unless `sync` is False (the
        caller waits for it later). Subclasses extend it to mark a step (the ncu target wraps
        one decode step in an NVTX range)."""
        with record_function(name):
            yield
        if self.on_gpu and sync:
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
                    x, pending = inputs["prompt"][start : start + size], None
                for i in range(self.layers):
                    with record_function("other"):
                        ids, weights = inputs["prefill_routing"][i]
                        routing = (ids[start : start + size], weights[start : start + size])
                    attend_to = prefill_attention(self.attention, self.shapes,
                                                  self.preset.attention_kind(i), state.cache,
                                                  i, start, size)  # fmt: skip
                    x, pending = self._layer(i, x, pending, attend_to, routing, start)
                    tick(1)
                if start + size == plan.prompt_tokens:
                    with record_function("other"):
                        _, last = self.glue.add_norm(x[-1:], pending[-1:], self.final_norm)
                    self._lm_head(last)

    def decode_step(self, state: DecodeState) -> None:
        """One decode step on the static buffers: the same work eagerly or as a graph replay."""
        x, pending = state.x, None
        with record_function("other"):
            state.advance()
        for i in range(self.layers):
            attend_to = decode_attention(self.attention, self.shapes,
                                         self.preset.attention_kind(i), state, i)  # fmt: skip
            with record_function("other"):
                routing = (state.ids[i], state.weights[i])
            x, pending = self._layer(i, x, pending, attend_to, routing, state.pos)
        with record_function("other"):
            x, xn = self.glue.add_norm(x, pending, self.final_norm)
        tokens = self._lm_head(xn)
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
        tokens, sampled = [], None
        for step in range(plan.decode_tokens):
            # Replaying graphs, the host launches a step before it waits for the previous
            # one's token, as a server's overlap scheduler does: a synchronous loop leaves the
            # GPU idle for every graph launch, 1.0 to 1.9 ms a step under the profiler against
            # 0.05 to 0.75 ms without it on the H200 (docs/design.md). Eager steps stay synchronous,
            # so that an eager profile still shows what launching costs.
            with self.step_scope(f"wb.decode#{step}", sync=replay is None):
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
            if replay is not None:
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(self.device))
                if sampled is not None:
                    sampled.synchronize()  # the previous step's token, while this one runs
                sampled = done
        if sampled is not None:
            sampled.synchronize()
        return torch.stack(tokens).cpu().numpy()
