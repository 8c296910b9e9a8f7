"""Run directories: atomic writes, round trips, and clear errors for damaged ones."""

import json

import numpy as np
import pandas as pd
import pytest
from helpers import committed_artifacts

from workbench.artifacts import (
    RUN_FILE,
    SCHEMA_VERSION,
    STRINGS_FILE,
    read_meta,
    read_table,
    write_json_atomic,
    write_run,
)
from workbench.errors import ArtifactError


def _tables():
    kernels = pd.DataFrame({"name": [f"k{i}" for i in range(3000)], "dur_us": range(3000)})
    small = pd.DataFrame({"time_ms": [1.5, 2.5]}, index=pd.Index(["MoE", "Total"], name="category"))
    return {"kernels": kernels, "prefill": small}


def test_round_trip_keeps_tables_and_meta(tmp_path):
    path = write_run(tmp_path, "run-a", {"kind": "profile", "params": {"x": 1}}, _tables())
    meta = read_meta(path)
    assert meta["schema_version"] == SCHEMA_VERSION and meta["params"] == {"x": 1}
    assert meta["tables"] == {"kernels": "kernels.csv.xz", "prefill": "prefill.csv"}
    assert read_table(path, meta, "kernels").equals(_tables()["kernels"])
    assert read_table(path, meta, "prefill").set_index("category").equals(_tables()["prefill"])
    packed = write_run(tmp_path, "run-b", {"kind": "bench-moe"}, _tables(), packed=("prefill",))
    packed_meta = read_meta(packed)
    assert packed_meta["tables"]["prefill"] == "prefill.csv.xz"  # short, yet compressed
    assert (
        read_table(packed, packed_meta, "prefill")
        .set_index("category")
        .equals(_tables()["prefill"])
    )


def test_long_text_columns_are_stored_once_as_strings(tmp_path):
    kernels = pd.DataFrame(
        {"name": ["a_long_kernel_name", "b", None] * 1000, "dur_us": range(3000)}
    )
    path = write_run(tmp_path, "run", {"kind": "profile"}, {"kernels": kernels})
    assert (path / "strings.csv").read_text().splitlines() == [
        "id,text",
        "0,a_long_kernel_name",
        "1,b",
    ]
    assert "a_long_kernel_name" not in pd.read_csv(path / "kernels.csv.xz").to_string()
    loaded = read_table(path, read_meta(path), "kernels")
    assert loaded["name"].tolist() == kernels["name"].tolist()


def _kernel_table(rows: int = 5000) -> pd.DataFrame:
    """Like a profile's: start times on a 1/1024 us grid, as torch's traces give them."""
    rng = np.random.default_rng(0)
    start = np.cumsum(rng.integers(0, 400_000, rows)) / 1024 + 3.6e5
    return pd.DataFrame(
        {
            "name": [f"k{i % 7}" for i in range(rows)],
            "start_us": start,
            "dur_us": np.round(rng.uniform(0.5, 90, rows), 3),
            "correlation": np.cumsum(rng.integers(1, 20, rows)) + 82012,
        }
    )


def _identical(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Same columns, dtypes and bits (DataFrame.equals would let -0.0 pass for 0.0)."""
    return list(a.columns) == list(b.columns) and all(
        a[c].dtype == b[c].dtype
        and (
            np.array_equal(a[c].to_numpy().view(np.int64), b[c].to_numpy().view(np.int64))
            if a[c].dtype == np.float64
            else a[c].equals(b[c])
        )
        for c in a.columns
    )


def test_growing_columns_are_stored_as_exact_differences(tmp_path):
    kernels = _kernel_table()
    path = write_run(tmp_path, "run", {"kind": "profile"}, {"kernels": kernels})
    stored = pd.read_csv(path / "kernels.csv.xz")
    assert list(stored.columns) == ["name_id", "start_us@delta/1024", "dur_us", "correlation@delta"]
    assert _identical(read_table(path, read_meta(path), "kernels"), kernels)


@pytest.mark.parametrize(
    "start",
    [
        np.arange(3000) * 0.1,
        np.r_[np.nan, np.arange(2999) / 4.0],
        np.r_[-0.0, np.arange(1, 3000.0)],
    ],
    ids=["off-grid", "nan", "negative-zero"],
)
def test_columns_without_an_exact_difference_are_stored_as_they_are(tmp_path, start):
    kernels = pd.DataFrame({"start_us": start, "correlation": range(3000)})
    path = write_run(tmp_path, "run", {"kind": "profile"}, {"kernels": kernels})
    assert list(pd.read_csv(path / "kernels.csv.xz").columns) == ["start_us", "correlation@delta"]
    assert _identical(read_table(path, read_meta(path), "kernels"), kernels)


def test_runs_written_as_gzipped_csv_still_read(tmp_path):
    """The form of runs committed before xz: plain values, gzipped, names in strings.csv."""
    kernels = _kernel_table()
    path = tmp_path / "old-run"
    path.mkdir()
    pd.Series(["k0", "k1", "k2", "k3", "k4", "k5", "k6"], name="text").to_csv(
        path / STRINGS_FILE, index_label="id"
    )
    coded = kernels.assign(name=kernels["name"].str[1:].astype(int)).rename(
        columns={"name": "name_id"}
    )
    coded.to_csv(path / "kernels.csv.gz", index=False)
    document = {"kind": "profile", "schema_version": 1, "tables": {"kernels": "kernels.csv.gz"}}
    write_json_atomic(path / RUN_FILE, document)
    assert _identical(read_table(path, read_meta(path), "kernels"), kernels)


def test_runs_are_never_overwritten(tmp_path):
    first = write_run(tmp_path, "run", {"kind": "profile"}, _tables())
    second = write_run(tmp_path, "run", {"kind": "profile"}, _tables())
    assert first.name == "run" and second.name == "run-2"


def test_a_failed_write_leaves_nothing_behind(tmp_path):
    class Exploding(pd.DataFrame):
        def to_csv(self, *args, **kwargs):
            raise KeyboardInterrupt  # an interrupted capture

    earlier = write_run(tmp_path, "earlier", {"kind": "profile"}, _tables())
    with pytest.raises(KeyboardInterrupt):
        write_run(tmp_path, "broken", {"kind": "profile"}, {"kernels": Exploding({"a": [1]})})
    assert sorted(p.name for p in tmp_path.iterdir()) == [earlier.name]
    assert read_meta(earlier)["run_id"] == "earlier"


def _damage(path, text):
    (path / "run.json").write_text(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"kind": "profile"}), "no schema_version"),
        (json.dumps({"schema_version": SCHEMA_VERSION + 1}), "newer than this workbench reads"),
    ],
)
def test_damaged_run_json(tmp_path, text, message):
    path = write_run(tmp_path, "run", {"kind": "profile"}, _tables())
    _damage(path, text)
    with pytest.raises(ArtifactError, match=message):
        read_meta(path)


def test_missing_run_json_and_missing_tables(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(ArtifactError, match="has no run.json"):
        read_meta(tmp_path / "half")
    with pytest.raises(ArtifactError, match="not a run directory"):
        read_meta(tmp_path / "absent")
    path = write_run(tmp_path, "run", {"kind": "profile"}, _tables())
    meta = read_meta(path)
    with pytest.raises(ArtifactError, match="no 'decode' table"):
        read_table(path, meta, "decode")
    (path / "prefill.csv").unlink()
    with pytest.raises(ArtifactError, match="listed in run.json but missing"):
        read_table(path, meta, "prefill")


def test_committed_artifacts_stay_under_40_mb():
    """The GPU machine takes a working tree of at most 64 MiB; raw/ and ncu/ keep 40 MB of it
    so code, fixtures and a capture's output fit beside them. Supersede old runs, or store
    their tables more compactly, rather than raise this. (A profile writes its kernel table
    at xz preset 1, for speed; committed ones were recompressed at preset 6, the same bytes
    20-25% smaller: `xz -dc F > T && xz -6 -c T > F`.)"""
    tops = committed_artifacts()
    files = [f for top in tops for f in ([top] if top.is_file() else top.rglob("*"))]
    files = [f for f in files if f.is_file()]
    size = sum(f.stat().st_size for f in files)
    assert size < 40e6, f"raw/ and ncu/ hold {size / 1e6:.1f} MB"
