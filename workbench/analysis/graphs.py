"""Attribute CUDA-graph-replayed kernels by their position in the graph.

Replayed kernels lose the scopes they were captured under, so the category of each position
is learnt from an eager run of the same step (its *signature*) and applied to every replay
whose kernel names match it position by position. Positions that do not match keep the
kernel-name rules, and a warning says how many kernels were matched.
"""

from __future__ import annotations

import warnings

import pandas as pd

GRAPH_POSITION = "graph-position"
SIGNATURE_COLUMNS = ["position", "name", "category", "layer", "source"]


def signature_of(step_kernels: pd.DataFrame) -> pd.DataFrame:
    """The kernel sequence of one eager step, in launch order, with what each position is."""
    rows = step_kernels.sort_values("start_us", kind="stable").reset_index(drop=True)
    rows["position"] = range(len(rows))
    return rows[SIGNATURE_COLUMNS]


def attribute_graph_replays(
    kernels: pd.DataFrame, signature: pd.DataFrame
) -> tuple[pd.DataFrame, dict]:
    """Label each replay's kernels by position where names match the signature.

    Returns the kernel table (category, layer and source updated on matched rows) and a
    summary: graph kernels, how many matched by position, replays seen, replays fully matched.
    """
    kernels = kernels.copy()
    graph = kernels[kernels["graph"]]
    names = signature["name"].tolist()
    matched = full = 0
    for _, replay in graph.groupby("correlation", sort=False):
        replay = replay.sort_values("start_us", kind="stable")
        same = [i for i, name in enumerate(replay["name"]) if i < len(names) and name == names[i]]
        rows, positions = replay.index[same], signature.iloc[same]
        for col in ("category", "layer"):
            kernels.loc[rows, col] = positions[col].to_numpy()
        kernels.loc[rows, "source"] = GRAPH_POSITION
        matched += len(same)
        full += len(same) == len(replay) == len(names)
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
