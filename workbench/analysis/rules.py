"""Kernel categories as an ordered registry of regular expressions (as HTA's GroupingPattern).

A kernel's category comes first from the *range* that launched it (the workbench's model runs
every op inside `record_function` scopes named `moe`, `dense`, `attention`, `allreduce`,
`other`), then from the launching *op* (`aten::_grouped_mm` is MoE whatever the CUTLASS kernel
is called), and only then from the *kernel* name. Within each kind the innermost enclosing
range or op decides, and within one name the first matching rule wins. Users extend the
registry by passing their own rules ahead of `DEFAULT_RULES`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

MatchOn = Literal["range", "op", "kernel"]

MOE, DENSE, SPARSE_ATTENTION, ATTENTION, ALL_REDUCE, OTHER = (
    "MoE",
    "Dense GEMM",
    "Sparse attention",
    "Attention",
    "All-reduce",
    "Other",
)
CATEGORIES = (MOE, DENSE, SPARSE_ATTENTION, ATTENTION, ALL_REDUCE, OTHER)
# Always shown in tables, even at zero, so runs line up like the seed's tables.
CORE_CATEGORIES = (MOE, DENSE, ALL_REDUCE, OTHER)


@dataclass(frozen=True)
class Rule:
    """`pattern` (a regular expression, searched) on a range, op or kernel name -> category."""

    match_on: MatchOn
    pattern: str
    category: str

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


DEFAULT_RULES: tuple[Rule, ...] = (
    # The workbench's own scopes.
    Rule("range", r"^moe$", MOE),
    Rule("range", r"^dense$", DENSE),
    Rule("range", r"^attention$", SPARSE_ATTENTION),
    Rule("range", r"^allreduce$", ALL_REDUCE),
    Rule("range", r"^other$", OTHER),
    # Launching ops of external traces (vLLM, SGLang, HF transformers).
    Rule("op", r"^aten::_grouped_mm$|fused_moe|^(vllm|sglang|_moe_C)::.*moe", MOE),
    Rule("op", r"^c10d::(all_reduce|allreduce_|reduce_scatter|all_gather)|^nccl:", ALL_REDUCE),
    Rule(
        "op",
        r"^aten::(_scaled_dot_product|_flash_attention|_efficient_attention|_cudnn_attention)"
        r"|flash_attn|^vllm::unified_attention",
        ATTENTION,
    ),
    Rule("op", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|_int_mm)$", DENSE),
    # Kernel names, when nothing above decides.
    Rule("kernel", r"(?i)fused_moe|moe_align|grouped_mm|grouped_gemm|_moe_", MOE),
    Rule("kernel", r"(?i)nccl|all_reduce|allreduce|cross_device_reduce", ALL_REDUCE),
    Rule("kernel", r"(?i)flash|fmha|attention|attn_|cudnn.*(sdpa|mha)", ATTENTION),
    Rule("kernel", r"(?i)gemm|cutlass|nvjet|cublas|xmma|gemv|matmul|sm90_", DENSE),
)

# On a CPU run a collective blocks in its scope, outside every op (gloo waits on a worker
# thread), so these scopes are rows of their own, spanning the whole collective.
OPAQUE_RANGES = re.compile(r"^allreduce$")

# Structural ranges: phase and step of a run, and the layer.
PHASE_PATTERNS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"^wb\.(?P<phase>prefill|decode)#(?P<step>\d+)$"), None),
    (re.compile(r"(?i)^(?P<phase>prefill|decode)\b(?:\D*(?P<step>\d+))?"), None),
    (re.compile(r"^ProfilerStep#(?P<step>\d+)$"), "all"),
)
LAYER_PATTERN = re.compile(r"^wb\.layer#(?P<layer>\d+)$|\blayers\.(?P<module_layer>\d+)\b")


def category_order(present: set[str]) -> list[str]:
    """Canonical row order: known categories first, then any user categories, alphabetically."""
    known = [c for c in CATEGORIES if c in present or c in CORE_CATEGORIES]
    return known + sorted(present - set(CATEGORIES))
