"""Which card an artifact ran on: two H200s can differ in a kernel's time by more than the
change under test, so comparisons across runs need to know whether the runs shared one."""

from __future__ import annotations

import re
from collections.abc import Mapping


def card(meta: Mapping) -> str | None:
    """The card an artifact ran on, as the first eight hex digits of its GPU's UUID (what
    `nvidia-smi -L` shows), or None where the artifact did not record one (runs before
    2026-12-04T18:30)."""
    uuid = str(((meta.get("environment") or {}).get("gpu") or {}).get("uuid") or "")
    found = re.fullmatch(r"GPU-([0-9a-f]{8})-[0-9a-f-]+", uuid.strip(), re.IGNORECASE)
    return found.group(1).lower() if found else None
