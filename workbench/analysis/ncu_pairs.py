"""Which launch of a baseline report each launch of a report is compared with (NcuReport.diff).

Two captures rarely hold the same launches: flat's MoE call launches two offsets kernels and a
SiLU kernel where stock launches one offsets kernel, and its GEMMs are `_flat_gate_up_kernel`
where stock's are `_stock_gate_up_kernel`; their labels differ in the NVTX range too. Asking the
user to narrow both reports first does not work from the command line, so launches pair in
stages, each over the launches the earlier stages left:

1. the same label;
2. the same kernel (its name without either report's variant, so those GEMMs pair), the same
   token count (`T=<n>` in the NVTX range, else the capture's one token count) and the same
   position among such launches (the 2nd `_offsets_kernel` at T=6 pairs with the 2nd);
3. the same kernel and position whatever the token count (a 6-token report against a 4096-token
   one).

What pairs with nothing is listed, never guessed at. Pure Python over the launch tables: it
imports nothing of the report, so NcuReport can use it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

TOKENS = re.compile(r"T=(\d+)")


@dataclass(frozen=True)
class LaunchPairs:
    """The outcome of pairing: `pairs` maps a label of the report to one of the baseline, in the
    report's order; the launches of either side that pair with nothing are listed."""

    pairs: dict[str, str]
    only_here: list[str] = field(default_factory=list)
    only_baseline: list[str] = field(default_factory=list)

    def notes(self, here: str = "this report", baseline: str = "the baseline") -> list[str]:
        """Lines naming the launches left out of a diff, empty when every launch paired."""
        lines = []
        if self.only_here:
            lines.append(f"Only in {here} (not compared): {', '.join(self.only_here)}.")
        if self.only_baseline:
            lines.append(f"Only in {baseline} (not compared): {', '.join(self.only_baseline)}.")
        return lines


def _kernel_key(kernel: str, variants: set[str]) -> str:
    """A kernel's name without the variants' words and `kernel`: `_flat_gate_up_kernel` and
    `_stock_gate_up_kernel` are both `gate_up`; `_w8a8_kernel` of variant w8a8 is ``."""
    words = [w for w in kernel.strip("_").split("_") if w and w not in variants]
    return "_".join(w for w in words if w != "kernel")


def _tokens(nvtx: str, meta: dict) -> int | None:
    found = TOKENS.findall(nvtx)
    if found:
        return int(found[-1])
    tokens = meta.get("tokens") or []
    return int(tokens[0]) if len(tokens) == 1 else None


def _keyed(labels: Sequence[str], key: Callable[[str], tuple], taken: set[str]) -> dict[tuple, str]:
    """The labels not yet taken, by (key, position among the untaken labels of that key)."""
    seen: dict[tuple, int] = {}
    out = {}
    for label in labels:
        if label in taken:
            continue
        k = key(label)
        seen[k] = seen.get(k, 0) + 1
        out[(*k, seen[k])] = label
    return out


def pair_launches(
    here: pd.DataFrame, here_meta: dict, baseline: pd.DataFrame, baseline_meta: dict
) -> LaunchPairs:
    """Pair the launches of two reports (their `launches` tables: index = label, columns kernel
    and nvtx; and their capture metadata) in the stages the module docstring lists. A baseline of
    one launch pairs with every launch."""
    if len(baseline) == 1:
        return LaunchPairs({label: baseline.index[0] for label in here.index})
    variants = {m["variant"] for m in (here_meta, baseline_meta) if m.get("variant")}

    def keys(table: pd.DataFrame, meta: dict) -> dict[str, tuple]:
        return {
            label: (_kernel_key(row.kernel, variants), _tokens(row.nvtx, meta))
            for label, row in zip(table.index, table.itertuples(index=False))
        }

    mine, theirs = keys(here, here_meta), keys(baseline, baseline_meta)
    stages: list[tuple[Callable[[str], tuple], Callable[[str], tuple]]] = [
        (lambda label: (label,), lambda label: (label,)),
        (lambda label: mine[label], lambda label: theirs[label]),
        (lambda label: mine[label][:1], lambda label: theirs[label][:1]),
    ]
    pairs: dict[str, str] = {}
    for key_here, key_there in stages:
        left = _keyed(list(here.index), key_here, set(pairs))
        right = _keyed(list(baseline.index), key_there, set(pairs.values()))
        pairs.update({label: right[k] for k, label in left.items() if k in right})
    return LaunchPairs(
        {label: pairs[label] for label in here.index if label in pairs},
        [label for label in here.index if label not in pairs],
        [label for label in baseline.index if label not in set(pairs.values())],
    )
