"""Which Triton kernels a profile compiled, and for how long (run.json's `compiles`).

On an empty Triton cache a GPU profile spends most of its warm-up compiling; on a warm one it
only loads binaries from disk. The warm-up's wall time alone cannot tell the two apart, nor
say which kernels cost the most to compile (the ones to precompile or to specialise less).
Triton calls a compilation listener once per `triton.compile` (one kernel specialisation),
with the time of each stage and whether the binary came from its on-disk cache; this module
collects those calls. The C launcher Triton builds for a kernel at its first launch is not in
them, so a cold run's `compile_s` is less than its compiling costs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class CompileLog:
    """(kernel name, seconds, from the disk cache) for each compile Triton ran or loaded."""

    entries: list[tuple[str, float, bool]] = field(default_factory=list)

    def listen(self, *, src, metadata, metadata_group, times, cache_hit) -> None:
        """Triton's `CompilationListener` protocol (keyword arguments only)."""
        self.entries.append((str(metadata.get("name", src.name)), times.total / 1e6, cache_hit))

    def summary(self) -> dict:
        """run.json's `compiles`: counts and seconds of compiles and of cache loads, and the
        compiles by kernel, slowest first (a kernel compiled for two specialisations counts
        twice: the place to specialise less)."""
        by_kernel: dict[str, list[float]] = {}
        loaded = []
        for name, seconds, hit in self.entries:
            (loaded if hit else by_kernel.setdefault(name, [])).append(seconds)
        ranked = sorted(by_kernel.items(), key=lambda item: -sum(item[1]))
        return {
            "compiled": sum(len(times) for times in by_kernel.values()),
            "compile_s": round(sum(sum(times) for times in by_kernel.values()), 3),
            "loaded": len(loaded),
            "load_s": round(sum(loaded), 3),
            "by_kernel": [
                {"kernel": name, "compiles": len(times), "s": round(sum(times), 3)}
                for name, times in ranked
            ],
        }


@contextmanager
def compile_log() -> Iterator[CompileLog]:
    """Collect every compile inside the block; a listener installed before keeps hearing."""
    from triton import knobs

    log, previous = CompileLog(), knobs.compilation.listener

    def listener(**event) -> None:
        log.listen(**event)
        if previous is not None:
            previous(**event)

    knobs.compilation.listener = listener
    try:
        yield log
    finally:
        knobs.compilation.listener = previous
