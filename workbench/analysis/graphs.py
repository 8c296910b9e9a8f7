"""Attribute CUDA-graph-replayed kernels by their position in the graph.

Replayed kernels lose the scopes they were captured under, so the category of each position
is learnt from an eager run of the same step (its *signature*) and applied to each replay by
aligning the two kernel-name sequences. Alignment rather than strict position equality,
because a replay legitimately differs from its eager step in known ways, seen on the H200:
device-to-device copies become `memcpy32_post` kernels inside graphs, and work that only runs
eagerly (a host-side check that must not sync during capture) is absent. Kernels outside the
aligned runs keep the kernel-name rules, and a warning says how many were matched.
"""

from __future__ import annotations

import difflib
import functools
import re
import warnings

import pandas as pd

from workbench.analysis.rules import GRAPH_POSITION_RULE

GRAPH_POSITION = "graph-position"
SIGNATURE_COLUMNS = ["position", "name", "category", "layer", "source"]
# Names that differ between an eager launch and the same operation inside a graph.
EQUIVALENT_NAMES = (
    (re.compile(r"^Memcpy DtoD|^memcpy\d*_post$"), "copy device to device"),
    (re.compile(r"^Memset|^memset\d*_post$"), "memset"),
)


@functools.lru_cache(maxsize=4096)
def comparable(name: str) -> str:
    """The name used for alignment: equivalent eager and graph names map to one. Cached: a
    run replays the same few hundred names ~10^5 times."""
    return next((same for pattern, same in EQUIVALENT_NAMES if pattern.search(name)), name)


def align(signature_names: tuple[str, ...], replay_names: tuple[str, ...]) -> list[tuple[int, int]]:
    """(replay index, signature position) pairs of the runs where the names agree."""
    matcher = difflib.SequenceMatcher(a=signature_names, b=replay_names, autojunk=False)
    return [(b + k, a + k) for a, b, size in matcher.get_matching_blocks() for k in range(size)]


def signature_of(step_kernels: pd.DataFrame) -> pd.DataFrame:
    """The kernel sequence of one eager step, in launch order, with what each position is."""
    rows = step_kernels.sort_values("start_us", kind="stable").reset_index(drop=True)
    rows["position"] = range(len(rows))
    return rows[SIGNATURE_COLUMNS]


def attribute_graph_replays(
    kernels: pd.DataFrame, signature: pd.DataFrame
) -> tuple[pd.DataFrame, dict]:
    """Label each replay's kernels by position where names match the signature.

    Returns the kernel table (category, layer, source and rule updated on matched rows) and a
    summary: graph kernels, how many matched by position, replays seen, replays fully matched.
    """
    kernels = kernels.copy()
    graph = kernels[kernels["graph"]]
    names = tuple(comparable(n) for n in signature["name"])
    alignments: dict[tuple[str, ...], list[tuple[int, int]]] = {}  # replays repeat: align once
    rows: list[object] = []  # the matched rows' labels, of every replay
    positions: list[int] = []  # the signature position of each
    matched = full = 0
    # Sorted once: grouping keeps that order within each replay.
    in_order = graph.sort_values("start_us", kind="stable")
    for _, replay in in_order.groupby("correlation", sort=False):
        replay_names = tuple(map(comparable, replay["name"].tolist()))
        if replay_names not in alignments:
            alignments[replay_names] = align(names, replay_names)
        pairs = alignments[replay_names]
        rows.extend(replay.index[[i for i, _ in pairs]])
        positions.extend(p for _, p in pairs)
        matched += len(pairs)
        full += len(pairs) == len(replay)
    # Written once for all replays: a `.loc` write per replay and column dominated the time.
    by_position = signature.iloc[positions]
    for col in ("category", "layer"):
        kernels.loc[rows, col] = by_position[col].to_numpy()
    kernels.loc[rows, "source"] = GRAPH_POSITION
    kernels.loc[rows, "rule"] = GRAPH_POSITION_RULE
    replays = int(graph["correlation"].nunique())
    summary = {
        "graph_kernels": len(graph),
        "matched_by_position": matched,
        "replays": replays,
        "replays_fully_matched": full,
        "signature_kernels": len(names),
    }
    if matched < len(graph):
        warnings.warn(
            f"{matched} of {len(graph)} graph-replayed kernels matched the eager step's "
            f"signature by position ({full} of {replays} replays in full); the other "
            f"{len(graph) - matched} are attributed by kernel-name rules.",
            stacklevel=2,
        )
    return kernels, summary
