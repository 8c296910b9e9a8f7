"""The default rules, one example per rule: a kernel name, module path or op -> its category.

Kernel names are the ones serving engines launch (as they appear in torch.profiler traces);
every rule of the tables in `workbench/analysis/rules.py` must be the deciding rule of at
least one example here, so a rule added without an example fails `test_every_rule_has_an_example`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.analysis.attribute import Frame, Resolver
from workbench.analysis.rules import (
    DEFAULT_RULES,
    KERNEL_NAME_RULES,
    MODULE_RULES,
    OP_RULES,
    RANGE_RULES,
    Rule,
    rules_table,
)
from workbench.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[1]

# (kernel name, category, deciding rule)
KERNELS = [
    # the workbench's own Triton kernels
    ("_stock_gate_up_kernel", "MoE", "workbench MoE GEMM"),
    ("_stock_down_kernel", "MoE", "workbench MoE GEMM"),
    ("_flat_gate_up_kernel", "MoE", "workbench MoE GEMM"),
    ("_flat_down_kernel", "MoE", "workbench MoE GEMM"),
    ("_padded_down_kernel", "MoE", "workbench MoE GEMM"),
    ("_w8a8_gate_up_kernel", "MoE", "workbench MoE GEMM"),
    ("_w8a8_down_kernel", "MoE", "workbench MoE GEMM"),
    ("silu_reduce_kernel", "MoE", "workbench MoE GEMM"),
    ("_counts_kernel", "MoE", "workbench MoE routing"),
    ("_offsets_serial_kernel", "MoE", "workbench MoE routing"),
    ("_permute_kernel", "MoE", "workbench MoE routing"),
    ("_small_layout_kernel", "MoE", "workbench MoE routing"),
    ("_combine_kernel", "MoE", "workbench MoE routing"),
    ("_sparse_combine_kernel", "Sparse attention", "workbench sparse attention"),
    ("_indexer_fp8_kernel", "Sparse attention", "workbench sparse attention"),
    ("_indexer_fp8_rows_kernel", "Sparse attention", "workbench sparse attention"),
    ("_indexer_fp8_tma_kernel", "Sparse attention", "workbench sparse attention"),
    ("_select_kernel", "Sparse attention", "workbench sparse attention"),
    ("_write_cache_kernel", "Sparse attention", "workbench sparse attention"),
    ("_pool_groups_kernel", "Sparse attention", "workbench sparse attention"),
    ("_compress_step_kernel", "Sparse attention", "workbench sparse attention"),
    ("_csa_rows_kernel", "Sparse attention", "workbench sparse attention"),
    ("_block_experts_kernel", "MoE", "workbench MoE routing"),
    ("_w8a16_kernel", "Dense GEMM", "workbench dense GEMM"),
    ("_w8a8_kernel", "Dense GEMM", "workbench dense GEMM"),
    ("_w8a8_tma_kernel", "Dense GEMM", "workbench dense GEMM"),
    ("_w8a8_wgmma_kernel", "Dense GEMM", "workbench dense GEMM"),
    ("_w8a8_wide_kernel", "Dense GEMM", "workbench dense GEMM"),
    ("_rms_norm_kernel", "Other", "workbench glue"),
    ("_silu_mul_kernel", "Other", "workbench glue"),
    ("_rope_kernel", "Other", "workbench glue"),
    ("_quantize_rows_kernel", "Dense GEMM", "workbench dense GEMM"),
    ("_sparse_attention_kernel", "Sparse attention", "workbench sparse attention"),
    ("_indexer_kernel", "Sparse attention", "workbench sparse attention"),
    # TorchInductor
    ("triton_tem_fused_mm_0", "Dense GEMM", "inductor template GEMM"),
    ("triton_poi_fused_add_mul_0", "Other", "inductor glue"),
    ("triton_red_fused__to_copy_mean_pow_1", "Other", "inductor glue"),
    ("triton_per_fused_add_matmul_2", "Other", "inductor glue"),
    # MoE: vLLM, SGLang, DeepGEMM, CUTLASS, triton_kernels, DeepEP
    ("fused_moe_kernel", "MoE", "MoE kernel"),
    ("fused_moe_kernel_gptq_awq", "MoE", "MoE kernel"),
    ("void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*)", "MoE", "MoE kernel"),
    (
        "void vllm::moe::topkGatingSoftmax<8, 128, 4, 16, 32, int>(float const*)",
        "MoE",
        "MoE kernel",
    ),  # fmt: skip
    ("void marlin_moe_wna16::Marlin<__nv_bfloat16, 4, 8, 8>(int4 const*)", "MoE", "MoE kernel"),
    (
        "void deep_gemm::sm90_m_grouped_fp8_gemm_contiguous_impl<128>(int*)",
        "MoE",
        "DeepGEMM grouped GEMM",
    ),  # fmt: skip
    ("grouped_matmul_kernel", "MoE", "grouped GEMM"),
    (
        "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_17GroupProblemShapeE",
        "MoE",
        "grouped GEMM",
    ),  # fmt: skip
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x256x128x1_swiglu", "MoE", "grouped GEMM"),
    ("void deep_ep::intranode::dispatch<8, 768>(int4*)", "MoE", "DeepEP"),
    # sparse attention
    (
        "void deep_gemm::sm90_fp8_mqa_logits<64, 128>(unsigned int)",
        "Sparse attention",
        "DeepGEMM MQA logits",
    ),  # fmt: skip
    (
        "void deep_gemm::sm90_fp8_paged_mqa_logits<64>(unsigned int)",
        "Sparse attention",
        "DeepGEMM MQA logits",
    ),  # fmt: skip
    (
        "void flash::sparse_attn_fwd_kernel<Kernel_traits>(Params)",
        "Sparse attention",
        "sparse attention",
    ),  # fmt: skip
    # collectives
    (
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "All-reduce",
        "NCCL",
    ),  # fmt: skip
    (
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*)",
        "All-reduce",
        "custom all-reduce",
    ),  # fmt: skip
    (
        "void c10d::symmetric_memory::two_shot_all_reduce_kernel<bf16, 8>(...)",
        "All-reduce",
        "custom all-reduce",
    ),  # fmt: skip
    # attention
    (
        "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>>(Flash_fwd_params)",
        "Attention",
        "flash attention",
    ),  # fmt: skip
    (
        "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
        "Attention",
        "flash attention",
    ),  # fmt: skip
    (
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3",
        "Attention",
        "flash attention",
    ),  # fmt: skip
    ("void vllm::concat_and_cache_mla_kernel<__nv_bfloat16>(...)", "Attention", "MLA attention"),
    (
        "void vllm::paged_attention_v2_kernel<unsigned short, 128>(float*)",
        "Attention",
        "paged attention",
    ),  # fmt: skip
    (
        "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>(...)",
        "Attention",
        "flash attention",
    ),  # fmt: skip
    (
        "void flashinfer::BatchDecodeWithPagedKVCacheKernel<128>(Params)",
        "Attention",
        "flash attention",
    ),  # fmt: skip
    ("kernel_unified_attention_2d", "Attention", "paged attention"),
    ("_attn_fwd", "Attention", "attention"),
    # dense GEMMs
    ("void marlin::Marlin<__nv_bfloat16, 4, 256, 1>(int4 const*)", "Dense GEMM", "Marlin"),
    (
        "void humming<MmaOpClass, Shape<0, 4096, 7168>, LayerConfig>(void* const)",
        "Dense GEMM",
        "humming",
    ),  # fmt: skip
    ("_Z7hummingI10MmaOpClass5ShapeILj0ELj4096ELj7168EE", "Dense GEMM", "humming"),
    (
        "void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u>(float*)",
        "Dense GEMM",
        "DeepGEMM",
    ),  # fmt: skip
    ("mm_kernel", "Dense GEMM", "Triton matmul"),
    ("matmul_kernel", "Dense GEMM", "Triton matmul"),
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "Dense GEMM", "vendor GEMM"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "Dense GEMM", "vendor GEMM"),
    (
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn>",
        "Dense GEMM",
        "vendor GEMM",
    ),  # fmt: skip
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>(...)", "Dense GEMM", "vendor GEMM"),
    ("void gemv2N_kernel<int, int, float, float, float>(...)", "Dense GEMM", "vendor GEMM"),
]

# Kernels no rule claims: torch's own elementwise and reduction kernels, copies.
UNCLAIMED = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(...)",
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 1, false>(...)",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 3, false>(...)",
    "void at::native::index_elementwise_kernel<128, 4>(long)",
    "Memcpy DtoD (Device -> Device)",
    "Memset (Device)",
    "void vllm::act_and_mul_kernel<c10::BFloat16>(...)",
]

# (module class path, category, deciding rule)
MODULES = [
    (
        "Qwen2MoeForCausalLM/Qwen2MoeModel/Qwen2MoeDecoderLayer/Qwen2MoeSparseMoeBlock/"
        "Qwen2MoeTopKRouter",
        "MoE",
        "MoE block module",
    ),  # fmt: skip
    ("Qwen2MoeDecoderLayer/Qwen2MoeSparseMoeBlock/Qwen2MoeExperts", "MoE", "MoE block module"),
    ("Qwen2MoeDecoderLayer/Qwen2MoeSparseMoeBlock/Linear", "MoE", "MoE block module"),
    ("Qwen2MoeSparseMoeBlock/Qwen2MoeMLP/Linear", "MoE", "MoE block module"),  # shared expert
    ("DeepseekV3DecoderLayer/DeepseekV3MoE/DeepseekV3TopkRouter", "MoE", "MoE block module"),
    ("Qwen3MoeDecoderLayer/Qwen3MoeSparseMoeBlock/FusedMoE", "MoE", "MoE block module"),
    ("Llama4TextDecoderLayer/Llama4TextMoe/Llama4Router", "MoE", "MoE block module"),
    ("Qwen2MoeDecoderLayer/Qwen2MoeAttention/Linear", "Dense GEMM", "attention projection"),
    ("Qwen3MoeAttention/QKVParallelLinear", "Dense GEMM", "attention projection"),
    ("DeepseekV32Attention/DeepseekV32Indexer/Linear", "Dense GEMM", "attention projection"),
    ("DeepseekV32Attention/DeepseekV32Indexer", "Sparse attention", "sparse attention module"),
    ("DeepseekV32Attention", "Sparse attention", "sparse attention module"),
    ("Qwen2MoeDecoderLayer/Qwen2MoeAttention", "Attention", "attention module"),
    ("Qwen3MoeAttention/Attention", "Attention", "attention module"),
    ("Qwen2MoeDecoderLayer/Qwen2MoeMLP/SiLUActivation", "Dense GEMM", "MLP module"),
    ("LlamaDecoderLayer/LlamaMLP/Linear", "Dense GEMM", "MLP module"),
]
UNCLAIMED_MODULES = [
    "Qwen2MoeForCausalLM/Qwen2MoeModel/Qwen2MoeRMSNorm",  # "Moe" inside a name is not a block
    "Qwen2MoeForCausalLM/Linear",  # lm_head: the op rules decide
    "Qwen2MoeForCausalLM/Qwen2MoeModel/Embedding",
]

# (op name, category, deciding rule)
OPS = [
    ("aten::_grouped_mm", "MoE", "MoE op"),
    ("vllm::moe_forward", "MoE", "MoE op"),
    ("_moe_C::topk_softmax", "MoE", "MoE op"),
    ("c10d::allreduce_", "All-reduce", "collective op"),
    ("vllm::all_reduce", "All-reduce", "collective op"),
    ("aten::_scaled_dot_product_flash_attention", "Attention", "attention op"),
    ("vllm::unified_attention_with_output", "Attention", "attention op"),
    ("aten::mm", "Dense GEMM", "GEMM op"),
    ("aten::_scaled_mm", "Dense GEMM", "GEMM op"),
]

RANGES = [
    ("moe", "MoE", "scope moe"),
    ("dense", "Dense GEMM", "scope dense"),
    ("attention", "Sparse attention", "scope attention"),
    ("allreduce", "All-reduce", "scope allreduce"),
    ("other", "Other", "scope other"),
]


@pytest.fixture(scope="module")
def resolver() -> Resolver:
    return Resolver(DEFAULT_RULES)


@pytest.mark.parametrize(("name", "category", "rule"), KERNELS)
def test_kernel_name_rule(resolver, name, category, rule):
    r = resolver.resolve((), name)
    assert (r.category, r.source, r.rule) == (category, "kernel", rule)


@pytest.mark.parametrize("name", UNCLAIMED)
def test_torch_glue_kernels_stay_other(resolver, name):
    r = resolver.resolve((), name)
    assert (r.category, r.source, r.rule) == ("Other", "default", "default")


@pytest.mark.parametrize(("path", "category", "rule"), MODULES)
def test_module_rule(resolver, path, category, rule):
    stack = tuple(Frame(cls, "module") for cls in path.split("/"))
    # The kernel name would say otherwise: the module decides first.
    r = resolver.resolve((*stack, Frame("aten::mm", "op")), "void at::native::elementwise")
    assert (r.category, r.source, r.rule, r.module) == (category, "module", rule, path)


@pytest.mark.parametrize("path", UNCLAIMED_MODULES)
def test_modules_that_are_no_category_leave_it_to_the_op(resolver, path):
    stack = tuple(Frame(cls, "module") for cls in path.split("/"))
    r = resolver.resolve((*stack, Frame("aten::mm", "op")), "nvjet_sm90_tst")
    assert (r.category, r.source, r.rule) == ("Dense GEMM", "op", "GEMM op")


@pytest.mark.parametrize(("name", "category", "rule"), OPS)
def test_op_rule(resolver, name, category, rule):
    r = resolver.resolve((Frame(name, "op"),), "some_kernel")
    assert (r.category, r.source, r.rule, r.op) == (category, "op", rule, name)


@pytest.mark.parametrize(("name", "category", "rule"), RANGES)
def test_range_rule(resolver, name, category, rule):
    r = resolver.resolve((Frame(name, "range"), Frame("aten::mm", "op")), "fused_moe_kernel")
    assert (r.category, r.source, r.rule) == (category, "range", rule)


def test_a_collective_inside_a_module_is_a_collective(resolver):
    stack = (Frame("Qwen3MoeAttention", "module"), Frame("RowParallelLinear", "module"))
    r = resolver.resolve(stack, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL")
    assert (r.category, r.source, r.rule) == ("All-reduce", "kernel", "NCCL")
    r = resolver.resolve((Frame("Qwen3MoeSparseMoeBlock", "module"),
                          Frame("vllm::all_reduce", "op")), "some_kernel")  # fmt: skip
    assert (r.category, r.source, r.rule) == ("All-reduce", "op", "collective op")


def test_graph_replays_use_the_kernel_name_only(resolver):
    stack = (Frame("Qwen2MoeSparseMoeBlock", "module"), Frame("aten::mm", "op"))
    r = resolver.resolve(stack, "nvjet_sm90_tst_64x8", by_stack=False)
    assert (r.category, r.source, r.rule) == ("Dense GEMM", "kernel", "vendor GEMM")


def test_every_rule_has_an_example():
    decided = {("kernel", rule) for *_, rule in KERNELS}
    decided |= {("module", rule) for *_, rule in MODULES}
    decided |= {("op", rule) for *_, rule in OPS}
    decided |= {("range", rule) for *_, rule in RANGES}
    tables = {"kernel": KERNEL_NAME_RULES, "module": MODULE_RULES, "op": OP_RULES,
              "range": RANGE_RULES}  # fmt: skip
    every = {(kind, name) for kind, rows in tables.items() for name, *_ in rows}
    assert every - decided == set()
    assert len(DEFAULT_RULES) == len(every)  # names are unique within a kind


def test_every_launched_workbench_kernel_has_a_rule(resolver):
    """Each `@triton.jit` or `@gluon.jit` function of kernels/ named `*_kernel` is claimed by
    name, so a CUDA-graph replay of the workbench's own model read without its signature
    still counts it (the replay loses the scopes)."""
    source = "\n".join(p.read_text() for p in (ROOT / "kernels").rglob("*.py"))
    names = set(re.findall(r"@(?:triton|gluon)\.jit\s*\ndef (\w+_kernel)\(", source))
    assert {"_bf16_wgmma_kernel", "_w8a8_gate_up_wgmma_kernel"} <= names
    assert len(names) >= 15
    unclaimed = {n for n in names if resolver.resolve((), n).source != "kernel"}
    assert unclaimed == set()


def test_user_rules_are_checked():
    with pytest.raises(WorkbenchError, match="match_on"):
        Rule("kernal", r"x", "MoE")  # type: ignore[arg-type]
    with pytest.raises(WorkbenchError, match="not a regular expression"):
        Rule("kernel", r"(unclosed", "MoE")
    with pytest.raises(WorkbenchError, match="must be Rule objects"):
        Resolver(["fused_moe"])


def test_rules_table_lists_every_rule_with_what_it_is():
    table = rules_table()
    assert len(table) == len(DEFAULT_RULES)
    assert table["what"].str.len().gt(0).all()
    assert list(table.columns) == ["match_on", "rule", "category", "pattern", "what"]
