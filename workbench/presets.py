"""Model shapes and routing generators, kept as data so anyone can correct them.

A preset describes the *whole* model (as publicly described) and the tensor-parallel degree
whose single rank the synthetic model simulates on one device: `dsv4-flash-tp2` is one rank of
a TP2 deployment, so every sharded dimension is halved in `rank_shapes()`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from workbench.errors import WorkbenchError


@dataclass(frozen=True)
class Preset:
    """Whole-model shapes, from the public description of the model. The attention numbers
    are approximate (`docs/design.md`, the workload)."""

    name: str
    description: str
    hidden: int
    layers: int
    vocab: int
    experts: int
    top_k: int
    expert_intermediate: int
    shared_experts: int
    q_heads: int
    head_dim: int
    kv_heads: int
    q_lora_rank: int
    o_groups: int
    o_group_rank: int
    index_heads: int
    index_dim: int
    index_topk: int
    window: int
    simulated_tp: int
    distinct_weight_sets: int
    dense_weight_dtype: str
    # DeepSeek-V4's attention, one letter a layer from the first (docs/seed-study.md; a preset
    # run with fewer layers takes the first letters): "" runs V3.2's sparse
    # attention in every layer (D); W is the sliding window alone; C (CSA) pools `csa_ratio`
    # tokens to a cache entry, which the indexer scores and the top-k picks from; H (HCA) pools
    # `hca_ratio` tokens to an entry and attends to every entry. C and H keep the window too.
    attention_layers: str = ""
    csa_ratio: int = 4
    hca_ratio: int = 128

    def rank_shapes(self, tp: int | None = None) -> RankShapes:
        """Per-rank shapes under tensor parallelism `tp` (default: the preset's own degree)."""
        tp = self.simulated_tp if tp is None else tp
        for what, total in (
            ("query heads", self.q_heads),
            ("expert intermediate size", self.expert_intermediate),
            ("output projection groups", self.o_groups),
        ):
            if total % tp:
                raise WorkbenchError(
                    f"tp={tp} does not divide the {what} ({total}) of preset '{self.name}'; "
                    f"pick a tp that divides {total}."
                )
        return RankShapes(
            hidden=self.hidden,
            vocab=self.vocab // tp,
            experts=self.experts,
            top_k=self.top_k,
            expert_intermediate=self.expert_intermediate // tp,
            shared_intermediate=self.shared_experts * self.expert_intermediate // tp,
            q_heads=self.q_heads // tp,
            head_dim=self.head_dim,
            q_lora_rank=self.q_lora_rank,
            o_groups=self.o_groups // tp,
            o_group_rank=self.o_group_rank,
            index_heads=self.index_heads,
            index_dim=self.index_dim,
            index_topk=self.index_topk,
            window=self.window,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def attention_kind(self, layer: int) -> str:
        """Layer `layer`'s attention: D (V3.2's sparse), W (window), C (CSA) or H (HCA)."""
        return self.attention_layers[layer] if self.attention_layers else "D"

    def compress_ratio(self, kind: str) -> int:
        """Tokens pooled into one cache entry by a layer of `kind` (0: none)."""
        return {"C": self.csa_ratio, "H": self.hca_ratio}.get(kind, 0)

    @property
    def compressed(self) -> bool:
        """Whether some layer pools tokens into entries (and so has a compressor)."""
        return any(kind in "CH" for kind in self.attention_layers)

    def validate(self) -> None:
        """Reject impossible shapes with a message that names the field and the fix."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and value < 1:
                raise WorkbenchError(f"preset field {f.name}={value} must be at least 1.")
        if self.top_k > self.experts:
            raise WorkbenchError(
                f"top_k={self.top_k} is larger than the number of experts ({self.experts}); "
                f"use top_k <= {self.experts}."
            )
        if self.attention_layers and (
            len(self.attention_layers) < self.layers or set(self.attention_layers) - set("DWCH")
        ):
            raise WorkbenchError(
                f"attention_layers={self.attention_layers!r} must give each of the {self.layers} "
                "layers one of D (sparse), W (window), C (CSA) or H (HCA), the first layers "
                "taking the first letters; or be empty."
            )
        if self.q_heads % self.o_groups:
            raise WorkbenchError(
                f"o_groups={self.o_groups} does not divide q_heads={self.q_heads}; "
                "pick a divisor of the head count."
            )
        self.rank_shapes()


@dataclass(frozen=True)
class RankShapes:
    """The shapes one rank computes with."""

    hidden: int
    vocab: int
    experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int
    q_heads: int
    head_dim: int
    q_lora_rank: int
    o_groups: int
    o_group_rank: int
    index_heads: int
    index_dim: int
    index_topk: int
    window: int

    @property
    def rope_dim(self) -> int:
        """The rotary part of each query and key head (`kernels.rope`): DeepSeek rotates 64
        dims of the latent and of each indexer head; a smaller preset half its index dim."""
        return min(64, self.index_dim // 2, self.head_dim // 2)

    def weight_bytes_per_layer(self, element_bytes: int = 2) -> int:
        """Bytes of one layer's weights (all projections, experts and shared expert)."""
        h, heads, d = self.hidden, self.q_heads, self.head_dim
        dense = (
            h * self.q_lora_rank
            + self.q_lora_rank * heads * d
            + h * d
            + self.q_lora_rank * self.index_heads * self.index_dim
            + h * self.index_dim
            + h * self.index_heads
            + self.o_groups * self.o_group_rank * (heads // self.o_groups) * d
            + self.o_groups * self.o_group_rank * h
            + h * self.experts
            + 3 * h * self.shared_intermediate
        )
        experts = self.experts * 3 * h * self.expert_intermediate
        return (dense + experts) * element_bytes

    def cache_bytes_per_token(self, layers: int, element_bytes: int = 2) -> int:
        """KV-cache and indexer-key bytes one prompt token costs across all layers."""
        return layers * (self.head_dim + self.index_dim) * element_bytes


DSV4_FLASH_TP2 = Preset(
    name="dsv4-flash-tp2",
    description=(
        "The seed's model as publicly described, one rank of tensor parallelism 2: hidden "
        "5120, 384 routed experts top-6 of intermediate 2304, one shared expert, 40 layers; "
        "64 query heads of 512 over one KV head, top-512 sparse attention plus a 128 window."
    ),
    hidden=5120,
    layers=40,
    vocab=129_280,
    experts=384,
    top_k=6,
    expert_intermediate=2304,
    shared_experts=1,
    q_heads=64,
    head_dim=512,
    kv_heads=1,
    q_lora_rank=1280,
    o_groups=8,
    o_group_rank=1024,
    # The indexer's size is not in the public description; DeepSeek-V3.2's (64 x 128), and
    # V3.2's attention: DeepSeek-V4 pools 4 tokens into one entry before its indexer (CSA)
    # or 128 with no indexer (HCA), which this preset does not model. Its published
    # configuration also differs in hidden size, experts and layers (docs/seed-study.md).
    index_heads=64,
    index_dim=128,
    index_topk=512,
    window=128,
    simulated_tp=2,
    # 40 layers of experts do not fit one H200: cycle a few weight sets, each far over L2.
    distinct_weight_sets=3,
    dense_weight_dtype="float8_e4m3fn",
)

# The published configuration's shapes; everything else, the attention included, as above.
DSV4_FLASH_HF_TP2 = replace(
    DSV4_FLASH_TP2,
    name="dsv4-flash-hf-tp2",
    description=(
        "DeepSeek-V4-Flash's shapes as Hugging Face transformers' DeepseekV4Config gives "
        "them, one rank of tensor parallelism 2: hidden 4096, 256 routed experts top-6 of "
        "intermediate 2048, one shared expert, 43 layers; attention as dsv4-flash-tp2 runs "
        "it (V3.2's sparse attention in every layer: V4's CSA and HCA layers, which pool "
        "the sequence 4 or 128 tokens to an entry, are not modelled)."
    ),
    hidden=4096,
    layers=43,
    experts=256,
    expert_intermediate=2048,
    q_lora_rank=1024,
)

PRESETS: dict[str, Preset] = {
    "dsv4-flash-tp2": DSV4_FLASH_TP2,
    "dsv4-flash-hf-tp2": DSV4_FLASH_HF_TP2,
    # The published shapes with V4's attention: 2 window layers, then CSA and HCA alternating
    # (the per-layer compression ratios public V4-Flash training recipes give).
    "dsv4-flash-v4-tp2": replace(
        DSV4_FLASH_HF_TP2,
        name="dsv4-flash-v4-tp2",
        description=(
            "DeepSeek-V4-Flash as dsv4-flash-hf-tp2 gives its shapes, with V4's attention: of "
            "43 layers, 2 attend to a 128-token window only, 21 are CSA (4 tokens pooled to a "
            "cache entry, the indexer's top-512 entries plus the window) and 20 HCA (128 tokens "
            "to an entry, every entry plus the window)."
        ),
        attention_layers="WWC" + "HC" * 20,
    ),
    "tiny": Preset(
        name="tiny",
        description=(
            "The same structure scaled down so a 33,863-token profile finishes in seconds on "
            "two CPU cores."
        ),
        hidden=64,
        layers=2,
        vocab=512,
        experts=16,
        top_k=4,
        expert_intermediate=64,
        shared_experts=1,
        q_heads=4,
        head_dim=32,
        kv_heads=1,
        q_lora_rank=32,
        o_groups=2,
        o_group_rank=32,
        index_heads=2,
        index_dim=16,
        index_topk=16,
        window=8,
        simulated_tp=2,
        distinct_weight_sets=2,
        dense_weight_dtype="float8_e4m3fn",
    ),
}

ROUTINGS = ("uniform", "skewed")


def get_preset(name: str) -> Preset:
    """The preset called `name`; an unknown name lists the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise WorkbenchError(
            f"unknown preset '{name}'; known presets: {', '.join(PRESETS)}"
        ) from None


def with_overrides(preset: Preset, **overrides: int) -> Preset:
    """A copy of `preset` with some shapes changed (for small experiments and tests)."""
    known = {f.name for f in fields(Preset)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise WorkbenchError(f"unknown preset fields {unknown}; known: {sorted(known)}")
    return replace(preset, **overrides)


def draw_routing(
    tokens: int, experts: int, top_k: int, routing: str, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded expert choices (tokens, top_k) int32 and routing weights (tokens, top_k) float32.

    `uniform`: every token picks top_k distinct experts with equal odds. `skewed`: Zipf-like
    popularity (expert of popularity rank r has weight 1/(r+1)), with the ranks shuffled so the
    popular experts are not simply the low ids. Skew matters for schedulers: the seed's flat
    scheduler gained 1.6x on uniform routing and 1.95x on skewed.
    """
    if top_k > experts:
        raise WorkbenchError(
            f"top_k={top_k} is larger than the number of experts ({experts}); "
            f"use top_k <= {experts}."
        )
    if routing not in ROUTINGS:
        raise WorkbenchError(f"unknown routing '{routing}'; known: {', '.join(ROUTINGS)}")
    rng = np.random.default_rng(seed)
    if routing == "uniform":
        keys = rng.random((tokens, experts))
    else:
        popularity = 1.0 / np.arange(1, experts + 1)
        popularity = popularity[rng.permutation(experts)]
        # Gumbel-top-k draws top_k distinct experts with probabilities proportional to weight.
        keys = np.log(popularity)[None, :] + rng.gumbel(size=(tokens, experts))
    ids = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k].astype(np.int32)
    logits = rng.standard_normal((tokens, top_k))
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return ids, weights.astype(np.float32)
