"""What the Gluon W8A8 and W8A16 kernels (kernels/dense/w8a8_wgmma.py, w8a16_wgmma.py) and the
MoE kernels (kernels/moe/w8a8_wgmma.py, bf16_wgmma.py, int4_mma.py) compile to for sm_90,
without a GPU.

    python scripts/dense_wgmma_sass.py [--block-m 128] [--block-n 128] [--stages 4]
    python scripts/dense_wgmma_sass.py --kernel w8a8-wide [--stages 4]
    python scripts/dense_wgmma_sass.py --kernel w8a16 [--block-t 64] [--stages 8] [--split]
                                       [--max-registers 128] [--pdl]
    python scripts/dense_wgmma_sass.py --kernel moe-down [--stages 4]
    python scripts/dense_wgmma_sass.py --kernel moe-w8a8-gate-up|moe-bf16-gate-up|moe-bf16-down
    python scripts/dense_wgmma_sass.py --kernel moe-int4-gate-up|moe-int4-down [--groups 2]
                                       [--programs-per-sm 5] [--pdl (down)] [--fp16 (gate/up)]

Prints the registers and spilled bytes ptxas reports, any "Potential Performance Loss" note
it gives (C7514: wgmma serialised because an accumulator is read while one is in flight;
C7512: too few registers), and, from the SASS, how many FP8 wgmma instructions (QGMMA) the
kernel holds and their shapes, how many waits for them (WARPGROUP.DEPBAR) and how many fp32
FMAs (FFMA: the W8A8 rescale's, one an accumulator element; none may come between a wgmma and
its wait); for W8A16 and the MoE bf16
kernels, their bf16 wgmmas (HGMMA), the 16-byte cp.async copies (LDGSTS.128) of the gate/up
kernel's load warps, and the W8A16 kernel's shared loads of its weights (16 bytes each, from
the K order of kernels/dense/k_order.py); for the INT4 decode kernels, their mma.sync
instructions (HMMA) and the byte permutes that take a loaded word apart or put one together
(PRMT selecting single bytes), which their int32 word layout is there to avoid, and their bf16
FMAs (HFMA2.BF16), which converting to 128 + q and taking the 136 off by an MMA leaves out;
with programmatic dependent launch (kernels/pdl.py), the waits for the grid before (ACQBULK),
the TMA loads issued ahead of the first, and the points that let the next grid launch (PREEXIT);
for W8A16, the TMA loads issued ahead of its scales' load.
The kernels' design rests on these: each warpgroup's wgmmas of a K step are one group with one
wait, and ptxas serialises nothing. A developer's tool, like
moe_compile_facts.py; the GPU answers the question of speed (scripts/tune_dense.py).
"""

from __future__ import annotations

import argparse
import os
import re
from collections import Counter

import torch
import triton
from moe_compile_facts import assembled, report_facts
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

from kernels.dense import w8a8_wgmma, w8a8_wide, w8a16_wgmma
from kernels.moe import bf16_wgmma as moe_bf16_wgmma
from kernels.moe import int4_mma as moe_int4_mma
from kernels.moe import w8a8_gate_up_wgmma as moe_w8a8_gate_up_wgmma
from kernels.moe import w8a8_wgmma as moe_w8a8_wgmma

SHAPE = (4096, 2048, 7168)  # (M, N, K): any shape whose rows are 16-byte aligned


def compile_kernel(block_m: int, block_n: int, stages: int, consumer_regs: int,
                   ring_scales: bool = False, staged_weight_scales: bool = False):  # fmt: skip
    """The kernel compiled for sm_90 with host TMA descriptors typed as a launch types them;
    with `ring_scales`, the row scales' descriptor too; with `staged_weight_scales`, a tile's
    weight scales staged in shared memory for SHAPE's K."""
    m, n, k = SHAPE
    descriptors = {
        "a_desc": w8a8_wgmma.descriptor(torch.empty(m, k, dtype=torch.float8_e4m3fn),
                                        [block_m, w8a8_wgmma.BLOCK]),
        "w_desc": w8a8_wgmma.descriptor(torch.empty(n, k, dtype=torch.float8_e4m3fn),
                                        [block_n, w8a8_wgmma.BLOCK]),
        "y_desc": w8a8_wgmma.descriptor(torch.empty(m, n, dtype=torch.bfloat16),
                                        [w8a8_wgmma.ROWS // 2, block_n]),
    }  # fmt: skip
    constants = {
        "STAGES": stages,
        "CONSUMER_REGS": consumer_regs,
        "SCALE_STEPS": w8a8_wgmma.weight_scale_steps(k) if staged_weight_scales else 0,
    }
    if ring_scales:
        scales = torch.empty(k // w8a8_wgmma.BLOCK, m).t()  # token-fastest, as quantised
        descriptors["sa_desc"] = w8a8_wgmma.scale_descriptor(scales, block_m)
    else:
        constants["sa_desc"] = None
    return compile_gluon(w8a8_wgmma._w8a8_wgmma_kernel, descriptors, constants)


def compile_wide(stages: int, consumer_regs: int):
    """The 128 x 192 tile kernel (kernels/dense/w8a8_wide.py) compiled for sm_90, its five TMA
    descriptors typed as `gemm_w8a8_wide` makes them."""
    m, n, k = SHAPE
    values = torch.empty(m, k, dtype=torch.float8_e4m3fn)
    weights = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    y = torch.empty(m, n, dtype=torch.bfloat16)
    names = ("a_desc", "w_desc", "half_desc", "y_desc", "y_half_desc")
    descriptors = dict(zip(names, w8a8_wide.wide_descriptors(values, weights, y), strict=True))
    constants = {"STAGES": stages, "CONSUMER_REGS": consumer_regs}
    return compile_gluon(w8a8_wide._w8a8_wide_kernel, descriptors, constants)


def compile_w8a16(block_t: int, stages: int, split: bool, consumer_regs: int,
                  max_registers: int | None = None, pdl: bool = False):  # fmt: skip
    """The W8A16 kernel compiled for sm_90, as compile_kernel compiles the W8A8 one (its scales
    staged for SHAPE's K unsplit); with `max_registers`, as a launch capped at that many
    registers a thread would compile it; with `pdl`, as a launch with PDL compiles it."""
    m, n, k = SHAPE
    rows, block_k = w8a16_wgmma.ROWS, w8a16_wgmma.BLOCK_K
    descriptors = {
        "x_desc": w8a8_wgmma.descriptor(torch.empty(m, k, dtype=torch.bfloat16),
                                        [block_t, block_k]),
        "w_desc": w8a8_wgmma.descriptor(torch.empty(n, k, dtype=torch.float8_e4m3fn),
                                        [rows, block_k]),
        "y_desc": w8a8_wgmma.descriptor(torch.empty(m, n, dtype=torch.bfloat16),
                                        [block_t, rows // 2]),
    }  # fmt: skip
    constants = {"STAGES": stages, "LAG": 2 if stages >= 6 else 1, "SPLIT": split,
                 "CONSUMER_REGS": consumer_regs,
                 "SCALE_STEPS": w8a16_wgmma.scale_steps(k // block_k), "PDL": pdl,
                 "EARLY": min(w8a16_wgmma.EARLY_SLOTS, stages)}  # fmt: skip
    return compile_gluon(w8a16_wgmma._w8a16_wgmma_kernel, descriptors, constants,
                         maxnreg=max_registers)  # fmt: skip


def compile_moe_down(stages: int, consumer_regs: int):
    """The MoE down kernel compiled for sm_90 at the dsv4-flash TP2 rank's shape."""
    experts, hidden, inter, slots = 384, 5120, 1152, 4096 * 6
    h8 = torch.empty(slots, inter, dtype=torch.float8_e4m3fn)
    down = torch.empty(experts, hidden, inter, dtype=torch.float8_e4m3fn)
    h_desc, w_desc = moe_w8a8_wgmma.expert_descriptors(
        h8, down, moe_w8a8_wgmma.WIDE, moe_w8a8_wgmma.BLOCK
    )
    constants = {"STAGES": stages, "CONSUMER_REGS": consumer_regs}
    pointers = {"y_ptr": "*bf16", "sorted_slots_ptr": "*i32", "tile_info_ptr": "*i32",
                "tile_offsets_ptr": "*i32"}  # fmt: skip
    return compile_gluon(moe_w8a8_wgmma._w8a8_down_wgmma_kernel,
                         {"h_desc": h_desc, "w_desc": w_desc}, constants, pointers)  # fmt: skip


def compile_moe_w8a8_gate_up(stages: int):
    """The MoE W8A8 gate/up kernel compiled for sm_90 at the TP2 rank's shape."""
    experts, hidden, inter, tokens = 384, 5120, 1152, 4096
    x8 = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn)
    gate_up = torch.empty(experts, 2 * inter, hidden, dtype=torch.float8_e4m3fn)
    block = moe_w8a8_wgmma.BLOCK
    a_desc, w_desc = moe_w8a8_wgmma.expert_descriptors(x8, gate_up, block, block)
    constants = {"STAGES": stages, "CONSUMER_REGS": moe_w8a8_gate_up_wgmma.CONSUMER_REGS}
    pointers = {"x8_ptr": "*fp8e4nv", "h8_ptr": "*fp8e4nv", "sorted_slots_ptr": "*i32",
                "tile_info_ptr": "*i32", "tile_offsets_ptr": "*i32"}  # fmt: skip
    return compile_gluon(moe_w8a8_gate_up_wgmma._w8a8_gate_up_wgmma_kernel,
                         {"a_desc": a_desc, "w_desc": w_desc}, constants, pointers)  # fmt: skip


def compile_moe_bf16(swiglu: bool, stages: int):
    """The MoE bf16 gate/up (swiglu) or down kernel compiled for sm_90 at the TP2 rank's shape,
    with the consumer registers the host gives it."""
    experts, hidden, inter, slots = 384, 5120, 1152, 4096 * 6
    depth, width = (hidden, 2 * inter) if swiglu else (inter, hidden)
    rows = torch.empty(slots, depth, dtype=torch.bfloat16)
    weights = torch.empty(experts, width, depth, dtype=torch.bfloat16)
    a_desc, w_desc = moe_w8a8_wgmma.expert_descriptors(rows, weights, moe_bf16_wgmma.BOX,
                                                       moe_bf16_wgmma.BLOCK_K)  # fmt: skip
    descriptors = {"a_desc": a_desc, "w_desc": w_desc}
    constants = {"STAGES": stages, "LAG": moe_bf16_wgmma.DEFAULT_LAG, "SWIGLU": swiglu,
                 "CONSUMER_REGS": moe_bf16_wgmma.CONSUMER_REGS[swiglu]}  # fmt: skip
    pointers = {"out_ptr": "*bf16", "x_ptr": "*bf16", "sorted_slots_ptr": "*i32",
                "tile_info_ptr": "*i32", "tile_offsets_ptr": "*i32"}  # fmt: skip
    return compile_gluon(moe_bf16_wgmma._bf16_wgmma_kernel, descriptors, constants, pointers)


def compile_moe_int4(gate_up: bool, ring: moe_int4_mma.Ring, pdl: bool = False,
                     fp16: bool = False):  # fmt: skip
    """The MoE INT4 decode gate/up or down kernel (split K) compiled for sm_90 at the TP2 rank's
    shape, as `int4_mma.moe_int4_mma` launches it on `ring` (its registers capped at what the
    ring's programs an SM leave), down with `pdl` as launched with PDL, gate/up with `fp16`
    on fp16 operands."""
    experts, hidden, inter = 384, 5120, 1152
    rows, depth = (2 * inter, hidden) if gate_up else (hidden, inter)
    w_desc = moe_int4_mma.weight_descriptor(
        torch.empty(experts, rows, depth // 2, dtype=torch.uint8),
        2 if gate_up else 1,
        ring.groups,
    )
    constants = {"GATE_UP": gate_up, "TOP_K": 6, "SPLIT": True, "BLOCK_N": moe_int4_mma.BLOCK_N,
                 "NUM_WARPS": moe_int4_mma.NUM_WARPS, "STAGES": ring.stages,
                 "ODD_STEPS": ring.groups == 2 and depth % (2 * moe_int4_mma.BLOCK_K) != 0,
                 "PDL": pdl, "FP16": fp16,
                 "WORD_LAYOUT": moe_int4_mma.word_layout(moe_int4_mma.BLOCK_N,
                                                         moe_int4_mma.NUM_WARPS)}  # fmt: skip
    pointers = {"x_ptr": "*fp16" if fp16 else "*bf16", "s_ptr": "*bf16", "sorted_slots_ptr": "*i32",
                "tile_info_ptr": "*i32", "tile_offsets_ptr": "*i32"}  # fmt: skip
    return compile_gluon(
        moe_int4_mma._int4_mma_kernel,
        {"w_desc": w_desc},
        constants,
        pointers,
        maxnreg=ring.max_registers,
    )


def compile_gluon(
    kernel,
    descriptors: dict,
    constants: dict,
    pointers: dict | None = None,
    maxnreg: int | None = None,
):
    """A Gluon kernel compiled for sm_90: descriptors typed as a launch types them, pointers
    fp32 unless `pointers` types them (the counters int32), integers 16-divisible, registers
    capped at `maxnreg` where the launch caps them."""
    signature, constexprs, attrs = {}, {}, {}
    pointers = {"locks_ptr": "*i32", **(pointers or {})}
    for i, name in enumerate(kernel.arg_names):
        if name in descriptors:
            signature[name] = mangle_type(descriptors[name])
            continue
        if name in constants:
            signature[name], constexprs[(i,)] = "constexpr", constants[name]
            continue
        pointer = pointers.get(name, "*fp32")
        signature[name] = pointer if name.endswith("_ptr") else "i32"
        attrs[(i,)] = [["tt.divisibility", 16]]
    source = GluonASTSource(kernel, signature, constexprs, attrs)
    options = {"num_warps": 4} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _count_between(sass: str, opens: str, closes: str, counted: str) -> int:
    """SASS lines matching `counted` after a line matching `opens` and before the next one
    matching `closes` (regular expressions)."""
    inside, count = False, 0
    for line in sass.splitlines():
        if re.search(opens, line):
            inside = True
        elif re.search(closes, line):
            inside = False
        elif inside and re.search(counted, line):
            count += 1
    return count


def innermost_mma_loops(sass: str) -> list[list[str]]:
    """The opcodes of each innermost loop of the SASS (a backward branch and its target,
    holding no other such loop) that holds a tensor-core instruction (QGMMA, HGMMA or HMMA),
    in address order: a K step of each partition's main loop (each warpgroup of the Gluon
    kernels has its own copy), by whose size their per-step cost is compared. Branches past
    the last EXIT are left out: ptxas puts the retries of mbarrier waits there, and their
    jumps back into the body are no loops."""
    lines = sass.splitlines()
    exits = [i for i, line in enumerate(lines) if re.search(r"\bEXIT\b", line)]
    lines = lines[: exits[-1] + 1] if exits else lines
    address = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
    ops = [(int(m.group(1), 16), m.group(2)) for m in map(address.search, lines) if m]
    labels = {}
    for i, line in enumerate(lines):
        if re.match(r"\s*\.L_x_\d+:", line):
            following = (address.search(later) for later in lines[i + 1 : i + 8])
            first = next((int(m.group(1), 16) for m in following if m), None)
            if first is not None:
                labels[line.strip().rstrip(":")] = first
    loops = []
    for line in lines:
        branch, target = address.search(line), re.search(r"BRA `?\(?(\.L_x_\d+)", line)
        if branch and target and branch.group(2) == "BRA" and target.group(1) in labels:
            start, end = labels[target.group(1)], int(branch.group(1), 16)
            body = [op for at, op in ops if start <= at <= end]
            if start < end and any(op.startswith(("QGMMA", "HGMMA", "HMMA")) for op in body):
                loops.append((start, end, body))
    return [body for start, end, body in sorted(loops)
            if not any(start <= s2 and e2 <= end and (s2, e2) != (start, end)
                       for s2, e2, _ in loops)]  # fmt: skip


def sass_facts(compiled) -> dict[str, int | list[str]]:
    """ptxas's registers, spilled bytes and performance notes, and the QGMMA, HGMMA,
    WARPGROUP.DEPBAR, 16-byte LDGSTS, TMA load (UTMALDG) and 16-byte and 2-byte shared load
    (LDS.128, LDS.U16) counts of the SASS, with the register counts its setmaxnreg
    instructions give the partitions."""
    report, sass = assembled(compiled)
    registers, spills = report_facts(report)
    qgmma_shapes = Counter(re.findall(r"\bQGMMA\.(\d+x\d+x\d+)", sass))
    loops = innermost_mma_loops(sass)
    return {
        "registers": registers,
        "spills": spills,
        "notes": re.findall(r"\((C75\d\d)\) Potential Performance Loss", report),
        "qgmma": len(re.findall(r"\bQGMMA\.", sass)),
        "mma_loops": [len(body) for body in loops],
        # global loads inside those loops: the W8A8 kernel's weight scale a step, unless staged
        "ldg_in_mma_loops": [sum(op.startswith("LDG") for op in body) for body in loops],
        # block barriers inside them: Gluon puts one of a partition's warps before each mbarrier
        # wait and arrive in a partition of several warps (DeepGEMM's K loop, its warps arriving
        # each for itself, has none)
        "bar_in_mma_loops": [sum(op.startswith("BAR.SYNC") for op in body) for body in loops],
        # fp32 FMAs: the W8A8 kernels' rescale, one an accumulator element a K step
        "ffma": len(re.findall(r"\bFFMA\b", sass)),
        # ... those issued after a wgmma and before a wait for it (WARPGROUP.DEPBAR): a rescale
        # reading an accumulator in flight (none, where the kernel waits first)
        "ffma_in_flight": _count_between(sass, r"\bQGMMA\.", r"WARPGROUP\.DEPBAR", r"\bFFMA\b"),
        # the FP8 wgmmas' shapes (MxNxK) and how many of each
        "qgmma_shapes": [f"{shape} x{count}" for shape, count in sorted(qgmma_shapes.items())],
        "hgmma": len(re.findall(r"\bHGMMA\.", sass)),
        "depbar": len(re.findall(r"WARPGROUP\.DEPBAR", sass)),
        "ldgsts": len(re.findall(r"\bLDGSTS\.E\.BYPASS\.128\b", sass)),
        "hmma": len(re.findall(r"\bHMMA\.16816\.", sass)),
        "byte_permutes": len(re.findall(r"\bPRMT\b[^;]*0x(?:3340|777[0-3])\b", sass)),
        "bf16_fmas": len(re.findall(r"\bHFMA2\.BF16", sass)),
        "tma_loads": len(re.findall(r"\bUTMALDG\.", sass)),
        # the register counts setmaxnreg gives the partitions (allocations and releases)
        "setmaxnreg": sorted(
            {int(v, 16) for v in re.findall(r"USETMAXREG\.\w+\.CTAPOOL [^;]*?(0x[0-9a-f]+)", sass)}
        ),
        "lds128": len(re.findall(r"\bLDS\.128\b", sass)),
        "lds16": len(re.findall(r"\bLDS\.U16\b", sass)),
        # 32-bit shared and global loads: the W8A8 kernel's row scales, from its scale ring
        # or from global memory
        "lds32": len(re.findall(r"\bLDS R", sass)),
        # ... those after a wait for a ring slot's copy (an mbarrier try-wait) and before the
        # release of a slot (a one-thread arrive): where the W8A8 kernel's row scales must be
        # read, after their copy landed and before the load warp may overwrite them
        "lds32_in_step": _count_between(
            sass, r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT", r"SYNCS\.ARRIVE\.TRANS64\.A1T0", r"\bLDS R"
        ),
        "ldg32": len(re.findall(r"\bLDG\.E(?:\.CONSTANT)? R", sass)),
        # PDL: the waits for the grid before (griddepcontrol.wait), the TMA loads issued ahead
        # of the first, and the points that let the next grid launch (launch_dependents)
        "grid_waits": len(re.findall(r"\bACQBULK\b", sass)),
        "tma_loads_before_wait": len(re.findall(r"\bUTMALDG\.", sass.split("ACQBULK")[0]))
        if "ACQBULK" in sass
        else 0,
        "next_grid_launches": len(re.findall(r"\bPREEXIT\b", sass)),
        # W8A16: the TMA loads issued ahead of the scales' load (its one 4-byte global load;
        # None where there is none to find)
        "tma_loads_before_scales": len(re.findall(r"\bUTMALDG\.", sass.split("LDG.E ")[0]))
        if "LDG.E " in sass
        else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block-m", type=int, choices=(128, 256), default=128)
    parser.add_argument("--block-n", type=int, choices=(32, 64, 128), default=128)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--consumer-regs", type=int, default=232)
    parser.add_argument("--ring-scales", action="store_true",
                        help="W8A8: the row scales by TMA with each ring slot")  # fmt: skip
    parser.add_argument("--staged-weight-scales", action="store_true",
                        help="W8A8: a tile's weight scales in shared memory")  # fmt: skip
    parser.add_argument("--kernel", default="w8a8",
                        choices=("w8a8", "w8a8-wide", "w8a16", "moe-down", "moe-w8a8-gate-up",
                                 "moe-bf16-gate-up", "moe-bf16-down", "moe-int4-gate-up",
                                 "moe-int4-down"))  # fmt: skip
    parser.add_argument("--block-t", type=int, choices=w8a16_wgmma.BLOCK_TS, default=64,
                        help="W8A16: token columns a tile")  # fmt: skip
    parser.add_argument("--split", action="store_true", help="W8A16: with split K")
    parser.add_argument("--groups", type=int, choices=(1, 2), default=1,
                        help="MoE INT4: K steps (INT4 groups) a ring slot")  # fmt: skip
    parser.add_argument("--programs-per-sm", type=int, default=moe_int4_mma.PROGRAMS_PER_SM,
                        help="MoE INT4: programs an SM, whose share of the registers caps a "
                        "thread's")  # fmt: skip
    parser.add_argument(
        "--pdl",
        action="store_true",
        help="W8A16, MoE INT4 down: as launched with programmatic dependent launch",
    )
    parser.add_argument(
        "--fp16",
        action="store_true",
        help="MoE INT4 gate/up: on fp16 operands (int4_mma.GATE_UP_FP16)",
    )
    parser.add_argument("--max-registers", type=int,
                        help="W8A16: registers a thread at most, as a launch's maxnreg caps "
                        "them (128: two blocks an SM)")  # fmt: skip
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("TRITON_INTERPRET=1 is set; unset it to compile the kernel.")
    if args.kernel == "w8a8":
        compiled = compile_kernel(args.block_m, args.block_n, args.stages,
                                  args.consumer_regs, args.ring_scales,
                                  args.staged_weight_scales)  # fmt: skip
        tile = f"{args.block_m} x {args.block_n} tiles"
        tile += ", row scales in the ring" if args.ring_scales else ""
        tile += ", weight scales staged" if args.staged_weight_scales else ""
    elif args.kernel == "w8a8-wide":
        compiled = compile_wide(args.stages, args.consumer_regs)
        tile = f"{w8a8_wgmma.ROWS} x {w8a8_wide.WIDTH} tiles"
    elif args.kernel == "w8a16":
        compiled = compile_w8a16(args.block_t, args.stages, args.split, args.consumer_regs,
                                 args.max_registers, args.pdl)  # fmt: skip
        tile = f"{w8a16_wgmma.ROWS} x {args.block_t} tiles{', split K' if args.split else ''}"
        tile += ", PDL" if args.pdl else ""
    elif args.kernel == "moe-down":
        compiled = compile_moe_down(args.stages, args.consumer_regs)
        tile = f"{moe_w8a8_wgmma.ROWS} x {moe_w8a8_wgmma.WIDE} items"
    elif args.kernel == "moe-w8a8-gate-up":
        compiled = compile_moe_w8a8_gate_up(args.stages)
        tile = f"{moe_w8a8_wgmma.ROWS} x 2 x {moe_w8a8_wgmma.BLOCK} items"
    elif args.kernel.startswith("moe-int4"):
        if args.pdl and args.kernel == "moe-int4-gate-up":
            parser.error("--pdl: gate/up does not launch with PDL (int4_mma.DOWN_PDL)")
        if args.fp16 and args.kernel == "moe-int4-down":
            parser.error("--fp16: down's operands stay bf16 (int4_mma.GATE_UP_FP16)")
        ring = moe_int4_mma.Ring(args.groups, args.stages, args.programs_per_sm)
        compiled = compile_moe_int4(args.kernel == "moe-int4-gate-up", ring, args.pdl,
                                    args.fp16)  # fmt: skip
        tile = f"{moe_int4_mma.BLOCK_N} x {moe_int4_mma.ROWS} tiles, split K, {args.groups} K "
        tile += "step a ring slot" if args.groups == 1 else "steps a ring slot"
        tile += f", {args.programs_per_sm} programs an SM" + (", PDL" if args.pdl else "")
        tile += ", fp16 operands" if args.fp16 else ""
    else:
        compiled = compile_moe_bf16(args.kernel == "moe-bf16-gate-up", args.stages)
        tile = f"{moe_bf16_wgmma.ROWS} x {2 * moe_bf16_wgmma.BOX} items"
    facts = sass_facts(compiled)
    registers, spills = facts["registers"], facts["spills"]
    print(f"Triton {triton.__version__}, sm_90, {args.kernel}, {tile}, {args.stages} stages")
    print(f"registers: {registers}")
    print(f"spilled bytes: {spills}")
    print(f"ptxas notes: {' '.join(facts['notes']) or 'none'}")
    print(
        f"instructions in each innermost MMA loop: "
        f"{' '.join(map(str, facts['mma_loops'])) or 'none'}"
    )
    print(f"QGMMA: {facts['qgmma']}")
    print(f"FFMA: {facts['ffma']}")
    print(f"FFMA between a wgmma and its wait: {facts['ffma_in_flight']}")
    print(f"QGMMA shapes: {', '.join(facts['qgmma_shapes']) or 'none'}")
    print(f"HGMMA: {facts['hgmma']}")
    print(f"WARPGROUP.DEPBAR: {facts['depbar']}")
    print(f"LDGSTS.128: {facts['ldgsts']}")
    print(f"HMMA: {facts['hmma']}")
    print(f"byte PRMT: {facts['byte_permutes']}")
    print(f"bf16 FMA: {facts['bf16_fmas']}")
    print(f"TMA loads: {facts['tma_loads']}")
    print(f"setmaxnreg: {' '.join(map(str, facts['setmaxnreg'])) or 'none'}")
    print(f"LDS.128: {facts['lds128']}")
    print(f"LDS.U16: {facts['lds16']}")
    print(f"LDS (32-bit): {facts['lds32']}")
    print(f"LDS (32-bit) between a slot's wait and a release: {facts['lds32_in_step']}")
    print(f"LDG (32-bit): {facts['ldg32']}")
    print(f"LDG in each innermost MMA loop: {' '.join(map(str, facts['ldg_in_mma_loops']))}")
    print(f"BAR.SYNC in each innermost MMA loop: {' '.join(map(str, facts['bar_in_mma_loops']))}")
    print(f"grid waits (ACQBULK): {facts['grid_waits']}")
    print(f"TMA loads before the wait: {facts['tma_loads_before_wait']}")
    print(f"next-grid launches (PREEXIT): {facts['next_grid_launches']}")
    if args.kernel == "w8a16":
        print(f"TMA loads before the scales' load: {facts['tma_loads_before_scales']}")


if __name__ == "__main__":
    main()
