"""Nsight Compute report files: their names and packings, whether one is whole, its bytes, and
the capture's metadata beside it. No ncu_report import: folder listings use this where NVIDIA's
package may be missing.

A report is plain (`.ncu-rep`), gzipped (`.ncu-rep.gz`) or xz-packed (`.ncu-rep.xz`). Why two
packings: ncu's format compresses about 6 to 1 under gzip, enough for reports of a few Triton
kernels. A report of a whole model step embeds the cubin of every launch's module (torch's and
cuBLAS's are large, and the same module comes back launch after launch): 87% of a 178 MB
decode-step report was cubin images, which gzip's 32 KB window cannot fold together and xz's
64 MB one can (22 MB gzipped, 4.9 MB as `xz -9`).

`ncu_report` loads an empty, foreign or cut-off file without complaint, as zero ranges or as the
launches before the cut, so a report is checked before it is opened: it exists and is not empty,
it starts with ncu's header `NVR\\0`, and its blocks (each a length-prefixed header that gives
the size of the payload after it) run exactly to the end of the file. `ncu_report` reads only
paths, so a packed report is unpacked to a temporary file first.
"""

from __future__ import annotations

import gzip
import json
import lzma
import struct
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import ArtifactError

PLAIN = ".ncu-rep"
MAGIC = b"NVR\x00"  # the first bytes of every report ncu writes
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


# ---- is the file whole -------------------------------------------------------------------------
def _varint(data: bytes, i: int) -> tuple[int, int]:
    """(value, index after it) of the protobuf varint at `data[i]`."""
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _payload_size(header: bytes) -> int:
    """Field 5 of a block header (protobuf): the size of the payload that follows it."""
    i = 0
    while i < len(header):
        key, i = _varint(header, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(header, i)
            if field == 5:
                return value
        elif wire == 2:
            size, i = _varint(header, i)
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    return 0


def framing_problem(data: bytes) -> str | None:
    """Why `data` is not a whole report file (None when every block ends where the next starts)."""
    if len(data) < 8:
        return "it ends inside the file header"
    offset = 8 + struct.unpack_from("<I", data, 4)[0]
    blocks = 0
    while offset < len(data):
        if offset + 4 > len(data):
            return f"it ends inside the length of block {blocks + 1}"
        start = offset + 4
        end = start + struct.unpack_from("<I", data, offset)[0]
        if end > len(data):
            return f"it ends inside the header of block {blocks + 1}"
        try:
            offset = end + _payload_size(data[start:end])
        except (IndexError, ValueError):
            return f"the header of block {blocks + 1} is not readable"
        blocks += 1
    if offset != len(data):
        return f"it ends {offset - len(data)} bytes short of the end of block {blocks}"
    return None


# ---- reading it --------------------------------------------------------------------------------
def existing_form(path: Path) -> Path:
    """`path`, or where it does not exist, the same report in a form that does (the committed
    reports are `.ncu-rep.xz`, and a name without `.xz` means the same report)."""
    if path.exists():
        return path
    stem = report_stem(path)
    forms = (path.with_name(stem + suffix) for suffix in SUFFIXES)
    return next((form for form in forms if form.is_file()), path)


def _read_bytes(path: Path) -> bytes:
    """The report's bytes as ncu wrote them: a packed report unpacked."""
    if not path.exists():
        raise ArtifactError(
            f"{path} does not exist; give the path of an .ncu-rep file (e.g. under ncu/) or "
            "capture one on the GPU machine with workbench.capture.ncu.capture()."
        )
    if not path.is_file():
        raise ArtifactError(f"{path} is not a file; give the path of an .ncu-rep file.")
    how = packing(path)
    if how is None:
        return path.read_bytes()
    packed, kind = path.read_bytes(), path.suffix.lstrip(".")
    if not packed.startswith(how.magic):
        raise ArtifactError(
            f"{path} is named {path.suffix} but holds no {kind} data (it starts with "
            f"{packed[:8]!r}); if it is a plain report, name it .ncu-rep."
        )
    try:
        return how.unpack(packed)
    except how.errors as err:
        raise ArtifactError(
            f"{path} is not a readable {kind} file ({err}): it is truncated or damaged. Pack "
            f"the report again with {how.command}, or give the .ncu-rep itself."
        ) from None


def read_report(path: Path) -> bytes:
    """The bytes of a whole report (a packed one unpacked); ArtifactError saying what is wrong
    and what to do for a missing, empty, foreign, misnamed or cut-off file."""
    data = _read_bytes(path)
    if not data:
        raise ArtifactError(
            f"{path} is empty (0 bytes): ncu was stopped before it wrote the report. "
            "Re-run the capture."
        )
    if not data.startswith(MAGIC):
        raise ArtifactError(
            f"{path} is not an Nsight Compute report: it starts with {data[:8]!r}, not ncu's "
            f"header {MAGIC!r}. Give an .ncu-rep file written by ncu -o."
        )
    problem = framing_problem(data)
    if problem:
        raise ArtifactError(
            f"{path} is truncated or damaged: {problem} ({len(data):,} bytes). ncu_report would "
            "silently read only the launches before the damage; re-run the capture."
        )
    return data


def openable(path: Path, data: bytes) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """(a path ncu_report can open, the folder that holds it if it is a copy): the report
    itself, or an unpacked copy (`data`, from read_report) of a packed one. ncu_report reads
    parts of a report (stall samples, source, rules) lazily, so the copy must live as long as
    the report: the caller keeps the folder with it, and it is removed when the report is
    dropped or the process ends."""
    if packing(path) is None:
        return path, None
    folder = tempfile.TemporaryDirectory(prefix="workbench-ncu-")
    unpacked = Path(folder.name) / f"{report_stem(path)}{PLAIN}"
    unpacked.write_bytes(data)
    return unpacked, folder


def read_sidecar(path: Path) -> dict:
    """`<name>.json` beside the report (what capture() ran), if there is one; else {}."""
    sidecar = path.with_name(f"{report_stem(path)}.json")
    if not sidecar.is_file():
        return {}
    try:
        meta = json.loads(sidecar.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(
            f"{sidecar} (the capture's metadata) is not valid JSON ({err}); re-run the capture "
            "or remove the file."
        ) from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"{sidecar} holds no JSON object; re-run the capture.")
    return meta
