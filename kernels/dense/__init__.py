"""Dense projections y = x @ W.T: the cuBLAS baseline and three FP8 Triton variants.

VARIANTS maps a variant name to a `linear(x, weight)` callable; WEIGHT_FORMAT says which weight
each takes. `bf16` takes a plain bf16 (N, K) tensor (torch.matmul, i.e. cuBLAS); `w8a16`,
`w8a8` and `hybrid` take FP8 `DenseWeights` (quantise once, with `DenseWeights.quantize(w,
"fp8", block)`), and `hybrid` also a `hybrid_m` keyword. On sm_90 W8A16 from 48 rows runs a
Gluon kernel that reads a K-reordered copy of the FP8 values, made on a weight's first call
there and kept while the weight lives (`k_order`), and at one row a CUDA-core kernel
(`w8a16_gemv`). `group_linear` runs a group of
projections of one shape (kernels.dense.grouped). After a Triton call, last_facts() gives
registers, spills and shared memory of the kernels it launched (None under the interpreter).
"""

from collections.abc import Callable

# reference first: kernels.moe (which the Triton variants import) imports it back.
from kernels.dense.reference import linear, linear_reference, w8a8_reference  # isort: skip
from kernels.compiled import last_facts
from kernels.dense.formats import DEFAULT_BLOCK, FORMATS, DenseWeights
from kernels.dense.grouped import GROUP_VARIANTS, group_linear, one_by_one
from kernels.dense.hybrid import DEFAULT_HYBRID_M, hybrid_threshold, linear_hybrid
from kernels.dense.w8a8 import linear_w8a8
from kernels.dense.w8a16 import linear_w8a16, linear_w8a16_group
from kernels.fp8_quant import quantize_activations

VARIANTS: dict[str, Callable] = {
    "bf16": linear,
    "w8a16": linear_w8a16,
    "w8a8": linear_w8a8,
    "hybrid": linear_hybrid,
}
WEIGHT_FORMAT: dict[str, str] = {"bf16": "bf16", "w8a16": "fp8", "w8a8": "fp8", "hybrid": "fp8"}

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_HYBRID_M",
    "FORMATS",
    "GROUP_VARIANTS",
    "VARIANTS",
    "WEIGHT_FORMAT",
    "DenseWeights",
    "group_linear",
    "hybrid_threshold",
    "last_facts",
    "linear",
    "linear_hybrid",
    "linear_reference",
    "linear_w8a16",
    "linear_w8a16_group",
    "linear_w8a8",
    "one_by_one",
    "quantize_activations",
    "w8a8_reference",
]
