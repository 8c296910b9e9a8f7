"""Where a launch's PC samples fall: its source lines, or its SASS instructions where the report
maps no line. The hot-spot table of NcuReport is made here, one launch at a time.

Plain dictionaries rather than pandas: a report holds tens of thousands of (address, reason)
samples, and a groupby per launch would dominate the time to build the tables.

ncu records the absolute path each source file had on the capture machine: a checkout folder on
the GPU box (`/work/main/.snap/kernels/moe/stock.py`) or its Python environment. Those paths say
nothing to a reader elsewhere, so the table names files as a reader finds them: relative to this
repository (`kernels/moe/stock.py`), by module within an installed package
(`triton/language/standard.py`), or by what made them (`triton cache: <kernel>.py`).
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path, PurePosixPath

import pandas as pd

from workbench.analysis.ncu_metrics import STALL_SAMPLES, is_stall_sample, stall_reason

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGES = ("kernels", "workbench")  # this repository's packages: a path from them is relative
INSTALLED = ("site-packages", "dist-packages")
# Triton caches what it compiles (TRITON_CACHE_DIR, else ~/.triton/cache/<hash>/<kernel>.*);
# torch's inductor writes its generated kernels under /tmp/torchinductor_<user>/.
CACHES = {"triton cache": (".triton", "cache"), "inductor cache": ("torchinductor_",)}
# Folders that mark torch's source tree (in the paths of a torch built with line info, e.g.
# /var/lib/jenkins/workspace/aten/src/ATen/native/cuda/Reduce.cuh).
TORCH_TREES = (("aten", "src"), ("torch", "csrc"), ("c10", "cuda"), ("c10", "core"))

HOTSPOT_COLUMNS = [
    "launch", "level", "file", "line", "address", "text", "samples", "share_pct", "top_stall",
]  # fmt: skip
INSTRUCTION_COLUMNS = ["launch", "instruction", "reason", "samples", "share_pct"]
# Second words that say what an instruction does, kept in its name: WARPGROUP.DEPBAR waits for
# a wgmma and WARPGROUP.ARRIVE starts one; BAR.SYNC waits at a block barrier, BAR.ARV only
# arrives; IMAD.MOV is a register move. Other second words (types, widths, dimensions:
# IMAD.U32, UTMALDG.2D) are dropped.
SECOND_WORDS = frozenset({
    "DEPBAR", "ARRIVE", "SYNC", "ARV", "RED", "MOV", "WIDE", "SHL", "HI", "PHASECHK", "VIEW",
    "EXCH", "TRYWAIT",
})  # fmt: skip


def _in_cache(parts: tuple[str, ...]) -> str | None:
    """The cache a file lies in (a CACHES key), if any."""
    cache_dir = os.environ.get("TRITON_CACHE_DIR")
    if cache_dir and "/".join(parts).startswith(str(PurePosixPath(cache_dir)).lstrip("/")):
        return "triton cache"
    for name, marks in CACHES.items():
        for i, part in enumerate(parts):
            if part.startswith(marks[0]) and tuple(parts[i : i + len(marks)])[1:] == marks[1:]:
                return name
    return None


@lru_cache(maxsize=1024)
def readable_path(file: str) -> str:
    """A source file as a reader recognises it, whichever machine captured the report.

    This repository's files relative to it (the shortest tail of the path that is a file here
    under a top-level folder, else the tail from its last package folder, for a file since
    moved); an installed package's by module path; a cache's by kind and file name; a torch
    source file as `torch/…/<name>`; anything else as `…/<folder>/<name>`. Empty (a SASS-only
    row) stays empty. Cached: a report names a few files in thousands of rows.
    """
    if not file:
        return file
    path = PurePosixPath(file.replace("\\", "/"))
    parts = tuple(p for p in path.parts if p != "/")
    if not path.is_absolute():
        return str(path)
    cache = _in_cache(parts)
    if cache:
        return f"{cache}: {path.name}"
    installed = [i for i, part in enumerate(parts) if part in INSTALLED]
    if installed and installed[-1] + 1 < len(parts):
        return "/".join(parts[installed[-1] + 1 :])
    for start in range(len(parts) - 2, -1, -1):  # from a top-level folder of this repository
        if (REPOSITORY / parts[start]).is_dir() and (REPOSITORY / Path(*parts[start:])).is_file():
            return "/".join(parts[start:])
    packages = [i for i, part in enumerate(parts[:-1]) if part in PACKAGES]
    if packages:
        return "/".join(parts[packages[-1] :])
    if any(pair in zip(parts, parts[1:]) for pair in TORCH_TREES):
        return f"torch/…/{path.name}"
    return "/".join(("…", *parts[-2:])) if len(parts) > 2 else str(path)


def pc_samples(action, names: frozenset[str]) -> dict[int, dict[str, float]]:
    """Samples per instruction address and stall reason, from the PC-sampling metrics of a
    launch (`names`: its metric names)."""
    by_pc: dict[int, dict[str, float]] = {}
    for name in names:
        if not is_stall_sample(name):
            continue
        metric = action.metric_by_name(name)
        pcs = metric.correlation_ids() if metric.value() else None
        if pcs is None:
            continue
        reason = stall_reason(name[len(STALL_SAMPLES) :])
        for k in range(metric.num_instances()):
            samples = metric.as_double(k)
            if samples > 0:  # False for NaN too
                by_reason = by_pc.setdefault(pcs.as_uint64(k), {})
                by_reason[reason] = by_reason.get(reason, 0.0) + samples
    return by_pc


def instruction_name(sass: str) -> str:
    """The opcode of a SASS instruction, without its predicate, operands and modifiers:
    `@!P0 BRA 0x7f..` is BRA, `QGMMA.64x128x32.F32.E4M3.E4M3 R24, ..` QGMMA; where the first
    word alone says too little, with the second (`WARPGROUP.DEPBAR`, `BAR.SYNC`, `IMAD.MOV`)."""
    words = [w for w in sass.split() if not w.startswith("@")]
    if not words:
        return "?"
    parts = words[0].split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in SECOND_WORDS else parts[0]


def instruction_stalls(action, by_pc: dict[int, dict[str, float]], label: str) -> pd.DataFrame:
    """A launch's PC samples by (SASS opcode, stall reason), most sampled first, in
    INSTRUCTION_COLUMNS; `by_pc` is pc_samples() of the launch.

    Why beside the source lines: a Gluon kernel's warp-specialised partitions map many
    instructions to one line (its `def`, its loop head), so a line's top stall can hide what
    waits. Two kinds of sample stand out by opcode: WARPGROUP.DEPBAR at `barrier` is a warp
    waiting for its own wgmma (the tensor cores' work). NOP at `barrier` was, in the W8A8
    Gluon kernel, the three warps its one-warp load partition leaves idle in a warpgroup,
    parked for the whole launch (a quarter of its 12 warps and of its samples): not a cost,
    but a share of every stall table's samples; elsewhere, read the SASS around it."""
    counts: dict[tuple[str, str], float] = {}
    for pc, by_reason in by_pc.items():
        name = instruction_name(action.sass_by_pc(pc))
        for reason, samples in by_reason.items():
            counts[(name, reason)] = counts.get((name, reason), 0.0) + samples
    total = sum(counts.values())
    rows = sorted(counts.items(), key=lambda item: -item[1])
    return pd.DataFrame(
        [(label, name, reason, n, 100 * n / total) for (name, reason), n in rows],
        columns=INSTRUCTION_COLUMNS,
    )


def _source_text(sources: dict[str, list[str]], file: str, line: int) -> str:
    """A source line's text: from the source ncu imported, else from the file if it is here."""
    if not sources.get(file) and Path(file).is_file():
        sources[file] = Path(file).read_text(errors="replace").splitlines()
    lines = sources.get(file, [])
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def hot_lines(action, by_pc: dict[int, dict[str, float]], label: str, start: float) -> pd.DataFrame:
    """Every sampled source line (or SASS instruction, where no line is known) of one launch,
    hottest first, in HOTSPOT_COLUMNS, `file` as readable_path() names it; `by_pc` is
    pc_samples() of the launch. `start` is the kernel's first address (NaN if unknown), so
    SASS addresses read as offsets into the function."""
    lines: dict[tuple, dict[str, float]] = {}
    for pc, by_reason in by_pc.items():
        info = action.source_info(pc)
        known = info is not None and info.file_name() and info.line() > 0
        key = ("source", info.file_name(), info.line()) if known else ("sass", pc)
        merged = lines.setdefault(key, {})
        for reason, samples in by_reason.items():
            merged[reason] = merged.get(reason, 0.0) + samples
    # Read only where a line is known: ncu_report's source_files() is the slow call (90 ms
    # for one of torch's kernels, which map no line), 20 s of a 134-kernel step report.
    sources = {}
    if any(key[0] == "source" for key in lines):
        sources = {f: text.splitlines() for f, text in action.source_files().items()}
    rows = []
    for key, by_reason in lines.items():
        top = max(by_reason, key=by_reason.get)
        if key[0] == "source":
            text = _source_text(sources, key[1], key[2])
            file = readable_path(key[1])
            rows.append(("source", file, key[2], "", text, sum(by_reason.values()), top))
        else:
            offset = key[1] if math.isnan(start) else key[1] - int(start)
            address = f"0x{offset:05x}"
            text = action.sass_by_pc(key[1]).strip()
            rows.append(("sass", "", None, address, text, sum(by_reason.values()), top))
    rows.sort(key=lambda row: -row[5])
    level, file, line, address, text, samples, top = list(zip(*rows)) or [()] * 7
    total = sum(samples)
    return pd.DataFrame(
        {
            "launch": [label] * len(rows),
            "level": level,
            "file": file,
            "line": pd.array(line, dtype="Int64"),
            "address": address,
            "text": text,
            "samples": samples,
            "share_pct": [100 * count / total for count in samples],
            "top_stall": top,
        },
        columns=HOTSPOT_COLUMNS,
    )
