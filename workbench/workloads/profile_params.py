"""The parameters of a profile, defined once: the API, the CLI and profile A/Bs read this table.

A setting is spelled `name=value` everywhere on the command line (`--param moe=flat
dense=w8a16` for a profile, `--a dense=w8a16 --b dense=hybrid` for an A/B's arms) and
`name=value` as a keyword in Python; a name that is not a parameter here must be a preset
field (a shape override such as `layers=2`). Pure Python: the CLI parses settings without
importing torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from workbench.errors import WorkbenchError
from workbench.presets import Preset


def _optional_int(text: str) -> int | None:
    return None if text.lower() in {"none", "0"} else int(text)


def _optional_bool(text: str) -> bool | None:
    lowered = text.lower()
    if lowered in {"true", "yes", "1", "on"}:
        return True
    if lowered in {"false", "no", "0", "off"}:
        return False
    if lowered in {"none", "auto"}:
        return None
    raise ValueError(f"{text!r} is not true, false or auto")


@dataclass(frozen=True)
class Param:
    """One profile parameter: its default, how a command-line value is read, and what it does."""

    name: str
    default: object
    parse: Callable[[str], object]
    help: str


PARAMS: tuple[Param, ...] = (
    Param("preset", None, str, "model preset (default: dsv4-flash-tp2 on a GPU, else tiny)"),
    Param(
        "moe",
        "stock",
        str,
        "MoE kernel: stock, multirow, flat, padded, w8a8 (FP8 activations), flat_w8a8 (w8a8 "
        "at prefill, flat at decode); a MoE peer",
    ),
    Param(
        "moe_format",
        None,
        str,
        "experts' weights: bf16, fp8 (128x128 blocks), int4 (group 128) (GPU: fp8, CPU: bf16)",
    ),
    Param(
        "dense",
        None,
        str,
        "dense GEMMs: bf16 (cuBLAS), w8a16, w8a8, hybrid, a dense peer (GPU: w8a16, CPU: bf16)",
    ),
    Param(
        "attention",
        None,
        str,
        "sparse attention: torch (reference), triton (bf16 keys) or fp8 (FP8 keys, as served) "
        "(GPU: fp8, CPU: torch)",
    ),
    Param("routing", "uniform", str, "expert routing: uniform or skewed (seeded)"),
    Param("streams", 1, int, "tokens decoded per step"),
    Param("prefill_chunk", 4096, _optional_int, "prefill chunk in tokens; none: one pass"),
    Param("seed", 0, int, "seed of weights, routing and activations"),
    Param("device", None, str, "cuda or cpu (default: cuda when a GPU is visible)"),
    Param("tp", None, _optional_int, "tensor parallelism: N ranks through torch.distributed"),
    Param("cuda_graphs", None, _optional_bool, "replay decode steps as CUDA graphs (GPU: on)"),
    Param("hybrid_m", None, _optional_int, "dense=hybrid: largest M sent to W8A16 (256)"),
    Param(
        "dense_pdl",
        False,
        _optional_bool,
        "dense=w8a16 or hybrid: launch the W8A16 GEMMs with programmatic dependent launch "
        "(auto: where the GPU has it; off by default: it made the served decode step slower)",
    ),
)
BY_NAME: dict[str, Param] = {p.name: p for p in PARAMS}
PRESET_FIELDS = frozenset(f.name for f in fields(Preset))
# Preset fields that are text (the per-layer attention letters); the others are integers.
TEXT_FIELDS = frozenset(f.name for f in fields(Preset) if f.type in (str, "str"))


def split_settings(settings: Mapping[str, object]) -> tuple[dict, dict]:
    """(profile parameters with defaults filled in, preset-field overrides); an unknown name
    is refused with the known ones listed."""
    unknown = sorted(set(settings) - set(BY_NAME) - PRESET_FIELDS)
    if unknown:
        raise WorkbenchError(
            f"unknown profile setting {', '.join(unknown)}; the parameters are "
            f"{', '.join(BY_NAME)}, and preset fields (shape overrides) are "
            f"{', '.join(sorted(PRESET_FIELDS))}."
        )
    params = {p.name: settings.get(p.name, p.default) for p in PARAMS}
    overrides = {k: v for k, v in settings.items() if k in PRESET_FIELDS}
    return params, overrides


def parse_setting(text: str) -> tuple[str, object]:
    """`name=value` from the command line, the value read as the parameter's type (preset
    fields are integers, but for the text ones such as attention_layers=WWCHC)."""
    name, sep, raw = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not name:
        raise WorkbenchError(f"setting {text!r}: write it as name=value, e.g. moe=flat")
    parse = BY_NAME[name].parse if name in BY_NAME else int if name in PRESET_FIELDS else None
    if name in TEXT_FIELDS:
        parse = str
    if parse is None:
        split_settings({name: raw})  # raises with the known names
    try:
        return name, parse(raw)
    except ValueError as err:
        raise WorkbenchError(f"setting {text!r}: {err}") from None


def describe() -> str:
    """The parameter table as text, for `--help` and docstrings."""
    return "\n".join(f"  {p.name}={p.default}: {p.help}" for p in PARAMS)
