"""Whether a JIT-compiling peer can run here: its package imports and the GPU is new enough.

humming and DeepGEMM both compile their kernels for the GPU they find, so both ask the same
three questions, and a broken install is a `missing-peer` row with the error, never a crash.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch


def jit_peer_available(
    name: str, modules: Sequence[str], install: str, min_major: int, needs: str
) -> tuple[bool, str]:
    """(True, "<name> <version>") when every module of `modules` imports (the first is the
    package, whose version is named) and the GPU is SM `min_major`0 or newer; else (False,
    why), with `install` saying how to get it and `needs` what the SM floor is for."""
    try:
        package = [importlib.import_module(module) for module in modules][0]
    except ImportError as err:
        return False, f"{name} is not installed ({err}): {install}"
    except Exception as err:  # noqa: BLE001 (a broken install is a missing peer, not a crash)
        return False, f"{name} does not import: {type(err).__name__}: {err}"
    if not torch.cuda.is_available():
        return False, f"no CUDA GPU: {name} JIT-compiles its kernels for the GPU it runs on"
    major, minor = torch.cuda.get_device_capability()
    if major < min_major:
        return False, f"{needs} need SM{min_major}0+; this GPU is sm_{major}{minor}"
    return True, f"{name} {getattr(package, '__version__', '?')}"
