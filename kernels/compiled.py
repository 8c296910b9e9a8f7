"""What the compiler made of the Triton kernels one call launched: registers, spills, smem.

Sweeps record these next to timings because a config that spills or exhausts shared memory
explains its own slowness (the seed's "Things that did not help" table). Every kernel launch of
the MoE, dense and attention kernels goes through `launch`, and each public entry point wraps
its launches in `recording()`, after which `last_facts()` returns them. A leaf module: it
imports nothing of `kernels`, so every kernel family can use it without import cycles. A module-
level record rather than a `return_facts=` flag keeps every variant's return type a plain
Tensor, so the workbench model (which only sees VARIANTS[name]) can still read the facts after a
call. It is per process, not per thread: read it from the thread that made the call, before the
next call.

Under TRITON_INTERPRET there is no compiled kernel; the facts are then all None.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


def interpreting() -> bool:
    """Whether Triton runs its kernels under the interpreter (TRITON_INTERPRET set): on the
    CPU, with no compiled kernel, no GPU-only PTX and no compile facts."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@dataclass(frozen=True)
class KernelFacts:
    """Per-kernel compile results; None where the kernel ran under the interpreter."""

    n_regs: int | None
    n_spills: int | None
    shared_bytes: int | None


_recordings: list[dict[str, KernelFacts]] = []
_last: dict[str, KernelFacts] = {}


def facts_of(compiled: Any) -> KernelFacts:
    """Read registers per thread, spilled registers and static shared memory off a CompiledKernel.

    `compiled` is what `kernel[grid](...)` returned: a CompiledKernel on the GPU (its handles,
    which carry n_regs and n_spills, are loaded by the launch), None under the interpreter.
    """
    metadata = getattr(compiled, "metadata", None)
    return KernelFacts(
        n_regs=getattr(compiled, "n_regs", None),
        n_spills=getattr(compiled, "n_spills", None),
        shared_bytes=getattr(metadata, "shared", None),
    )


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """kernel[grid](*args, **kwargs), noting its facts in the active recording, if any.

    The name is the kernel function's without its leading underscore; a kernel launched again
    in the same call gets "#2", "#3", ... appended.
    """
    compiled = kernel[grid](*args, **kwargs)
    if not _recordings:
        return
    facts = _recordings[-1]
    base = kernel.fn.__name__.lstrip("_")
    name, repeat = base, 1
    while name in facts:
        repeat += 1
        name = f"{base}#{repeat}"
    facts[name] = facts_of(compiled)


@contextmanager
def recording() -> Iterator[dict[str, KernelFacts]]:
    """Collect the facts of the launches inside; they become last_facts() if no error escapes."""
    global _last
    facts: dict[str, KernelFacts] = {}
    _recordings.append(facts)
    try:
        yield facts
    finally:
        _recordings.pop()
    _last = facts


def forget_facts() -> None:
    """Empty last_facts(), so a call that launches no Triton kernel (cuBLAS, a torch op) reads
    as having none rather than as the previous call's."""
    global _last
    _last = {}


def last_facts() -> dict[str, KernelFacts]:
    """Kernel name -> KernelFacts for the launches of the last completed MoE call, in order."""
    return dict(_last)
