"""Names of Nsight Compute report files, plain (`.ncu-rep`) or gzipped (`.ncu-rep.gz`, how the
committed ones are kept). No ncu_report import: folder listings use this where NVIDIA's
package may be missing."""

from pathlib import Path

SUFFIXES = (".ncu-rep", ".ncu-rep.gz")


def report_stem(path: Path) -> str:
    """`moe-stock-T6` of `moe-stock-T6.ncu-rep` or `moe-stock-T6.ncu-rep.gz`."""
    name = path.name
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def shadowed(path: Path) -> bool:
    """True for a `.ncu-rep.gz` with its unpacked `.ncu-rep` beside it (after `gunzip -k`, or
    a new capture over a committed report): folder listings take the unpacked one alone."""
    return path.name.endswith(".gz") and path.with_name(f"{report_stem(path)}.ncu-rep").is_file()
