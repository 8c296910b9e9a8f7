"""Ours against the best peer: the fastest timed row of each side per size, from one run."""

import pandas as pd

from workbench.analysis.best_peer import ours_vs_best_peer


def test_each_size_pairs_the_fastest_timed_row_of_each_side():
    rows = pd.DataFrame(
        {
            "m": [1, 1, 1, 1, 8, 8, 16],
            "name": ["w8a16", "w8a8", "humming", "deepgemm", "w8a16", "humming", "w8a16"],
            "ms": [0.2, 0.1, 0.3, 0.05, 0.4, None, 0.5],
            "status": ["ok", "ok", "ok", "wrong", "spills", "missing-peer", "ok"],
        }
    )
    ours = rows["name"].str.startswith("w8")
    best = ours_vs_best_peer(rows, ["m"], ours)
    # M=1: deepgemm was faster but wrong, so humming is the peer; M=8 and 16 have no timed peer
    assert list(best.index.get_level_values("m")) == [1]
    assert best.iloc[0].tolist() == ["w8a8", 0.1, "humming", 0.3, 0.3 / 0.1]


def test_no_pair_gives_an_empty_table():
    rows = pd.DataFrame({"m": [1], "name": ["w8a16"], "ms": [0.2], "status": ["ok"]})
    assert ours_vs_best_peer(rows, ["m"], rows["name"] == "w8a16").empty
