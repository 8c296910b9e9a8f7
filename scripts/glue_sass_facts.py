"""How often the MoE decode glue waits on memory, read from its SASS for sm_90, without a GPU.

    python scripts/glue_sass_facts.py [--code DIR]

At decode sizes the routing layout (`routing_kernels.small_layout`, 64 slots with the row
table) and the combine of split-K partials (`routing_kernels.combine`, three splits of six
slots) are a few dependent memory round trips each, not work. This compiles both with the
installed Triton and its ptxas and prints, for each, its registers, its global loads, and its
waits: walking the SASS in program order, an instruction that reads a register an outstanding
global load writes waits for it, and every load issued before then has landed by that wait
(a bound on the round trips, not a timing). `--code DIR` compiles the kernels package in DIR
instead (`git archive REV kernels | tar -x -C DIR`), so a change can be read against the
code before it. The H200 image runs Triton 3.6 (see moe_compile_facts.py for installing it
apart). A developer's tool, like moe_compile_facts.py.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

GLOBAL_LOAD = re.compile(r"\bLDG\.E[.A-Z0-9]*\s+(R\d+),")
OPERANDS = re.compile(r"^\s*(?:/\*[0-9a-f]+\*/)?\s*(?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_.]*\s*(.*)$")


def load_waits(sass: str) -> int:
    """Waits for a global load in program order (module docstring)."""
    outstanding: set[str] = set()
    waits = 0
    for line in sass.splitlines():
        load = GLOBAL_LOAD.search(line)
        operands = OPERANDS.match(line)
        if not load and operands and set(re.findall(r"\bR\d+\b", operands.group(1))) & outstanding:
            waits += 1
            outstanding.clear()
        if load:
            outstanding.add(load.group(1))
    return waits


def compiled_sass(kernel, types: dict[str, str], constants: dict[str, object]) -> tuple[int, str]:
    """(registers, SASS) of `kernel` for sm_90, pointers typed by `types` (else int32)."""
    import triton
    from moe_compile_facts import assembled, report_facts  # imports kernels: not before --code
    from triton.backends.compiler import GPUTarget

    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constants:
            signature[name], constexprs[(i,)] = "constexpr", constants[name]
            continue
        signature[name] = types.get(name, "*i32" if name.endswith("_ptr") else "i32")
        if name.endswith("_ptr") or name.startswith("stride"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = triton.compiler.ASTSource(kernel, signature, constexprs, attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    report, sass = assembled(compiled)
    return report_facts(report)[0], sass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", help="a folder holding the kernels package to compile")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("TRITON_INTERPRET=1 is set; unset it to compile the kernels.")
    if args.code:
        sys.path.insert(0, os.path.abspath(args.code))
    import triton

    from kernels.moe import routing_kernels  # after --code: that folder's package

    layout = ("small_layout", routing_kernels._small_layout_kernel,
              {"slot_weights_ptr": "*fp32", "row_weights_ptr": "*fp32"},
              {"SLOTS": 64, "EXPERTS": 512, "CHUNK": 32, "ROW_TABLE": True})  # fmt: skip
    combine = ("combine", routing_kernels._combine_kernel,
               {"y_ptr": "*fp32", "out_ptr": "*bf16"}, {"TOP_K": 6, "BLOCK_H": 256})  # fmt: skip
    print(f"Triton {triton.__version__}, sm_90, kernels of {args.code or 'the working tree'}")
    for name, kernel, types, constants in (layout, combine):
        constants = {k: v for k, v in constants.items() if k in kernel.arg_names}
        registers, sass = compiled_sass(kernel, types, constants)
        print(
            f"{name}: registers {registers}, global loads {len(GLOBAL_LOAD.findall(sass))}, "
            f"waits for a global load in program order {load_waits(sass)}"
        )


if __name__ == "__main__":
    main()
