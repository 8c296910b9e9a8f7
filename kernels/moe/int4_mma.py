"""Flat's routed experts on INT4 weights at decode, in Gluon: gate/up and down on the register
MMA (mma.sync), the packed weights brought in by TMA.

At T=6 the Triton kernels of the flat scheduler (`tiles._mma`) ran INT4 experts at 2.2 times
their bytes' floor, about as fast as FP8 experts for half the bytes. Compiled for sm_90 their
gate/up K step was 793 instructions a warp for 256 weight values a thread: the dequantisation
(`kernels.dequant`, about 1.5 a value), and around it register moves assembling the
activations' MMA operands out of their shared-memory loads (160), six CTA barriers from
layout conversions of the scales through shared memory, and no way to tell Triton otherwise.
Gluon states the layouts, so here:
- the weights are the MMA's first operand and the token rows its N, ROWS = 8 a tile (mma.sync's
  n8; decode experts have a few rows each), so the converted weights are the operand
  registers as the conversion writes them, and the activations' operand is two registers an
  MMA straight from a 16-byte load;
- the packed bytes are read as int32 words in a layout (`word_layout`) that, spread four ways
  and reshaped, is exactly the MMA operand's: each conversion takes one word as loaded and its
  outputs are operand registers (loaded as bytes, every word was taken apart and put back
  together, a byte at a time, 260 instructions a step);
- a K step (BLOCK_K, one INT4 group: one scale a weight row) is two MMAs, low and high
  nibbles against their own activation columns (the packed run layout of
  `formats.pack_int4`), then the fp32 product is scaled per weight row; the nibbles convert
  to 128 + q, and the product starts from an MMA of a constant -136 operand (`_bias`), so no
  bf16 FMA takes the offset off;
- the weight boxes come by TMA into a ring of STAGES slots that runs across a program's items
  (a cursor walks its items and their K steps, as the Gluon W8A8 kernels' refills do), so
  the next item's first steps are in flight while this one ends, and a slot is refilled
  after the CTA barrier that follows its reads (one program owns its ring: no "empty"
  mbarriers); the activations and scales, from L2, are loaded a step ahead into registers,
  the scales as 32-bit registers (`_load_bf16_bits`).
Work is flat's: persistent programs over (row tile, column tile, split) items, split-K partial
sums summed by `silu_reduce` and `combine`; the row tiles' experts come from `row_table`, or
up to 256 slots from the layout's own launch (`FlatLayout.with_row_table`).

On the H200 at the TP2 rank's shape (uniform routing), against flat's Triton kernels in one
A/B run (raw/logs/h200-moe-int4-mma-decode-ab-*.csv), the call took 0.137 ms at T=6 against
0.160, 0.048 against 0.058 at T=1 and 0.298 against 0.377 at T=16, with the same errors; at
T=64 they tied (1.51 and 1.50 ms; 1.20 against 1.45 in a probe run before). In the bench after
(raw/bench-moe-dsv4-flash-tp2-20261202T233346) flat INT4 took 0.137 ms at T=6, 1.88 times
its floor, against 2.27 in the bench before. In Nsight Compute (the capture of
ncu/moe-flat-T6-fmtint4 at 8b4daee, since replaced) gate/up took 85 us against the Triton
kernel's 121 (down 48 against 67) at 50% of DRAM bandwidth, 54% of issue slots busy and 23%
of warps resident (four programs of four warps an SM), waiting most on loads (long
scoreboard, 22% of samples): the dequantisation still cost about two instructions a value,
and too few bytes were in flight to hide the rest.
That capture's gate/up spilled 8 bytes (ptxas under Triton 3.6 took 128 registers and reloaded
a pointer from local memory every K step); launched with at most 128 (Ring.max_registers) it
takes 123 and spills nothing, and the call took 0.132 ms at T=6 against 0.136, T=1 and 16 within 1%
(raw/logs/h200-moe-int4-mma-registers-ab-*.csv; 168 registers and three programs an SM lost).
Then (raw/logs/h200-moe-int4-decode-bias-mma-ab-*.csv, one A/B run of three alternated
rounds) the scales as 32-bit loads and the refills after a CTA barrier took T=6 from 0.132 to
0.128 ms, the bias MMA to 0.126 and the row table from the layout's launch to 0.124 (T=1
0.048 to 0.045; T=16 0.299 to 0.282); the bench after has flat INT4 at 0.126 ms, 1.73 times
its floor (raw/bench-moe-dsv4-flash-tp2-20261203T060945). Nsight Compute
(ncu/moe-flat-T6-fmtint4 at ff1e34b) had gate/up at 75 us, 56% of DRAM bandwidth, and down at 47
us, 46%, each with 47-49% of issue slots busy, waiting most on the conversion's fixed
latencies ("wait", a third of gate/up's samples) and, in down, on each item's first loads
(its items are 9 K steps). Loading the activations unmasked (a row the tile does not own
reads slot 0's, and its column of the product is never stored) drops the zeroing of the load
registers a step: T=6 0.124 to 0.122 ms, T=64 1.14 to 1.09
(raw/logs/h200-moe-int4-decode-unmasked-loads-ab-*.csv); the bench after has flat INT4 at
0.123 ms, 1.70 times its floor (raw/bench-moe-dsv4-flash-tp2-20261203T063323). The K loop
is issue-bound more than latency-bound: a step's conversion is 128 instructions a thread (8 a
packed word: two byte permutes, two shifts, four LOP3s, about as few as bf16's 7-bit mantissa
allows), its 24 MMAs, and about 150 more for the loads, barriers and addressing around them
(299 a step, compiled for sm_90; 91 more when the refills move on to the next item). What did
not pay: gate/up summing its own split-K partials (the last split of a tile, as the dense
split-K store does) to drop the silu_reduce launch, 2-5 us longer at T=1-6; 3 or 6 ring
slots, or 1, 3 or 4 items a program, against 4 and 2
(raw/logs/h200-moe-int4-decode-stages-items-sweep-*.csv); each item's table entry and rows'
slots loaded an item ahead (a tie at T=6, raw/logs/h200-moe-int4-decode-item-prefetch-ab-*.csv);
shorter MMA chains on more accumulators, 0.126-0.128 against 0.124 ms at T=6
(raw/logs/h200-moe-int4-decode-mma-chains-ab-*.csv), more instructions for latency the other
warps already hid.
A K step's weights now come as one 3-D TMA box (`weight_descriptor`: gate/up's gate and up
rows together), so gate/up issues one copy a step and one CTA barrier fewer (286 instructions
a step against 299): T=6 0.1214 against 0.1221 ms, T=16 0.285 against 0.287
(raw/logs/h200-moe-int4-decode-tma3d-ab-*.csv); the bench after has flat INT4 at 0.123 ms,
1.69 times its floor (raw/bench-moe-dsv4-flash-tp2-20261203T093533). The conversion is about
as short as bf16 allows: a nibble must sit in the mantissa (bits 0-6) of its half, so of a
word's eight only two are in place, and each other pair needs a shift or a permute;
converting with masks alone (the high nibbles at bits 4-7 as 128 + 16 q) was wrong, bit 7
being the exponent's (that A/B, commits ea8a244 and aec990a, reverted). Masks and three
shifts (seven a word, one fewer) would put K in the order of bytes 0, 2, 1, 3, and gate/up's
activations would need a permute for each instruction saved.
What did not pay, in the probe runs before (raw/logs/h200-moe-int4-mma-decode-probe-*.csv):
the same kernel loading the weights straight into registers a step ahead (0.148 to 0.153 ms at
T=6: about 2 TB/s); loading two or four steps at once; a cp.async ring, where Gluon's
shared-memory analysis put a CTA barrier before every copy (0.18 to 0.33 ms); forcing more
splits; more programs an SM; 128-row tiles on eight warps; rings of six to twelve slots.

A ring slot may also hold two K steps (`Ring`), so that a slot's wait, CTA barriers and
refill serve both: 18% fewer instructions a gate/up step and 27% fewer a down step, compiled
for sm_90. On an H100 (raw/logs/h100-moe-int4-decode-rings-*.csv) two-step slots two deep
for both projections took T=6 2.2-3.1% less time than four one-step slots, T=16 and 64
1.4-3%, T=1 a tie: the default (GATE_UP_RING, DOWN_RING). The bench after
(raw/bench-moe-dsv4-flash-tp2-20261206T030650) has flat INT4 at 0.116 ms at T=6, 1.65 times
its floor; in Nsight Compute (ncu/moe-flat-T6-fmtint4, recaptured) gate/up takes 71 us and
down 42, and gate/up's conversion, 41% of its samples, waits on the integer pipe's throttle.
So gate/up multiplies fp16 operands instead (GATE_UP_FP16): fp16's 10-bit mantissa holds
both nibbles of a byte, a packed word converts in five integer instructions against eight
(INT4_TO_BIASED_FP16_PTX), and the token rows come as fp16 from `fp16_rows` (a power of two a
row, so no value leaves fp16's range), each row's inverse scale applied to the sums before
they leave. Alternated with bf16 on the H200 it took T=16 6% less time and T=6 1% less (the
rows' launch costs about what T=6 saves); the bench after
(raw/bench-moe-dsv4-flash-tp2-20261206T051930) has T=6 at 0.118 ms, 1.68 times its floor.

Gluon has no interpreter: the CPU tests compile the kernels for sm_90 and read their SASS
(scripts/dense_wgmma_sass.py --kernel moe-int4-gate-up|moe-int4-down); the GPU tests compare
the call with flat's Triton kernels.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels.compiled import launch
from kernels.dense.w8a8_wgmma import supported, threads_barrier
from kernels.dequant import INT4_TO_BIASED_BF16_PTX, INT4_TO_BIASED_FP16_PTX
from kernels.moe.formats import MoeWeights
from kernels.moe.fp16_rows import fp16_rows
from kernels.moe.launch import Tiles, run_pipeline
from kernels.moe.routing import MoeShape
from kernels.moe.w8a8_wgmma import row_table
from kernels.pdl import enabled as pdl_enabled
from kernels.pdl import wait_for_grid_before

if TYPE_CHECKING:  # flat imports this module
    from kernels.moe.flat import FlatLayout


ROWS = 8  # token rows a tile: the MMA's N
BLOCK_K = 128  # K values a step: one INT4 group, 64 packed bytes a weight row
BLOCK_N = 64  # weight rows a tile: one 16-row MMA tile a warp
NUM_WARPS = 4
STAGES = 4  # ring slots: 6 took as long at T=1-64 in the probe runs, 8 longer
SHARED_BYTES_PER_SM = 228 * 1024  # sm_90's shared memory an SM holds,
BLOCK_RESERVED_BYTES = 1024  # of which the system takes this much a resident block
PROGRAMS_PER_SM = 4
REGISTERS_PER_SM = 64 * 1024  # sm_90's register file
_ROWS = gl.constexpr(ROWS)
_BLOCK_K = gl.constexpr(BLOCK_K)
WORDS = BLOCK_K // 8  # packed 32-bit words a weight row a step
_WORDS = gl.constexpr(WORDS)
# A ring slot's boxes seen as one (boxes * BLOCK_N, WORDS) matrix: each 64-byte row swizzled
# as TMA wrote it, the planes one after the other.
_PLANE_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32))
_HALF = gl.constexpr(8)  # a packed run's low-nibble columns (`formats.pack_int4`: 16 a run)
K_WIDTH = gl.constexpr(8)  # consecutive bytes (low or high values) a thread holds a chunk


def word_layout(block_n: int, num_warps: int) -> gl.DistributedLinearLayout:
    """The layout of (weight rows, words, 4) that, reshaped to (weight rows, 64 bytes), is the
    MMA's first operand with K_WIDTH 8: each thread's words hold exactly its bytes, so a word
    loaded as int32 goes into the conversion as it is, and its outputs are operand registers.
    Bases (a thread's registers, then lanes and warps): the four bytes of a word, the next
    word, row + 8 and word + 8 (bytes 32 on); lanes take words 2 and 4 apart and rows 1-7;
    warps 16 rows each, as mma.sync's m16 tiles are laid out."""
    rows_per_warp = 16
    reg = [[0, 0, 1], [0, 0, 2], [0, 1, 0], [8, 0, 0], [0, 8, 0]]
    covered = rows_per_warp * num_warps
    while covered < block_n:
        reg.append([covered, 0, 0])
        covered *= 2
    lanes = [[0, 2, 0], [0, 4, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warps = [[rows_per_warp << w, 0, 0] for w in range(num_warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lanes, warps, [], [block_n, WORDS, 4])


@gluon.constexpr_function
def _operand_dtype(fp16):
    """The MMA operands' type: fp16 with FP16, else bf16."""
    return gl.float16 if fp16 else gl.bfloat16


@gluon.constexpr_function
def _operand_dtypes(fp16):
    """`_operand_dtype(fp16)` twice: the low nibbles' and the high nibbles' operands."""
    return (_operand_dtype(fp16),) * 2


@gluon.constexpr_function
def _conversion(fp16):
    """The PTX that turns a packed word into operands of `_operand_dtype(fp16)`."""
    return (INT4_TO_BIASED_FP16_PTX if fp16 else INT4_TO_BIASED_BF16_PTX).value


@gluon.jit
def _as_operands(words, layout: gl.constexpr, operand: gl.constexpr, FP16: gl.constexpr):
    """(low nibbles, high nibbles) of int32 `words` (BLOCK_N, WORDS) as bf16 128 + q (the
    136 is taken off by `_bias`), each (BLOCK_N, 4 * WORDS) bytes' values in `operand`'s
    layout; with FP16, as fp16 1024 + q and 1024 + 16 q, K in the order of bytes 0, 2, 1, 3
    (`fp16_rows`). Each word is spread over its four bytes' places (an add of zeros, which
    LLVM folds away), so the conversion, four elements a call, is handed the word four times
    and reads it once ($4)."""
    spread = gl.expand_dims(words, 2) + gl.zeros([words.shape[0], _WORDS, 4], gl.int32, layout)
    spread = gl.reshape(spread, [words.shape[0], 4 * _WORDS])
    lo, hi = gl.inline_asm_elementwise(
        _conversion(FP16), "=r,=r,=r,=r,r,r,r,r", [spread], dtype=_operand_dtypes(FP16),
        is_pure=True, pack=4,
    )  # fmt: skip
    lo = gl.convert_layout(lo, operand, assert_trivial=True)
    hi = gl.convert_layout(hi, operand, assert_trivial=True)
    return lo, hi


@gluon.jit
def _load_bf16_bits(ptrs):
    """The bf16 at each of `ptrs`, as the int32 of its bits (upper half zero), for `_widen`.

    A bf16 loaded as bf16 is packed with its neighbour into one register right where it is
    loaded, so the step that loads the next step's scales stopped there until they came (in
    the capture of ncu/moe-flat-T6-fmtint4 at 8b4daee, long scoreboard on that pack: 18% of
    down's samples, 8% of gate/up's); a 32-bit register waits for no one until the next step
    reads it."""
    return gl.inline_asm_elementwise(
        "ld.global.nc.u16 $0, [$1];", "=r,l", [ptrs], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _widen(bits):
    """The fp32 value of bf16 bits from `_load_bf16_bits`."""
    return (bits << 16).to(gl.float32, bitcast=True)


@gluon.jit
def _bias(x_lo, x_hi, BLOCK_N: gl.constexpr, w_layout: gl.constexpr, mma: gl.constexpr,
          FP16: gl.constexpr):  # fmt: skip
    """-136 times the sum of each token row's activations over the step, in the layout of a
    step's product, every weight row alike: the MMA of a constant -136 operand.

    The weights convert to 128 + q (four instructions a word less than q - 8, a third of the
    conversion), and a step's product starts from this, so it is the sum of x (q - 8). It
    costs one MMA a 16-wide K chunk, once a step for gate and up together. With FP16 the low
    nibbles are 1024 + q (-1032 takes the offset off) and the high ones 1024 + 16 q against
    activations a sixteenth as large (`fp16_rows`): (64 + q) x, so -72 * 16 = -1152."""
    dtype: gl.constexpr = _operand_dtype(FP16)
    low = gl.full([BLOCK_N, x_lo.shape[0]], -1032.0 if FP16 else -136.0, dtype, w_layout)
    high = gl.full([BLOCK_N, x_lo.shape[0]], -1152.0 if FP16 else -136.0, dtype, w_layout)
    product = mma_v2(low, x_lo, gl.zeros([BLOCK_N, x_lo.shape[1]], gl.float32, mma))
    return mma_v2(high, x_hi, product)


@gluon.jit
def _product(x_lo, x_hi, words, scale, bias, acc, WORD_LAYOUT: gl.constexpr,
             w_layout: gl.constexpr, FP16: gl.constexpr):  # fmt: skip
    """acc + one K step's product of these weight rows and token rows, scaled per weight row
    (one INT4 group a step; `scale` the bits of its bf16): low nibbles against x_lo, high
    nibbles against x_hi, from `bias` (`_bias`) up."""
    w_lo, w_hi = _as_operands(words, WORD_LAYOUT, w_layout, FP16)
    product = mma_v2(w_lo, x_lo, bias)
    product = mma_v2(w_hi, x_hi, product)
    return acc + product * _widen(scale)[:, None]


@gluon.jit
def _products(x_lo, x_hi, words, up_words, scale, up_scale, acc, up, GATE_UP: gl.constexpr,
              WORD_LAYOUT: gl.constexpr, w_layout: gl.constexpr, mma: gl.constexpr,
              FP16: gl.constexpr):  # fmt: skip
    """(acc, up) + one K step's products: gate's (or down's) rows, and with GATE_UP up's, both
    from one `_bias`."""
    bias = _bias(x_lo, x_hi, words.shape[0], w_layout, mma, FP16)
    acc = _product(x_lo, x_hi, words, scale, bias, acc, WORD_LAYOUT, w_layout, FP16)
    if GATE_UP:
        up = _product(x_lo, x_hi, up_words, up_scale, bias, up, WORD_LAYOUT, w_layout, FP16)
    return acc, up


@gluon.jit
def _operands(a_ptrs, s_ptrs, k):
    """The K step at `k`: its activations' low-nibble and high-nibble columns (`a_ptrs` at the
    step's first low-nibble columns) and the bits of its weight rows' scales (`s_ptrs`)."""
    x_lo = gl.load(a_ptrs + k)
    x_hi = gl.load(a_ptrs + (k + _HALF))
    return x_lo, x_hi, _load_bf16_bits(s_ptrs + k // _BLOCK_K)


@gluon.jit
def _item_place(item, splits, col_tiles, tile_info_ptr):
    """(split of K, column tile, its row tile's entry in the table of row tiles) of work item
    `item`: flat's order, splits fastest, then column tiles."""
    return (
        item % splits,
        (item // splits) % col_tiles,
        tile_info_ptr + 4 * (item // (splits * col_tiles)),
    )


@gluon.jit
def _item_rows(item, splits, col_tiles, tile_info_ptr, BOXES: gl.constexpr,
               BLOCK_N: gl.constexpr):  # fmt: skip
    """(the item's expert's first plane and its first weight row there, its split of K) for
    the refills' cursor (`weight_descriptor`: an expert's BOXES planes of weight rows)."""
    split, col_tile, info = _item_place(item, splits, col_tiles, tile_info_ptr)
    return gl.load(info) * BOXES, col_tile * BLOCK_N, split


@gluon.constexpr_function
def _steps_a_slot(w_desc):
    """K steps a ring slot holds, read off `weight_descriptor`'s box: 1 from its 3-D box,
    the box's step count from its 4-D one."""
    shape = w_desc.block_type.shape
    return 1 if len(shape) == 3 else shape[1]


@gluon.jit
def _refill(cursor, refills):
    """Start the TMA copy of the cursor's slot (item, its k, the slot's number in this
    program, its expert's first plane and weight row) into the ring, whose slot every warp has
    read (or none yet): one box, gate/up's gate and up rows together, GROUPS K steps deep;
    advance the cursor (the next item's rows are looked up when it starts)."""
    item, k, seq, plane, row, k_end = cursor
    (w_desc, ring, ready, num_items, splits, col_tiles, tile_info_ptr, k_size,
     k_per_split) = refills  # fmt: skip
    STAGES: gl.constexpr = ready.type.shape[0]
    BOXES: gl.constexpr = w_desc.block_type.shape[0]
    GROUPS: gl.constexpr = _steps_a_slot(w_desc)
    BOX_ROWS: gl.constexpr = w_desc.block_type.shape[-2]
    slot = seq % STAGES
    inside = item < num_items
    mbarrier.expect(ready.index(slot), w_desc.block_type.nbytes, pred=inside)
    if GROUPS == 1:
        tma.async_copy_global_to_shared(w_desc, [plane, row, k // 8], ready.index(slot),
                                        ring.index(slot), pred=inside)  # fmt: skip
    else:  # `weight_descriptor`'s (plane, group, row, word) view
        tma.async_copy_global_to_shared(w_desc, [plane, k // _BLOCK_K, row, 0],
                                        ready.index(slot), ring.index(slot),
                                        pred=inside)  # fmt: skip
    k += GROUPS * _BLOCK_K
    if k >= k_end:
        item += gl.num_programs(0)
        plane, row, split = _item_rows(gl.minimum(item, num_items - 1), splits, col_tiles,
                                       tile_info_ptr, BOXES, BOX_ROWS)  # fmt: skip
        k = split * k_per_split
        k_end = gl.minimum(k + k_per_split, k_size)
    return item, k, seq + 1, plane, row, k_end


@gluon.jit
def _int4_mma_kernel(
    x_ptr, out_ptr, sorted_slots_ptr, tile_info_ptr, tile_offsets_ptr, row_weights_ptr, w_desc,
    s_ptr, inverse_ptr, stride_se, stride_sn, num_experts, k_size, n_size, k_per_split,
    splits, stride_xr, stride_os, stride_or,
    GATE_UP: gl.constexpr, TOP_K: gl.constexpr, SPLIT: gl.constexpr, BLOCK_N: gl.constexpr,
    NUM_WARPS: gl.constexpr, WORD_LAYOUT: gl.constexpr, STAGES: gl.constexpr,
    ODD_STEPS: gl.constexpr, PDL: gl.constexpr, FP16: gl.constexpr,
):  # fmt: skip
    """Gate/up (GATE_UP: both boxes a step; silu(gate) * up into h, or with SPLIT the raw sums
    into part) or down (one box; each row times its routing weight into y[split, slot]) of
    flat's work items: one ROWS-row tile of an expert, BLOCK_N weight rows, one split of K.
    A ring slot holds GROUPS K steps (1 or 2, as `weight_descriptor` was made); ODD_STEPS:
    with 2, K is an odd number of steps, and splits of K take whole slots but the last. PDL
    (down only): launched with PDL, it fills its ring, then waits for the grid before. FP16
    (gate/up only): x is `fp16_rows`'s, the weights convert to fp16, and the sums are
    multiplied by each token row's inverse scale (`inverse_ptr`) before they leave."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, 8]
    )
    w_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=K_WIDTH)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=K_WIDTH)
    p_layout: gl.constexpr = gl.SliceLayout(2, WORD_LAYOUT)
    boxes: gl.constexpr = w_desc.block_type.shape[0]  # gate/up's 2 (`weight_descriptor`)
    GROUPS: gl.constexpr = _steps_a_slot(w_desc)
    if GROUPS == 1:
        ring = gl.allocate_shared_memory(gl.int32, [STAGES, boxes, BLOCK_N, _WORDS],
                                         w_desc.layout)  # fmt: skip
    else:
        ring = gl.allocate_shared_memory(gl.int32, [STAGES, boxes, GROUPS, BLOCK_N, _WORDS],
                                         w_desc.layout)  # fmt: skip
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for first in gl.static_range(STAGES):
        mbarrier.init(ready.index(first), count=1)
    fence_async_shared()
    col_tiles = n_size // BLOCK_N
    num_items = gl.load(tile_offsets_ptr + num_experts) * col_tiles * splits
    # activations (K, ROWS): the low nibbles' k of a step, the first 8 of each run of 16
    j = gl.arange(0, 4 * _WORDS, layout=gl.SliceLayout(1, a_layout))
    k_of_j = (j // _HALF) * (2 * _HALF) + j % _HALF
    a_rows = gl.arange(0, _ROWS, layout=gl.SliceLayout(0, a_layout))
    s_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    o_rows = gl.arange(0, _ROWS, layout=gl.SliceLayout(0, mma))
    # the refills' cursor starts at this program's first item
    item0 = gl.program_id(0)
    plane0, row0, split0 = _item_rows(gl.minimum(item0, num_items - 1), splits, col_tiles,
                                      tile_info_ptr, boxes, BLOCK_N)  # fmt: skip
    cursor = (item0, split0 * k_per_split, 0, plane0, row0,
              gl.minimum(split0 * k_per_split + k_per_split, k_size))  # fmt: skip
    refills = (w_desc, ring, ready, num_items, splits, col_tiles, tile_info_ptr, k_size,
               k_per_split)  # fmt: skip
    for _ in gl.static_range(STAGES):
        cursor = _refill(cursor, refills)
    if PDL:
        # the weights and row tiles read so far no grid just before wrote; the activations
        # and the rows' slots and weights are read after this
        wait_for_grid_before()
    seq = 0
    for item in range(gl.program_id(0), num_items, gl.num_programs(0)):
        split, col_tile, info = _item_place(item, splits, col_tiles, tile_info_ptr)
        expert = gl.load(info)
        first_row = gl.load(info + 1)
        owned = gl.load(info + 2)
        k_lo = split * k_per_split
        k_hi = gl.minimum(k_lo + k_per_split, k_size)
        # Rows the tile does not own read slot 0's activations, unmasked: their columns of the
        # product are never stored, and a masked load costs a zeroing of its registers a step.
        a_slots = gl.load(sorted_slots_ptr + first_row + a_rows, mask=a_rows < owned, other=0)
        if GATE_UP:
            a_slots = a_slots // TOP_K
        a_ptrs = x_ptr + a_slots.to(gl.int64)[None, :] * stride_xr + k_of_j[:, None]
        s_e = s_ptr + expert.to(gl.int64) * stride_se
        s_ptrs = s_e + (col_tile * BLOCK_N + s_rows) * stride_sn
        up_s = s_ptrs + n_size * stride_sn
        acc = gl.zeros((BLOCK_N, _ROWS), gl.float32, mma)
        up = gl.zeros((BLOCK_N, _ROWS), gl.float32, mma)
        last = k_hi - _BLOCK_K
        x_lo, x_hi, scale = _operands(a_ptrs, s_ptrs, k_lo)
        up_scale = scale  # down's stand-in, which `_products` does not read
        if GATE_UP:  # down has no up rows: its "up" scales would lie past the expert's
            up_scale = _load_bf16_bits(up_s + k_lo // _BLOCK_K)
        for k0 in range(k_lo, k_hi, GROUPS * _BLOCK_K):
            # the next step's activations and scales (from L2) while this step's weights land
            k_next = gl.minimum(k0 + _BLOCK_K, last)
            n_lo, n_hi, n_scale = _operands(a_ptrs, s_ptrs, k_next)
            slot = seq % STAGES
            mbarrier.wait(ready.index(slot), (seq // STAGES) & 1)
            boxes_read = ring.index(slot)._reinterpret(
                gl.int32, [boxes * GROUPS * BLOCK_N, _WORDS], _PLANE_LAYOUT
            )
            words = boxes_read.slice(0, BLOCK_N).load(p_layout)
            up_words = words  # down's stand-in
            if GATE_UP:
                n_up_scale = _load_bf16_bits(up_s + k_next // _BLOCK_K)
                up_words = boxes_read.slice(GROUPS * BLOCK_N, BLOCK_N).load(p_layout)
            if GROUPS == 2:
                # the slot's first group, then its second's words, so that the slot is
                # released once both are read but only one group's words are live at a time
                acc, up = _products(x_lo, x_hi, words, up_words, scale, up_scale, acc, up,
                                    GATE_UP, WORD_LAYOUT, w_layout, mma, FP16)  # fmt: skip
                x_lo, x_hi, scale = n_lo, n_hi, n_scale
                second = k0 + _BLOCK_K
                k_next = gl.minimum(second + _BLOCK_K, last)
                n_lo, n_hi, n_scale = _operands(a_ptrs, s_ptrs, k_next)
                words = boxes_read.slice(BLOCK_N, BLOCK_N).load(p_layout)
                if GATE_UP:
                    up_scale = n_up_scale
                    n_up_scale = _load_bf16_bits(up_s + k_next // _BLOCK_K)
                    up_words = boxes_read.slice(3 * BLOCK_N, BLOCK_N).load(p_layout)
            # Every warp has read the slot: one thread refills it with the step STAGES on. One
            # program owns the ring, so a CTA barrier does what a barrier of empty slots
            # would, and Gluon puts fewer CTA barriers around it (5 a step before, with one).
            threads_barrier()
            fence_async_shared()  # the slot's reads before the TMA writes it again
            cursor = _refill(cursor, refills)
            if ODD_STEPS:
                # K is an odd number of steps, so the last split ends half way through a slot
                # (the others take whole slots), and its second group is skipped. A branch;
                # without ODD_STEPS there is none: around gate/up's products, under Triton 3.6,
                # it cost 20 bytes of spills.
                if second < k_hi:
                    acc, up = _products(x_lo, x_hi, words, up_words, scale, up_scale, acc, up,
                                        GATE_UP, WORD_LAYOUT, w_layout, mma,
                                        FP16)  # fmt: skip
            else:
                acc, up = _products(x_lo, x_hi, words, up_words, scale, up_scale, acc, up,
                                    GATE_UP, WORD_LAYOUT, w_layout, mma, FP16)  # fmt: skip
            if GATE_UP:
                up_scale = n_up_scale
            x_lo, x_hi, scale = n_lo, n_hi, n_scale
            seq += 1
        o_ok = o_rows < owned
        slots = gl.load(sorted_slots_ptr + first_row + o_rows, mask=o_ok, other=0)
        cols = col_tile * BLOCK_N + s_rows
        mask = o_ok[None, :]
        out = out_ptr + split.to(gl.int64) * stride_os + slots.to(gl.int64)[None, :] * stride_or
        out += cols[:, None]
        if FP16:
            inverse = gl.load(inverse_ptr + slots // TOP_K, mask=o_ok, other=1.0)[None, :]
            acc = acc * inverse
            up = up * inverse
        if GATE_UP:
            if SPLIT:
                gl.store(out, acc, mask=mask)
                gl.store(out + n_size, up, mask=mask)
            else:
                h = acc / (1.0 + gl.exp(-acc)) * up
                gl.store(out, h.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            weight = gl.load(row_weights_ptr + first_row + o_rows, mask=o_ok, other=0.0)
            gl.store(out, (acc * weight[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


def runs_on(x: Tensor, weights: MoeWeights, shape: MoeShape) -> bool:
    """Whether these kernels take the call: sm_90 (TMA; Gluon has no interpreter), bf16
    activations with 16-byte aligned rows, INT4 experts in groups of one K step, and H and I
    whole numbers of K steps and of BLOCK_N weight rows."""
    return (
        supported(x.device)
        and x.dtype == torch.bfloat16
        and x.stride(-1) == 1
        and x.stride(0) % 8 == 0
        and x.data_ptr() % 16 == 0
        and weights.fmt == "int4"
        and weights.block == BLOCK_K
        and weights.gate_up.is_contiguous()
        and weights.down.is_contiguous()
        and all(size % BLOCK_K == 0 and size % BLOCK_N == 0 for size in (shape.hidden, shape.inter))
    )


def weight_descriptor(values: Tensor, boxes: int, groups: int = 1) -> TensorDescriptor:
    """The TMA descriptor of packed INT4 experts (E, N, K / 2) as (E * boxes, N / boxes, K / 8)
    int32 words, in boxes of `boxes` planes by BLOCK_N rows by one K step: gate/up (2) takes
    a column tile's gate rows and up rows in one copy, into two consecutive ring buffers.
    With `groups` 2, the words seen as (E * boxes, K / BLOCK_K, N / boxes, WORDS), a box
    `groups` K steps deep: in shared memory each plane's steps one after the other, each a
    (BLOCK_N, WORDS) matrix as one step's box is; a box past K reads zeros."""
    experts, rows, packed = values.shape
    words = values.view(torch.int32).reshape(experts * boxes, rows // boxes, packed // 4)
    if groups == 1:
        box = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=3)
        return TensorDescriptor.from_tensor(words, [boxes, BLOCK_N, WORDS], box)
    steps = words.unflatten(2, (packed // 4 // WORDS, WORDS)).transpose(1, 2)
    box = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=4)
    return TensorDescriptor.from_tensor(steps, [boxes, groups, BLOCK_N, WORDS], box)


@dataclass(frozen=True)
class Ring:
    """A projection's ring of weight boxes and the programs an SM that share the SM's shared
    memory and registers: `groups` K steps (INT4 groups) a slot, 1 or 2, in `stages` slots,
    `programs_per_sm` persistent programs an SM.

    With 2 groups a slot's wait, CTA barrier, fence and refill serve two steps
    (`_int4_mma_kernel`: compiled for sm_90, 623 instructions a gate/up slot against 378 a
    step, 429 a down slot against 292; scripts/dense_wgmma_sass.py --groups 2), at twice a
    slot's bytes. Two slots of two steps are the default (GATE_UP_RING, DOWN_RING): on an
    H100 they took T=6 2-3% less time than four one-step slots (scripts/tune_moe.py --grid
    int4-decode-rings; the module's docstring).

    The launch caps a thread's registers at what `programs_per_sm` programs leave
    (`max_registers`): four programs take 128, under which gate/up spills nothing, where
    ptxas (Triton 3.6's) left to itself took 128 and reloaded a pointer from local memory
    every K step. Compiled for sm_90, down spills nothing at 96 (five programs) either;
    gate/up spills 40 bytes there."""

    groups: int = 1
    stages: int = STAGES
    programs_per_sm: int = PROGRAMS_PER_SM

    def programs(self, sms: int) -> int:
        """Persistent programs of the projection's launch on `sms` SMs."""
        return sms * self.programs_per_sm

    @property
    def max_registers(self) -> int:
        """Registers a thread that let `programs_per_sm` programs of NUM_WARPS warps share an
        SM's register file (allocated 8 a thread at a time; 255 at most)."""
        threads = self.programs_per_sm * NUM_WARPS * 32
        return min(255, REGISTERS_PER_SM // threads // 8 * 8)

    def check(self, boxes: int) -> None:
        """Refuse a ring the kernels cannot take, or one whose slots of `boxes` planes would not
        let `programs_per_sm` programs share an SM's shared memory."""
        if self.groups not in (1, 2):
            raise ValueError(f"groups={self.groups!r} must be 1 or 2 (K steps a ring slot).")
        if not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"stages={self.stages!r} must be an integer >= 1 (ring slots).")
        if self.programs_per_sm not in range(1, 9):
            raise ValueError(f"programs_per_sm={self.programs_per_sm!r} must be 1 to 8 (8 "
                             "leaves 64 registers a thread).")  # fmt: skip
        slot_bytes = boxes * self.groups * BLOCK_N * WORDS * 4 + 8  # the slot and its mbarrier
        program_bytes = SHARED_BYTES_PER_SM // self.programs_per_sm - BLOCK_RESERVED_BYTES
        if self.stages * slot_bytes > program_bytes:
            raise ValueError(
                f"stages={self.stages} slots of {self.groups} K steps and {boxes} planes take "
                f"{self.stages * slot_bytes} bytes of shared memory a program, more than the "
                f"{program_bytes} each of {self.programs_per_sm} programs an SM has; use "
                f"stages <= {program_bytes // slot_bytes}."
            )


# Two slots of two K steps each, the bytes in flight of four one-step slots: on an H100
# (raw/logs/h100-moe-int4-decode-rings-*.csv) 2-3% less time at T=6 and 16 than four
# one-step slots; down with PDL or at five programs an SM changed it by under 0.5% more.
GATE_UP_RING = Ring(groups=2, stages=2)  # gate/up's: two planes (gate's and up's rows) a slot
DOWN_RING = Ring(groups=2, stages=2)
# Down launched with programmatic dependent launch (`kernels.pdl`): its programs fill their
# rings (weights, which no grid before writes) while the split-K reduce runs, then wait for h.
# Gate/up cannot: its first items' experts come from the grid just before it. An option.
DOWN_PDL = False
# Gate/up on fp16 operands (`fp16_rows`): five integer instructions a packed word where bf16
# takes eight, for one more launch (the rows' conversion). Alternated with bf16 on the H200
# (raw/logs/h200-moe-int4-decode-fp16-*.csv) flat INT4 took 1% less time at T=6 and 6% less
# at T=16 (on an H100, raw/logs/h100-moe-int4-decode-fp16-*.csv: 0.7% more and 0.5% less).
GATE_UP_FP16 = True


def moe_int4_mma(
    x: Tensor,
    weights: MoeWeights,
    layout: "FlatLayout",
    shape: MoeShape,
    sms: int,
    gate_up_splits: int,
    down_splits: int,
    table: tuple[Tensor, Tensor] | None = None,
    rings: tuple[Ring, Ring] | None = None,
    down_pdl: bool | None = None,
    gate_up_fp16: bool | None = None,
) -> Tensor:
    """Routed-expert output (T, H) of flat's pipeline with these kernels for gate/up and down,
    on `layout` built with ROWS-row tiles; `table` the layout's (row_weights, tile_info) where
    its launch wrote them (`FlatLayout.with_row_table`), else `row_table` writes them. `rings`:
    gate/up's and down's (None: GATE_UP_RING and DOWN_RING, read at the call); a projection
    runs `sms` times its ring's programs_per_sm persistent programs, and its splits of K take
    whole slots of its ring. `down_pdl`: down launches with PDL where the GPU has it (None:
    DOWN_PDL). `gate_up_fp16`: gate/up multiplies fp16 operands, x converted by `fp16_rows`
    (None: GATE_UP_FP16)."""
    row_weights, tile_info = table if table is not None else row_table(layout, shape, ROWS)
    gate_up_ring, down_ring = rings if rings is not None else (GATE_UP_RING, DOWN_RING)
    down_pdl = (DOWN_PDL if down_pdl is None else down_pdl) and pdl_enabled(x.device)
    gate_up_fp16 = GATE_UP_FP16 if gate_up_fp16 is None else gate_up_fp16
    # gate/up's rows and each token row's inverse scale (down's stand-in: never read)
    x_rows, inverses = fp16_rows(x) if gate_up_fp16 else (x, weights.gate_up_scale)
    gate_up_ring.check(2)
    down_ring.check(1)
    words = word_layout(BLOCK_N, NUM_WARPS)

    def run(rows: Tensor, out: Tensor, values: Tensor, scales: Tensor, k_size: int,
            n_size: int, splits: int, k_per_split: int, gate_up: bool) -> None:  # fmt: skip
        ring = gate_up_ring if gate_up else down_ring
        with_pdl = down_pdl and not gate_up
        fp16 = gate_up_fp16 and gate_up
        w_desc = weight_descriptor(values, 2 if gate_up else 1, ring.groups)
        items = layout.row_tiles * (n_size // BLOCK_N) * splits
        grid = (min(ring.programs(sms), items),)
        launch(
            _int4_mma_kernel, grid, rows, out, layout.sorted_slots, tile_info,
            layout.tile_offsets, row_weights, w_desc, scales, inverses, scales.stride(0),
            scales.stride(1), shape.experts, k_size, n_size, k_per_split,
            splits, rows.stride(0), out.stride(0) if out.dim() == 3 else 0, out.stride(-2),
            GATE_UP=gate_up, TOP_K=shape.top_k, SPLIT=splits > 1, BLOCK_N=BLOCK_N,
            NUM_WARPS=NUM_WARPS, WORD_LAYOUT=words, STAGES=ring.stages,
            ODD_STEPS=ring.groups == 2 and k_size % (2 * BLOCK_K) != 0, PDL=with_pdl, FP16=fp16,
            num_warps=NUM_WARPS, maxnreg=ring.max_registers, launch_pdl=with_pdl,
        )  # fmt: skip

    def gate_up(h: Tensor, part: Tensor, splits: int, k_per_split: int) -> None:
        run(x_rows, part if splits > 1 else h, weights.gate_up, weights.gate_up_scale,
            shape.hidden, shape.inter, splits, k_per_split, True)  # fmt: skip

    def down(h: Tensor, y: Tensor, splits: int, k_per_split: int) -> None:
        run(h, y, weights.down, weights.down_scale, shape.inter, shape.hidden, splits,
            k_per_split, False)  # fmt: skip

    # each projection's splits of K take whole slots of its ring
    tiles = Tiles(block_m=ROWS, block_n=BLOCK_N, block_k=gate_up_ring.groups * BLOCK_K,
                  split_k=None, num_warps=NUM_WARPS, num_stages=gate_up_ring.stages)  # fmt: skip
    return run_pipeline(x, shape, tiles, gate_up_splits, down_splits, gate_up, down,
                        down_block_k=down_ring.groups * BLOCK_K, down_pdl=down_pdl)  # fmt: skip
