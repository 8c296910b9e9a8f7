"""What a sweep or A/B run checks and decides before any worker starts.

Each configuration runs in a fresh worker that imports torch and builds its inputs, so a
setting that can only fail (a keyword the kernel variant does not take, zero tokens, an
unknown format) would fail once per configuration, slowly, as rows; it is refused here, with
the fix, before anything is written. Here the workers' device is decided too: without a GPU
they run on the CPU, at preset `tiny` unless a preset is given (the default preset's experts
take tens of GB there) and with TRITON_INTERPRET=1 (Triton has no CPU driver otherwise), as
one line on stderr says. And each configuration's host memory is estimated
(`worker_memory`): a CPU run none of whose workers fits the free memory is refused whole.
"""

from __future__ import annotations

import inspect
import numbers
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace

from workbench.analysis.stats import Repeats
from workbench.capture import memory
from workbench.capture.memory import GIB, NotEnoughMemoryError
from workbench.capture.worker_memory import dense_host_bytes, moe_host_bytes, profile_host_bytes
from workbench.capture.workers import visible_gpus
from workbench.errors import WorkbenchError
from workbench.presets import ROUTINGS, Preset, RankShapes, get_preset, with_overrides
from workbench.workloads.profile_params import split_settings

# A MoE configuration's workload; preset None: DEFAULT_PRESET for where the workers run.
WORKLOAD = {"variant": "stock", "fmt": "fp8", "routing": "uniform", "seed": 0,
            "preset": None, "device": None}  # fmt: skip
# A dense A/B configuration's workload (`experiments.measure_dense`); block None: the FP8
# weights' default block (kernels.dense.DEFAULT_BLOCK).
DENSE_WORKLOAD = {"variant": "w8a16", "block": None, "seed": 0, "preset": None, "device": None}
SHAPE_FIELDS = {f.name for f in fields(RankShapes)}
DEFAULT_PRESET = {True: "dsv4-flash-tp2", False: "tiny"}  # by whether the workers have GPUs
CPU_ENV = {"TRITON_INTERPRET": "1"}  # set in CPU workers before anything imports triton


@dataclass(frozen=True)
class Placement:
    """Where a run's workers go and what each needs: `workers.run_configs`' keywords."""

    gpus: list[str]  # one worker per GPU; none: CPU workers under the Triton interpreter
    host_bytes: Callable[[dict], int]  # a configuration's estimated peak host memory

    def keywords(self) -> dict:
        env = {} if self.gpus else dict(CPU_ENV)
        return {"gpus": self.gpus, "env": env, "host_bytes": self.host_bytes}


def count(name: str, value: object, minimum: int = 1) -> int:
    """A whole number >= minimum (numpy integers too; not a bool, float or string)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise WorkbenchError(f"{name}={value!r} is not a whole number; give an integer.")
    if value < minimum:
        raise WorkbenchError(f"{name}={value} is below {minimum}; give at least {minimum}.")
    return int(value)


def distinct(name: str, labels: Sequence[str]) -> None:
    """Refuse an empty or repeated list of values (one row per value: a repeat is lost)."""
    if not labels:
        raise WorkbenchError(f"give at least one of {name}.")
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise WorkbenchError(f"{name}: {twice[0]} is given twice; give each once.")


def token_counts(tokens: Iterable[object] | int) -> list[int]:
    """The token counts of a run, each a whole number >= 1, each once."""
    tokens = [tokens] if isinstance(tokens, numbers.Integral) else list(tokens)
    if not tokens:
        raise WorkbenchError("give at least one token count (e.g. tokens=[6, 4096]).")
    counts = [count("tokens", t) for t in tokens]
    distinct("tokens", [str(t) for t in counts])
    return counts


def repeats(given: dict) -> dict:
    """`Repeats` fields with the defaults filled in; an unknown field is refused."""
    try:
        return asdict(Repeats(**(asdict(Repeats()) | dict(given))))
    except TypeError:
        known = ", ".join(f.name for f in fields(Repeats))
        raise WorkbenchError(f"repeats={given!r}: its fields are {known}.") from None


def _gpus(devices: Iterable[object]) -> list[str]:
    """The GPUs a run's workers spread over, [] for the CPU: device None takes the visible
    GPUs (none: the CPU), 'cuda' needs one, 'cpu' stays on the CPU."""
    chosen = set(devices)
    if len(chosen) > 1:
        raise WorkbenchError(f"device: {sorted(map(str, chosen))}; a run uses one device.")
    device = chosen.pop() if chosen else None
    if device not in (None, "cpu", "cuda"):
        raise WorkbenchError(
            f"device={device!r}: give 'cuda', 'cpu' or leave it out; workers take one GPU each "
            "(CUDA_VISIBLE_DEVICES chooses which)."
        )
    gpus = [] if device == "cpu" else visible_gpus()
    if device == "cuda" and not gpus:
        raise WorkbenchError(
            "device='cuda' was asked for but no GPU is visible; leave device out to run on the "
            "CPU (preset tiny, Triton under its interpreter)."
        )
    return gpus


def _keywords(function: Callable, keyword_only: bool) -> list[str] | None:
    """The keyword parameters of a variant's function (None: it takes any): its keyword-only
    ones, or with `keyword_only` False every one with a default."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    if keyword_only:
        return [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
    return [p.name for p in parameters if p.default is not p.empty]


def _refuse_unknown(kind: str, config: dict, known: list[str] | None, workload: dict) -> None:
    """Refuse kernel parameters the variant does not take, naming what it does take."""
    unknown = [] if known is None else sorted(set(config["params"]) - set(known))
    if unknown:
        raise WorkbenchError(
            f"{kind} variant '{config['workload']['variant']}' takes no parameter "
            f"{', '.join(unknown)}; its parameters: {', '.join(known) or 'none'}; the workload: "
            f"{', '.join(workload)}; shape overrides: {', '.join(sorted(SHAPE_FIELDS))}."
        )


def _check_moe(config: dict) -> None:
    """Refuse a MoE configuration that could only fail."""
    from kernels.moe import FORMATS, VARIANTS

    w = config["workload"]
    if w["variant"] not in VARIANTS:
        raise WorkbenchError(f"unknown moe variant '{w['variant']}'; known: {', '.join(VARIANTS)}")
    if w["fmt"] not in FORMATS:
        raise WorkbenchError(f"unknown weight format fmt={w['fmt']!r}; known: {', '.join(FORMATS)}")
    if w["routing"] not in ROUTINGS:
        raise WorkbenchError(f"unknown routing '{w['routing']}'; known: {', '.join(ROUTINGS)}")
    count("seed", w["seed"], minimum=0)
    overrides = {k: count(k, v) for k, v in config["shapes"].items()}
    shapes = replace(get_preset(w["preset"]).rank_shapes(), **overrides)
    if shapes.top_k > shapes.experts:
        raise WorkbenchError(f"top_k={shapes.top_k} is more than experts={shapes.experts}.")
    _refuse_unknown("moe", config, _keywords(VARIANTS[w["variant"]], True), WORKLOAD)


def _check_dense(config: dict) -> None:
    """Refuse a dense configuration that could only fail."""
    from kernels.dense import VARIANTS

    w = config["workload"]
    if w["variant"] not in VARIANTS:
        raise WorkbenchError(
            f"unknown dense variant '{w['variant']}'; known: {', '.join(VARIANTS)}"
        )
    count("seed", w["seed"], minimum=0)
    if w["block"] is not None:
        count("block", w["block"])
    overrides = {k: count(k, v) for k, v in config["shapes"].items()}
    replace(get_preset(w["preset"]).rank_shapes(), **overrides)
    # a variant that takes any keyword refuses what it does not take itself
    _refuse_unknown("dense", config, _keywords(VARIANTS[w["variant"]], False), DENSE_WORKLOAD)


def place_dense(configs: list[dict]) -> Placement:
    """Check dense configurations, fill in their preset, and place their workers."""
    from workbench.workloads.dense import layer_projections

    def host_bytes(c: dict, on_gpu: bool) -> int:
        shapes = replace(get_preset(c["workload"]["preset"]).rank_shapes(), **c["shapes"])
        projections = layer_projections(shapes)
        elements = sum(p.n * p.k * p.count for p in projections)
        io_elements = sum((p.n + p.k) * p.count for p in projections)
        return dense_host_bytes(elements, io_elements, c["tokens"], on_gpu)

    return _place(configs, _check_dense, host_bytes)


def _place(configs: list[dict], check: Callable[[dict], None],
           host_bytes: Callable[[dict, bool], int]) -> Placement:  # fmt: skip
    """Fill in the configurations' preset where none is given (DEFAULT_PRESET for where the
    workers run), `check` each, and place their workers: on the GPUs, else on the CPU as far
    as its memory holds them (`_on_the_cpu`)."""
    gpus = _gpus(c["workload"]["device"] for c in configs)
    defaulted = False
    for config in configs:
        if config["workload"]["preset"] is None:
            config["workload"]["preset"] = DEFAULT_PRESET[bool(gpus)]
            defaulted = True
        check(config)

    def placed_bytes(c: dict) -> int:
        return host_bytes(c, bool(gpus))

    if not gpus:
        preset = configs[0]["workload"]["preset"]
        _on_the_cpu(
            [(placed_bytes(c), c["workload"]["preset"]) for c in configs],
            f"preset '{preset}'{' (the default without one)' if defaulted else ''}, the Triton "
            "kernels under their interpreter (TRITON_INTERPRET=1)",
        )
    return Placement(gpus, placed_bytes)


def _on_the_cpu(needs: list[tuple[int, str]], what: str) -> None:
    """Refuse the run when not one of its workers fits (`needs`: each configuration's host
    bytes and preset), else say in one line how its CPU workers run."""
    free = memory.available_host_bytes()
    need, preset = min(needs)
    if free is not None and need > free:
        raise NotEnoughMemoryError(
            f"preset '{preset}' needs about {need / GIB:.1f} GiB per worker on the CPU and "
            f"{free / GIB:.1f} GiB is free, so not one worker fits: use preset=tiny (the "
            "default without a GPU) or smaller shapes, or run on a GPU."
        )
    print(f"workbench: no GPU for the workers: {what}; times are the CPU's, not a GPU's.",
          file=sys.stderr)  # fmt: skip


def place_moe(configs: list[dict]) -> Placement:
    """Check MoE configurations, fill in their preset, and place their workers."""

    def host_bytes(c: dict, on_gpu: bool) -> int:
        shapes = replace(get_preset(c["workload"]["preset"]).rank_shapes(), **c["shapes"])
        return moe_host_bytes(shapes, c["workload"]["fmt"], c["tokens"], on_gpu)

    return _place(configs, _check_moe, host_bytes)


def _profile_arm(config: dict, on_gpu: bool) -> tuple[Preset, dict]:
    """A profile A/B arm's preset (with its shape overrides) and profile parameters; unknown
    settings and variants are refused."""
    from workbench.capture.profile_settings import check_moe_format, device_defaults
    from workbench.workloads.model import SyntheticModel

    settings = {k: v for k, v in config["settings"].items() if k != "decode_tokens"}
    params, overrides = split_settings(settings)
    params = device_defaults(params, on_gpu)
    SyntheticModel.check_variants(moe=params["moe"], dense=params["dense"],
                                  attention=params["attention"])  # fmt: skip
    check_moe_format(params["moe"], params["moe_format"])
    preset = get_preset(params["preset"] or DEFAULT_PRESET[on_gpu])
    return with_overrides(preset, **overrides), params


def place_profile(configs: list[dict]) -> Placement:
    """Check profile A/B arms and place their workers."""
    gpus = _gpus(c["settings"].get("device") for c in configs)
    for config in configs:
        _profile_arm(config, bool(gpus))

    def host_bytes(c: dict) -> int:
        preset, params = _profile_arm(c, bool(gpus))
        return profile_host_bytes(preset, c["tokens"], params["prefill_chunk"],
                                  params["streams"], bool(gpus))  # fmt: skip

    if not gpus:
        name = _profile_arm(configs[0], False)[0].name
        _on_the_cpu([(host_bytes(c), _profile_arm(c, False)[0].name) for c in configs],
                    f"preset '{name}', torch references for the Triton kernels")  # fmt: skip
    return Placement(gpus, host_bytes)
