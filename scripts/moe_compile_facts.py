"""Registers, spilled bytes and shared-memory copies of the MoE kernels compiled for sm_90 on a
machine without a GPU.

    python scripts/moe_compile_facts.py --fmt int4 --tiles 16,128,128,8,3 128,128,128,8,3,swap
    python scripts/moe_compile_facts.py --fmt fp8 --tiles 16,256,128,8,3 --split

Each tile is BLOCK_M,BLOCK_N,BLOCK_K,NUM_WARPS,NUM_STAGES, with `,swap` for weights as the
MMA's first operand (Tiles.swap_ab); `--split` compiles the split-K kernels (fp32 partial
sums), which flat picks at decode. Each MoE scheduler's gate/up and
down kernels are compiled with them by the installed Triton and its bundled ptxas, which
reports registers and spill bytes. Spills are the compiler's, so they depend on its version:
the H200 image runs Triton 3.6.0 (see a run.json's `environment.triton`), under which the old
INT4 tiles spilled 1,100 to 1,460 bytes where 3.7.1 spilled none. Install that version apart
(`python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0`) and put its
site-packages first on PYTHONPATH to see what the GPU will compile. A developer's tool, like
tune_moe.py: `workbench bench moe` records the registers and spills of the kernels it runs.

Two facts from the compiled code come with them, each of which cost the INT4 decode tiles
time on the H200 before it was seen: the widths of the cp.async copies into shared memory
(their K mask held INT4's packed bytes to 8-byte copies; 16 with `EVEN_K`), and the register
tiles written back to shared memory (`local_alloc` of a value in the TTGIR: a masked load's
nonzero fill made Triton stage every packed tile a second time). A tile whose MMA is wgmma
writes its converted weights there by design, since wgmma reads them from shared memory.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from kernels.moe import flat, padded, stock
from kernels.moe.launch import FMT_CODES

KERNELS = {
    "stock": (stock._stock_gate_up_kernel, stock._stock_down_kernel),
    "flat": (flat._flat_gate_up_kernel, flat._flat_down_kernel),
    "padded": (padded._padded_gate_up_kernel, padded._padded_down_kernel),
}
# y: bf16 slot rows, as an unsplit down writes them (split-K partials are fp32)
POINTERS = {"x_ptr": "*bf16", "h_ptr": "*bf16", "part_ptr": "*fp32", "y_ptr": "*bf16",
            "slot_weights_ptr": "*fp32"}  # fmt: skip
WEIGHTS = {"bf16": ("*bf16", "*fp32"), "fp8": ("*fp8e4nv", "*fp32"), "int4": ("*u8", "*bf16")}
# Arguments a launch passes as 1, which Triton specialises to the constant: unit strides, and,
# with K not split, the one split and the part buffer, which is h itself (UNSPLIT_ONE).
ONE = ("stride_wk", "stride_xh", "stride_sk")
UNSPLIT_ONE = ("splits", "stride_pr")
# Sizes a launch at the TP2-rank shape passes as multiples of 16, which Triton specialises on.
SIXTEENS = ("hidden", "inter", "num_experts", "k_per_split")
# EVEN_K: every K tile lies inside K at that shape (hidden 5,120, inter 1,152), so every
# scheduler launches without K masks.
FIXED = {"TOP_K": 6, "SPLIT": False, "STEPS": 9, "TICKET": False, "PRECISION": "tf32",
         "UPCAST": False, "SWAP": False, "EVEN_K": True}  # fmt: skip


def compile_kernel(kernel, fmt: str, tiles: tuple[int, ...], swap_ab: bool = False,
                   split: bool = False):  # fmt: skip
    """The kernel compiled for sm_90 with these tiles, pointers typed by name, ints 32-bit
    and the strides and sizes a launch sees divisible by 16."""
    block_m, block_n, block_k, warps, stages = tiles
    values, scales = WEIGHTS[fmt]
    ones = ONE if split else ONE + UNSPLIT_ONE
    constants = {**FIXED, **dict.fromkeys(ones, 1), "BLOCK_M": block_m, "BLOCK_N": block_n,
                 "BLOCK_K": block_k, "FMT": FMT_CODES[fmt], "QBLOCK": 128,
                 "SWAP": swap_ab, "SPLIT": split}  # fmt: skip
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name], constexprs[(i,)] = "constexpr", constants[name]
            continue
        if name.endswith("_ptr"):
            pointer = {"w_ptr": values, "s_ptr": scales}.get(name, POINTERS.get(name, "*i32"))
            signature[name] = pointer
        else:
            signature[name] = "i32"
        if name.endswith("_ptr") or name.startswith("stride") or name in SIXTEENS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = triton.compiler.ASTSource(kernel, signature, constexprs, attrs)
    options = {"num_warps": warps, "num_stages": stages}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def copy_facts(compiled) -> tuple[dict[int, int], int]:
    """({bytes a cp.async copy: copies in the PTX}, register tiles written to shared memory in
    the TTGIR)."""
    widths: dict[int, int] = {}
    for size in re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], (0x[0-9a-f]+)",
                           compiled.asm["ptx"]):  # fmt: skip
        widths[int(size, 16)] = widths.get(int(size, 16), 0) + 1
    staged = len(re.findall(r"ttg\.local_alloc %\S+ :", compiled.asm["ttgir"]))
    return dict(sorted(widths.items(), reverse=True)), staged


def assembled(compiled) -> tuple[str, str]:
    """(ptxas -v's report, the SASS) of a kernel's PTX for sm_90a, by the installed Triton's
    ptxas and nvdisasm."""
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as folder:
        ptx, cubin = os.path.join(folder, "k.ptx"), os.path.join(folder, "k.cubin")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        report = subprocess.run([f"{tools}/ptxas", "-arch=sm_90a", "-v", ptx, "-o", cubin],
                                capture_output=True, text=True, check=True).stderr  # fmt: skip
        sass = subprocess.run([f"{tools}/nvdisasm", "-c", cubin], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
    return report, sass


def ptxas_facts(compiled) -> tuple[int, int]:
    """(registers, spill-store bytes) that ptxas -v reports for the kernel's PTX."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(compiled.asm["ptx"])
    try:
        report = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr  # fmt: skip
    finally:
        os.unlink(f.name)
    return report_facts(report)


def report_facts(report: str) -> tuple[int, int]:
    """(registers, spill-store bytes) of a ptxas -v report."""
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    return registers, spills


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fmt", choices=sorted(WEIGHTS), default="int4")
    parser.add_argument("--tiles", nargs="+", default=["16,128,128,8,3", "128,128,128,8,3,swap"],
                        help="BLOCK_M,BLOCK_N,BLOCK_K,NUM_WARPS,NUM_STAGES[,swap]")  # fmt: skip
    parser.add_argument("--schedulers", nargs="+", choices=sorted(KERNELS), default=sorted(KERNELS))
    parser.add_argument("--split", action="store_true",
                        help="the split-K kernels (fp32 partial sums)")  # fmt: skip
    args = parser.parse_args(argv)
    if not hasattr(stock._stock_gate_up_kernel, "cache_key"):
        parser.error("the kernels were imported under TRITON_INTERPRET; unset it to compile them.")
    print(f"Triton {triton.__version__}, sm_90, {args.fmt} weights")
    for text in args.tiles:
        fields = text.split(",")
        swap = fields[5:] == ["swap"]
        if len(fields) - swap != 5 or not all(f.isdigit() for f in fields[:5]):
            parser.error(f"--tiles {text!r}: give BLOCK_M,BLOCK_N,BLOCK_K,NUM_WARPS,NUM_STAGES "
                         f"and optionally ,swap")  # fmt: skip
        tiles = tuple(int(f) for f in fields[:5])
        for scheduler in args.schedulers:
            for kernel in KERNELS[scheduler]:
                compiled = compile_kernel(kernel, args.fmt, tiles, swap, args.split)
                registers, spills = ptxas_facts(compiled)
                widths, staged = copy_facts(compiled)
                copies = " ".join(f"{n} of {size} B" for size, n in widths.items()) or "none"
                print(f"{text:>21} {kernel.fn.__name__:>24}: {registers} registers, "
                      f"{spills} bytes spilled, cp.async copies {copies}, {staged} register "
                      f"tiles staged in shared memory", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
