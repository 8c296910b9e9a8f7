"""scripts/dense_gemv_sass.py reads, off a kernel's SASS, how many of its 16-byte global loads
come before its first FFMA: the CUDA-core W8A16 kernel's design (kernels/dense/w8a16_gemv.py)
is that a program's loads are all in flight before it multiplies."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from dense_gemv_sass import load_order  # noqa: E402 (scripts/ is not a package)

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/              @!P0 LDG.E.128 R8, desc[UR4][R2.64+0x200] ;
        /*0030*/                   LDG.E.64 R12, desc[UR4][R6.64] ;
        /*0040*/                   PRMT R14, R4, 0x9180, RZ ;
        /*0050*/                   FFMA R16, R14, R12, RZ ;
        /*0060*/                   LDG.E.128 R20, desc[UR4][R6.64+0x10] ;
        /*0070*/                   FFMA R16, R20, R12, R16 ;
        /*0080*/                   EXIT ;
"""


def test_the_16_byte_loads_before_the_first_ffma_are_counted_predicated_or_not():
    assert load_order(SASS) == {
        "loads_16B": 3,
        "before_first_ffma": 2,
        "ffma": 2,
        "instructions": 9,
    }


def test_a_kernel_without_an_ffma_has_every_load_before_it():
    facts = load_order(SASS.replace("FFMA", "FMUL"))
    assert facts["before_first_ffma"] == facts["loads_16B"] == 3
    assert facts["ffma"] == 0
