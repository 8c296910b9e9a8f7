"""How the command line's values are read: kernel settings, profile settings, sweep values."""

from __future__ import annotations

import argparse

from workbench.errors import WorkbenchError
from workbench.workloads.profile_params import parse_setting

LITERALS = {"true": True, "false": False, "none": None}  # kernel switches such as wgmma
CODE = "code"  # an A/B arm's kernels package (workbench.capture.code_versions)


def kernel_setting(text: str) -> tuple[str, object]:
    """A kernel setting `key=value`; the value an int where it reads as one, True, False or
    None where it spells one (any case), else the text; an A/B arm's `code=` (a git revision,
    which may read as a number) always the text."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--param {text!r}: write it as key=value")
    return key, value if key == CODE else sweep_value(value)


def profile_setting(text: str) -> tuple[str, object]:
    """A profile setting `name=value`, read by the one parameter table."""
    try:
        return parse_setting(text)
    except WorkbenchError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def sweep_value(text: str) -> object:
    """A kernel value: an int where it reads as one, True, False or None where it spells one
    (any case), else the text."""
    if text.lower() in LITERALS:
        return LITERALS[text.lower()]
    try:
        return int(text)
    except ValueError:
        return text


def profile_ab_setting(text: str) -> tuple[str, object]:
    """A profile A/B setting: a profile parameter, `decode_tokens=N` (each arm's decode
    steps, its samples of the decode phase), which is profile()'s own argument, or the arm's
    `code=` (as `kernel_setting` reads it)."""
    name, _, value = text.partition("=")
    if name.strip() == CODE:  # the arm's kernels package (kernel_setting)
        return CODE, value
    if name.strip().replace("-", "_") == "decode_tokens":
        try:
            return "decode_tokens", int(value)
        except ValueError:
            raise WorkbenchError(f"setting {text!r}: decode_tokens is a whole number") from None
    return parse_setting(text)
