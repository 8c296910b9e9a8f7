"""The profile's own clock and bar: per-phase timings for run.json, and one progress bar whose
description names the phase the work is in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

if TYPE_CHECKING:
    from workbench.capture.profile_run import ProfileSpec


@contextmanager
def timed(phases: dict[str, float], name: str) -> Iterator[None]:
    """Add the time the block takes to `phases[name]` (seconds)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


class Progress:
    """The profile's one bar, over the layers profiled; its description names the phase the
    work is in (`building`, `warming up`, `capturing the decode graph`, `prefill chunk i/n`,
    `decode step i/n`, `exporting trace`, `parsing`). Disabled, it prints nothing."""

    def __init__(self, spec: ProfileSpec, enabled: bool) -> None:
        plan = spec.plan
        self.chunks, self.steps = len(plan.chunks()), plan.decode_tokens
        self.layers = spec.model_preset().layers  # the model's: SyntheticModel takes no other
        self.name = f"profile {spec.preset}"
        self.done = 0  # layers profiled (tqdm counts nothing when disabled)
        self.shown: str | None = None
        self.bar = tqdm(
            total=(self.chunks + self.steps) * self.layers,
            unit="layer",
            desc=self.name,
            disable=not enabled,
        )

    def phase(self, what: str, refresh: bool = True) -> None:
        if what != self.shown:
            self.shown = what
            self.bar.set_description(f"{self.name}: {what}", refresh=refresh)

    def position(self) -> str:
        """The prefill chunk or decode step that the next layer belongs to."""
        finished = self.done // self.layers  # prefill chunks, then decode steps
        if finished < self.chunks:
            return f"prefill chunk {finished + 1}/{self.chunks}"
        return f"decode step {min(finished - self.chunks + 1, self.steps)}/{self.steps}"

    def tick(self, layers: int) -> None:
        self.done += layers
        self.phase(self.position(), refresh=False)  # update() redraws, at tqdm's own pace
        self.bar.update(layers)

    def close(self) -> None:
        self.bar.close()
