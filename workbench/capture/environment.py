"""What a capture ran on: GPU, driver, CUDA, library versions, git commit, clocks, date.

Every artifact carries this, so every figure traces back to the hardware and code behind it.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch
import triton

from workbench.analysis.git_state import REPO, git_state


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _gpu() -> dict:
    if not torch.cuda.is_available():
        return {"name": None, "note": "no CUDA GPU visible"}
    props = torch.cuda.get_device_properties(0)
    info = {
        "name": props.name,
        "count": torch.cuda.device_count(),
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
    }
    if shutil.which("nvidia-smi"):
        # uuid: which card, so runs on the same card can be told from runs on another (one
        # H200's ratios differed from another's by more than a change under test)
        query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu,uuid"
        out = _run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader", "-i", "0"])
        if out:
            fields = [f.strip() for f in out.split(",")]
            info.update(dict(zip(query.split(","), fields)))
    return info


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _bytecode() -> dict:
    """Whether torch's Python modules load from a bytecode cache. Without one (an install made
    with --no-compile, and PYTHONDONTWRITEBYTECODE set so none is ever written) every process
    compiles torch's source again: on the lent H200 that cost 3 s of `import torch` and 4 s
    more when the profiler and CUDA graphs first import their modules."""
    cached = importlib.util.cache_from_source(torch.__file__)
    return {"written": not sys.dont_write_bytecode, "torch_cached": Path(cached).exists()}


def describe() -> dict:
    """The environment of this process, for `run.json`."""
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "gpu": _gpu(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "bytecode": _bytecode(),
        "platform": platform.platform(),
        "workbench": _version("moe-workbench"),
        "git": git_state(REPO),
    }
