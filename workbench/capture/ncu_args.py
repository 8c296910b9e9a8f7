"""What `ncu` relaunches the target with: its arguments, NVTX range names and workloads.

Kept apart from the builders (`ncu_builders`) so `workbench.capture.ncu` can name ranges and
check arguments before ncu starts, without building anything.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from workbench.analysis.ncu_files import DECODE_STEP
from workbench.errors import WorkbenchError
from workbench.presets import ROUTINGS

# What the target can build (ncu_builders.BUILDERS).
KERNELS = ("moe", "dense", "attention", DECODE_STEP)
PREFIX = "wb-ncu-target:"  # capture.ncu finds this program's own lines in ncu's output by it
DONE = f"{PREFIX} done"
DEFAULT_PRESET = "dsv4-flash-tp2"
FILTER_QUANTIFIERS = frozenset("@,[]/*+\\")
DECODE_DEFAULTS = {
    "layers": 4,  # of 40: enough for a representative step, short under ncu's replays
    "prompt_tokens": 2048,
    "prefill_chunk": 4096,
    "dense": "bf16",
    "attention": "torch",
}

Mark = Callable[[str], AbstractContextManager]  # range name -> context manager around a launch


def range_name(kernel: str, variant: str, tokens: int) -> str:
    """The NVTX range around one profiled launch; it labels the launch in the report too."""
    name = f"wb:{kernel}:{variant}:T={tokens}"
    bad = sorted(FILTER_QUANTIFIERS & set(name))
    if bad:
        raise WorkbenchError(
            f"'{name}' contains {' '.join(bad)}, which ncu's NVTX filter reads as syntax; "
            "rename the kernel or variant without these characters."
        )
    return name


def nvtx_filter(name: str) -> str:
    """ncu's `--nvtx-include` value for push/pop range `name` of the default domain."""
    return f"{name}/"


@dataclass(frozen=True)
class TargetArgs:
    """What to profile: kernel family, variant, token counts and the variant's parameters."""

    kernel: str
    variant: str
    tokens: tuple[int, ...]
    params: dict[str, object] = field(default_factory=dict)
    routing: str = "uniform"
    seed: int = 0
    preset: str = DEFAULT_PRESET
    device: str = "cuda"

    def validate(self) -> None:
        """Reject bad arguments before anything heavy (or ncu) starts."""
        if self.kernel not in KERNELS:
            raise WorkbenchError(
                f"unknown kernel '{self.kernel}'; known kernels: {', '.join(KERNELS)}"
            )
        if not self.tokens or min(self.tokens) < 1:
            raise WorkbenchError(f"tokens={list(self.tokens)}: give one or more counts >= 1.")
        if self.routing not in ROUTINGS:
            raise WorkbenchError(f"unknown routing '{self.routing}'; known: {', '.join(ROUTINGS)}")
        self.range_names()

    def range_names(self) -> list[str]:
        return [range_name(self.kernel, self.variant, t) for t in self.tokens]

    def to_argv(self) -> list[str]:
        """The command-line arguments that `parse_args` turns back into these arguments."""
        argv = ["--kernel", self.kernel, "--variant", self.variant]
        argv += ["--tokens", *map(str, self.tokens), "--routing", self.routing]
        argv += ["--seed", str(self.seed)]
        if self.preset != DEFAULT_PRESET:
            argv += ["--preset", self.preset]
        if self.device != "cuda":
            argv += ["--device", self.device]
        for key, value in self.params.items():
            argv += ["--param", f"{key}={value}"]
        return argv


@dataclass(frozen=True)
class Workload:
    """One profiled launch: `check` raises if its output is wrong, `warmup` compiles, and
    `run(mark)` performs the launch with `mark(name)` around exactly the part to profile."""

    name: str
    check: Callable[[], None]
    warmup: Callable[[], None]
    run: Callable[[Mark], None]


# ---- arguments -------------------------------------------------------------------------------
def parse_value(text: str) -> object:
    """`--param` values: int, float, true/false, none, else the string itself."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def _param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"'{text}' is not key=value (e.g. block_m=32)")
    return key, parse_value(value)


def parse_args(argv: Sequence[str] | None = None) -> TargetArgs:
    p = argparse.ArgumentParser(
        prog="python -m workbench.capture.ncu_target",
        description="Check, warm up, then launch a kernel once per token count inside an NVTX "
        "range, for ncu to profile (see workbench.capture.ncu).",
    )
    p.add_argument("--kernel", required=True, choices=sorted(KERNELS))
    p.add_argument("--variant", required=True, help="e.g. stock (kernels.moe.VARIANTS)")
    p.add_argument("--tokens", required=True, nargs="+", type=int, help="token counts")
    p.add_argument("--param", action="append", type=_param, default=[], metavar="KEY=VALUE")
    p.add_argument("--routing", default="uniform", choices=ROUTINGS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default=DEFAULT_PRESET, help="shapes (one rank's)")
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    return TargetArgs(
        a.kernel, a.variant, tuple(a.tokens), dict(a.param), a.routing, a.seed, a.preset, a.device
    )
