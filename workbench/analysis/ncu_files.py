"""Names and packings of Nsight Compute report files: plain (`.ncu-rep`), gzipped (`.ncu-rep.gz`)
or xz-packed (`.ncu-rep.xz`). No ncu_report import: folder listings use this where NVIDIA's
package may be missing.

Why two packings: ncu's format compresses about 6 to 1 under gzip, enough for reports of a few
Triton kernels. A report of a whole model step embeds the cubin of every launch's module (torch's
and cuBLAS's are large, and the same module comes back launch after launch): 87% of a 178 MB
decode-step report was cubin images, which gzip's 32 KB window cannot fold together and xz's
64 MB one can (22 MB gzipped, 4.9 MB as `xz -9`).
"""

from __future__ import annotations

import gzip
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PLAIN = ".ncu-rep"
# The kernel name of whole-step captures: report names (`model-decode-step-stock-T1`) and the
# capture metadata's "kernel" use it; readers tell step reports from kernel reports by it.
DECODE_STEP = "model-decode-step"


@dataclass(frozen=True)
class Packing:
    """How a packed report is recognised and unpacked, and the command that packs one."""

    command: str
    magic: bytes
    unpack: Callable[[bytes], bytes]
    errors: tuple[type[Exception], ...]


PACKINGS = {
    ".gz": Packing("gzip -k", b"\x1f\x8b", gzip.decompress, (OSError, EOFError, zlib.error)),
    ".xz": Packing("xz -9 -k", b"\xfd7zXZ\x00", lzma.decompress, (lzma.LZMAError, EOFError)),
}
SUFFIXES = (PLAIN, *(PLAIN + packed for packed in PACKINGS))  # the preferred first


def packing(path: Path) -> Packing | None:
    """The packing of a `.ncu-rep.gz` or `.ncu-rep.xz`; None for anything else."""
    return PACKINGS.get(path.suffix) if path.name.endswith(SUFFIXES[1:]) else None


def report_stem(path: Path) -> str:
    """`moe-stock-T6` of `moe-stock-T6.ncu-rep`, `.ncu-rep.gz` or `.ncu-rep.xz`."""
    name = path.name
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def shadowed(path: Path) -> bool:
    """True for a report with a preferred form of itself beside it (an unpacked `.ncu-rep`
    after `gunzip -k`, or a new capture over a committed report; a `.gz` beside an `.xz`):
    folder listings take the preferred one alone."""
    stem = report_stem(path)
    suffix = path.name[len(stem) :]
    if suffix not in SUFFIXES:
        return False
    better = SUFFIXES[: SUFFIXES.index(suffix)]
    return any(path.with_name(stem + other).is_file() for other in better)
