"""Whether the CUDA-core W8A16 kernel (kernels/dense/w8a16_gemv.py) has every weight load in
flight before its first multiply, read from its SASS for sm_90, without a GPU.

    python scripts/dense_gemv_sass.py [--m 1]

The kernel's design is that a program asks for its whole K at once, as a plain read does; the
compiler decides the order, so this compiles it with the installed Triton and its ptxas for
each projection of one dsv4-flash-tp2 layer at the default plan (rows a program, K pieces, four
warps) and prints its registers, its 16-byte global loads (the weights' and x's), how many of
them come before the first FFMA, its FFMAs and its instructions. Triton 3.6, which the H200
image runs, puts them all first but one (at K = 5120 and 1280 x's rest piece, or its 8-byte
loads); 3.7.1 leaves six of eight after the first FFMA at K = 4096 (see moe_compile_facts.py
for installing a Triton apart). A developer's tool, like glue_sass_facts.py.
"""

from __future__ import annotations

import argparse
import os
import re

WIDE_LOAD = re.compile(r"\bLDG\.E\.128\b")
OPCODE = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def load_order(sass: str) -> dict[str, int]:
    """16-byte global loads, those before the first FFMA, FFMAs and instructions of `sass`."""
    instructions = [(m.group(1), line) for line in sass.splitlines()
                    if (m := OPCODE.search(line))]  # fmt: skip
    opcodes = [op for op, _ in instructions]
    first_ffma = opcodes.index("FFMA") if "FFMA" in opcodes else len(opcodes)
    wide = [i for i, (_, line) in enumerate(instructions) if WIDE_LOAD.search(line)]
    return {
        "loads_16B": len(wide),
        "before_first_ffma": sum(i < first_ffma for i in wide),
        "ffma": opcodes.count("FFMA"),
        "instructions": len(opcodes),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=1, help="token rows (ROWS)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("TRITON_INTERPRET=1 is set; unset it to compile the kernel.")
    import triton
    from glue_sass_facts import compiled_sass  # scripts/: on the path

    from kernels.dense.w8a16_gemv import _w8a16_gemv_kernel, gemv_block_n, k_pieces
    from workbench.presets import get_preset
    from workbench.workloads.dense import layer_projections

    types = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "y_ptr": "*bf16"}
    print(f"Triton {triton.__version__}, sm_90, M={args.m}, four warps a program")
    for p in layer_projections(get_preset("dsv4-flash-tp2").rank_shapes()):
        main_blocks, rest, rest_p2 = k_pieces(p.k // 128)
        constants = {"ROWS": args.m, "ROWS_P2": triton.next_power_of_2(args.m),
                     "BLOCK_N": gemv_block_n(p.k, 128), "QBLOCK": 128, "KB_MAIN": main_blocks,
                     "KB_REST": rest, "KB_REST_P2": rest_p2, "BITS": True,
                     "stride_xk": 1, "stride_wk": 1, "stride_sk": 1}  # fmt: skip
        registers, sass = compiled_sass(_w8a16_gemv_kernel, types, constants)
        facts = load_order(sass)
        print(f"{p.name} (K={p.k}, {constants['BLOCK_N']} rows a program): registers "
              f"{registers}, " + ", ".join(f"{k} {v}" for k, v in facts.items()))  # fmt: skip


if __name__ == "__main__":
    main()
