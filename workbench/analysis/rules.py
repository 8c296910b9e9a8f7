"""Kernel categories as ordered tables of regular expressions (as HTA's GroupingPattern).

A kernel's category is decided, first decider wins, by:

1. the innermost enclosing *range* with a range rule: the workbench's model runs every op in
   `record_function` scopes named `moe`, `dense`, `attention`, `allreduce`, `other`;
2. a *collective*: a launching op or kernel name with an All-reduce rule. Communication is
   communication wherever it is launched, even inside a module (vLLM all-reduces inside
   `RowParallelLinear` and `FusedMoE`);
3. the *module* path, in traces taken `with_stack=True` (`nn.Module: <Class>_<i>` events): the
   class names from outermost to innermost joined by `/`, so a rule can say "a Linear inside
   an Attention". An MoE block's router, permutation and combine are MoE this way;
4. the launching *op*, innermost matching first (`aten::_grouped_mm` is MoE whatever CUTLASS
   calls its kernel);
5. the *kernel* name: the only evidence left for kernels launched outside any op (Triton
   kernels launched directly) and for kernels replayed from CUDA graphs;
6. otherwise Other (`default`).

Within one kind the first matching rule wins, so specific rows precede generic ones. Every
rule has a short `name`, recorded in the kernel table's `rule` column, so `attribution()`
shows which rule decided how many kernels. Users pass their own rules ahead of
`DEFAULT_RULES`, e.g. `Rule("kernel", r"^my_moe_kernel$", "MoE")`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import pandas as pd

from workbench.errors import WorkbenchError

MatchOn = Literal["range", "module", "op", "kernel"]
MATCH_ON = ("range", "module", "op", "kernel")

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

# The `rule` of kernels no rule claimed, and of graph replays labelled by their eager step.
DEFAULT_RULE = "default"
GRAPH_POSITION_RULE = "eager signature position"


@dataclass(frozen=True)
class Rule:
    """`pattern` (a regular expression, searched) on a range, module path, op or kernel name
    -> `category`. `name` is what the kernel table's `rule` column records (short, since it
    repeats on every row); `what` says what the pattern stands for."""

    match_on: MatchOn
    pattern: str
    category: str
    name: str = ""
    what: str = ""

    def __post_init__(self) -> None:
        if self.match_on not in MATCH_ON:
            raise WorkbenchError(
                f"Rule match_on {self.match_on!r} is not one of {', '.join(MATCH_ON)}."
            )
        try:
            re.compile(self.pattern)
        except (re.error, TypeError) as err:
            raise WorkbenchError(
                f"Rule pattern {self.pattern!r} is not a regular expression ({err})."
            ) from None

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)

    @property
    def label(self) -> str:
        """The rule's name in the kernel table: `name`, or the pattern of an unnamed rule."""
        return self.name or self.pattern


# Rows of (name, pattern, category, what it is). Kernel names are searched; first match wins.
# fmt: off
KERNEL_NAME_RULES: tuple[tuple[str, str, str, str], ...] = (
    # The workbench's own Triton kernels (kernels/, `@triton.jit` functions that are launched).
    ("workbench MoE GEMM",
     r"^_(stock|flat|padded|w8a8)_(gate_up|down)(_wgmma)?_kernel$|^_bf16_wgmma_kernel$"
     r"|^_int4_mma_kernel$|^silu_reduce_kernel$|^_widen_kernel$|^_fp16_rows_kernel$", MOE,
     "kernels/moe: stock, flat, padded and W8A8 expert GEMMs (Triton, and on sm_90 the Gluon "
     "W8A8 and bf16 ones, FP8 and INT4 experts widened to bf16 for the latter at prefill, and "
     "INT4 experts at decode on mma.sync, whose gate/up takes token rows made fp16) and the "
     "split-K gate/up reduce"),
    ("workbench MoE routing",
     r"^_(counts|offsets_serial|offsets_parallel|permute|small_layout|block_experts|combine|"
     r"row_table|router_topk)_kernel$", MOE, "kernels/moe routing: expert counts, offsets, "
     "permutation (all three in one launch at decode sizes), the Gluon kernels' table of row "
     "tiles and the weighted combine; the router's fused top-k and softmax (kernels/glue)"),
    ("workbench dense GEMM",
     r"^_(w8a16|w8a16_wgmma|w8a8|w8a8_tma|w8a8_wgmma|w8a8_wide|quantize_rows)_kernel$",
     DENSE, "kernels/dense: W8A16 and W8A8 GEMMs (Triton and Gluon) and the W8A8 activation "
     "quantizer"),
    ("workbench sparse attention",
     r"^_(sparse_attention|sparse_combine|indexer|indexer_fp8|indexer_fp8_rows|indexer_fp8_tma"
     r"|select|sampled_select|second_round|chunk_picks|write_cache|pool_groups|compress_step"
     r"|csa_rows)_kernel$",
     SPARSE_ATTENTION, "kernels/attention: sparse attention, its split-KV merge, the bf16 and "
     "FP8 indexers, the top-k select (one program a row, plain or from a sampled threshold, or "
     "chunked: second round and picks), the FP8 cache write, and DeepSeek-V4's compressor "
     "(groups pooled at prefill, a decode step's compressor work, a CSA query's rows)"),
    ("workbench glue", r"^_(rms_norm|silu_mul|rope)_kernel$", OTHER,
     "kernels/glue: RMSNorm with its residual add, SiLU-and-multiply, and RoPE on a layer's "
     "query and key heads, one launch each"),
    # TorchInductor: templates are GEMMs, the fused pointwise/reduction kernels are glue.
    ("inductor template GEMM", r"^triton_tem_", DENSE,
     "torch.compile max-autotune GEMM templates (flex attention templates are named alike)"),
    ("inductor glue", r"^triton_(poi|red|per)_", OTHER,
     "torch.compile fused pointwise, reduction and persistent-reduction kernels"),
    # Mixture of experts.
    ("DeepGEMM grouped GEMM", r"m_grouped|MGrouped", MOE,
     "DeepGEMM m_grouped_fp8_gemm / m_grouped_bf16_gemm (contiguous and masked layouts)"),
    ("MoE kernel", r"(?i)moe", MOE,
     "vLLM/SGLang fused_moe_kernel (Triton), moe_align_block_size, vllm::moe:: topk-gating "
     "softmax and moe_sum, Marlin MoE (marlin_moe_wna16), TensorRT-LLM MoE routing"),
    ("grouped GEMM", r"(?i)grouped_?(gemm|mm|matmul)|GroupProblemShape|PtrArray|matmul_ogs",
     MOE, "Triton and CUTLASS grouped GEMMs (one GEMM per expert), triton_kernels matmul_ogs"),
    ("DeepEP", r"deep_ep", MOE, "DeepEP expert-parallel dispatch and combine"),
    # Sparse attention (DeepSeek V3.2 style), before dense attention.
    ("DeepGEMM MQA logits", r"(?i)mqa_logits", SPARSE_ATTENTION,
     "DeepGEMM fp8_mqa_logits / paged_mqa_logits: the lightning indexer's scores"),
    ("sparse attention", r"(?i)sparse\w*(mla|attn|attention)|indexer", SPARSE_ATTENTION,
     "FlashMLA sparse kernels and top-k indexers"),
    # Collectives.
    ("NCCL", r"(?i)nccl", ALL_REDUCE, "NCCL collectives (ncclDevKernel_AllReduce_...)"),
    ("custom all-reduce",
     r"(?i)all_?reduce|cross_device_reduce|all_?gather|reduce_?scatter|multimem", ALL_REDUCE,
     "vLLM/SGLang custom all-reduce (cross_device_reduce_1stage/2stage), symmetric-memory "
     "one_shot/two_shot all-reduce, TensorRT-LLM allreduce fusion"),
    # Attention.
    ("flash attention", r"(?i)flash|fmha", ATTENTION,
     "FlashAttention, FlashInfer, FlashMLA, cuDNN SDPA flash, CUTLASS fmha"),
    ("MLA attention", r"(?i)(^|[^a-z])mla([^a-z]|$)", ATTENTION,
     "multi-head latent attention kernels (FlashMLA, FlashInfer MLA, concat_and_cache_mla)"),
    ("paged attention",
     r"(?i)paged_?attention|PagedKVCache|WithKVCache|reshape_and_cache|unified_attention",
     ATTENTION, "vLLM paged attention and KV-cache writes, FlashInfer batch prefill/decode"),
    ("attention", r"(?i)attention|attn_|_attn|cudnn.*(sdpa|mha)", ATTENTION,
     "other kernels named after attention (Triton _attn_fwd, ...)"),
    # Dense GEMMs.
    ("Marlin", r"(?i)marlin", DENSE, "Marlin GPTQ/AWQ mixed-precision GEMM (MoE Marlin is above)"),
    ("humming", r"(?i)humming", DENSE,
     "inclusionAI humming JIT GEMM; one kernel serves dense and MoE GEMMs and its name does "
     "not say which, so a module or op decides first when the trace has one"),
    ("DeepGEMM", r"(?i)fp8_gemm|bf16_gemm|deep_gemm", DENSE, "DeepGEMM fp8_gemm / bf16_gemm"),
    ("Triton matmul", r"(?i)(^|_)b?mm_kernel|matmul", DENSE,
     "Triton matmul_kernel / mm_kernel launched directly"),
    ("vendor GEMM", r"(?i)gemm|gemv|cutlass|nvjet|cublas|xmma|sm90_|sm80_|sm100_", DENSE,
     "cuBLAS/cuBLASLt (nvjet, sm90_xmma, gemv, splitKreduce), CUTLASS, other *gemm* kernels"),
)
# fmt: on

# Module paths, e.g. `Qwen2MoeForCausalLM/.../Qwen2MoeSparseMoeBlock/Qwen2MoeTopKRouter`.
# `(^|/)[^/]*X(/|$)` is "a class whose name ends in X, anywhere on the path".
_MOE_CLASS = r"(SparseMoeBlock|MoE|Moe|MoeLayer|TopKRouter|TopkRouter|Router|Experts?|SparseMLP)"
_SPARSE_CLASS = r"[^/]*(Indexer|Sparse[^/]*Att|NativeSparse|DeepseekV32[^/]*Attention)[^/]*"
# fmt: off
MODULE_RULES: tuple[tuple[str, str, str, str], ...] = (
    ("MoE block module", rf"(^|/)[^/]*{_MOE_CLASS}(/|$)", MOE,
     "everything an MoE block launches: router, top-k, permutation, experts, combine and the "
     "shared expert inside the block (HF SparseMoeBlock/Experts/TopKRouter, vLLM FusedMoE)"),
    ("attention projection",
     r"(^|/)[^/]*(Attention|Attn|Indexer)[^/]*/([^/]+/)*[^/]*Linear[^/]*$", DENSE,
     "q/k/v/o projections: Linear modules (QKVParallelLinear, RowParallelLinear) inside "
     "an attention, as the workbench's own model counts them"),
    ("sparse attention module", rf"(^|/){_SPARSE_CLASS}(/|$)", SPARSE_ATTENTION,
     "attention of a sparse model: top-k indexers, classes named Sparse...Attention, "
     "DeepSeek V3.2 attention"),
    ("attention module", r"(^|/)[^/]*(Attention|Attn)[^/]*(/|$)", ATTENTION,
     "the rest of an attention module: scores, softmax, rotary embedding, KV-cache writes"),
    ("MLP module", r"(^|/)[^/]*(MLP|Mlp|FeedForward|FFN)[^/]*(/|$)", DENSE,
     "a dense MLP outside any MoE block, activation included"),
)

OP_RULES: tuple[tuple[str, str, str, str], ...] = (
    ("MoE op", r"^aten::_grouped_mm$|fused_moe|^(vllm|sglang|_moe_C)::.*moe|^_moe_C::", MOE,
     "aten::_grouped_mm (HF experts), vLLM/SGLang MoE custom ops"),
    ("collective op",
     r"^c10d::(all_reduce|allreduce_|reduce_scatter|all_gather)|^nccl:"
     r"|^(vllm|sglang)::.*(all_reduce|all_gather|reduce_scatter)|^_C_custom_ar::|^symm_mem::",
     ALL_REDUCE, "c10d and NCCL collectives, vLLM/SGLang all-reduce ops"),
    ("attention op",
     r"^aten::(_scaled_dot_product|_flash_attention|_efficient_attention|_cudnn_attention)"
     r"|flash_attn|^vllm::.*attention",
     ATTENTION, "SDPA and flash-attention ops, vLLM attention ops"),
    ("GEMM op", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|_int_mm)$", DENSE,
     "aten matrix products"),
)

RANGE_RULES: tuple[tuple[str, str, str, str], ...] = (
    ("scope moe", r"^moe$", MOE, "the workbench's `moe` scope"),
    ("scope dense", r"^dense$", DENSE, "the workbench's `dense` scope"),
    ("scope attention", r"^attention$", SPARSE_ATTENTION, "the workbench's `attention` scope"),
    ("scope allreduce", r"^allreduce$", ALL_REDUCE, "the workbench's `allreduce` scope"),
    ("scope other", r"^other$", OTHER, "the workbench's `other` scope"),
)
# fmt: on


def _rules(kind: MatchOn, rows: tuple[tuple[str, str, str, str], ...]) -> tuple[Rule, ...]:
    return tuple(Rule(kind, p, category, name, what) for name, p, category, what in rows)


DEFAULT_RULES: tuple[Rule, ...] = (
    *_rules("range", RANGE_RULES),
    *_rules("module", MODULE_RULES),
    *_rules("op", OP_RULES),
    *_rules("kernel", KERNEL_NAME_RULES),
)

# On a CPU run a collective blocks in its scope, outside every op (gloo waits on a worker
# thread), so these scopes are rows of their own, spanning the whole collective.
OPAQUE_RANGES = re.compile(r"^allreduce$")

# Structural ranges: phase and step of a run, and the layer. A phase range without a step
# number ("decode", as users write it around each step) is numbered by its occurrence.
PHASE_PATTERNS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"^wb\.(?P<phase>prefill|decode)#(?P<step>\d+)$"), None),
    (re.compile(r"(?i)^(?P<phase>prefill|decode)(?![a-z])(?:\D*?(?P<step>\d+))?"), None),
    (re.compile(r"^ProfilerStep#(?P<step>\d+)$"), "all"),
)
LAYER_PATTERN = re.compile(r"^wb\.layer#(?P<layer>\d+)$|\blayers\.(?P<module_layer>\d+)\b")
MODULE_EVENT = re.compile(r"^nn\.Module: (?P<cls>.+?)(_\d+)?$")  # with_stack module scopes


def rules_table(rules: tuple[Rule, ...] = DEFAULT_RULES) -> pd.DataFrame:
    """The rules in resolution order: kind, name, category, pattern and what each stands for."""
    return pd.DataFrame(
        [(r.match_on, r.label, r.category, r.pattern, r.what) for r in rules],
        columns=["match_on", "rule", "category", "pattern", "what"],
    )


def category_order(present: set[str]) -> list[str]:
    """Canonical row order: known categories first, then any user categories, alphabetically."""
    known = [c for c in CATEGORIES if c in present or c in CORE_CATEGORIES]
    return known + sorted(present - set(CATEGORIES))
