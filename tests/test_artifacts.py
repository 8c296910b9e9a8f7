"""Run directories: atomic writes, round trips, and clear errors for damaged ones."""

import json

import pandas as pd
import pytest

from workbench.artifacts import SCHEMA_VERSION, read_meta, read_table, write_run
from workbench.errors import ArtifactError


def _tables():
    kernels = pd.DataFrame({"name": [f"k{i}" for i in range(3000)], "dur_us": range(3000)})
    small = pd.DataFrame({"time_ms": [1.5, 2.5]}, index=pd.Index(["MoE", "Total"], name="category"))
    return {"kernels": kernels, "prefill": small}


def test_round_trip_keeps_tables_and_meta(tmp_path):
    path = write_run(tmp_path, "run-a", {"kind": "profile", "params": {"x": 1}}, _tables())
    meta = read_meta(path)
    assert meta["schema_version"] == SCHEMA_VERSION and meta["params"] == {"x": 1}
    assert meta["tables"] == {"kernels": "kernels.csv.gz", "prefill": "prefill.csv"}
    assert read_table(path, meta, "kernels").equals(_tables()["kernels"])
    assert read_table(path, meta, "prefill").set_index("category").equals(_tables()["prefill"])


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
    assert "a_long_kernel_name" not in pd.read_csv(path / "kernels.csv.gz").to_string()
    loaded = read_table(path, read_meta(path), "kernels")
    assert loaded["name"].tolist() == kernels["name"].tolist()


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


def test_the_commit_passed_by_a_capture_script_wins_over_a_stale_checkout(monkeypatch):
    from workbench.capture import environment

    monkeypatch.setenv("WORKBENCH_GIT_COMMIT", "d93424b68b89b0f5e2e045db633792259ffedcb3")
    assert environment._git() == {
        "commit": "d93424b68b89b0f5e2e045db633792259ffedcb3",
        "dirty": None,
        "source": "env",
    }
    monkeypatch.delenv("WORKBENCH_GIT_COMMIT")
    assert len(environment._git()["commit"]) == 40  # this checkout's own HEAD
