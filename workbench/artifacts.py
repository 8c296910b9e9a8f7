"""On-disk formats: `raw/<run-id>/` holds `run.json` and compact, diffable tables.

Writes are atomic: a run directory is assembled under a hidden temporary name beside its
final place and renamed into place only when complete, so a crashed or interrupted capture
never leaves half a run nor damages an earlier one. Reading checks the schema version and
says what is wrong with a bad directory. Pure Python and pandas: no torch.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from workbench.errors import ArtifactError

SCHEMA_VERSION = 1
RUN_FILE = "run.json"


# Long, repetitive text columns of large tables are stored as ids into one `strings.csv` per
# run: a GPU kernel table repeats a few hundred kernel names across ~10^6 rows, too far apart
# for gzip's 32 KB window to fold them, and the ids cut the file several times over.
DICTIONARY_COLUMNS = ("name", "op")
STRINGS_FILE = "strings.csv"


def _encode(tables: Mapping[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], pd.Series]:
    """Replace DICTIONARY_COLUMNS of large tables by `<col>_id`; return the tables and strings."""
    large = {n: t for n, t in tables.items() if len(t) > 2000}
    texts = pd.unique(
        pd.concat(
            [
                t[c].dropna().astype(str)
                for t in large.values()
                for c in DICTIONARY_COLUMNS
                if c in t
            ]
            or [pd.Series([], dtype=str)]
        )
    )
    strings = pd.Series(texts, name="text")
    ids = {text: i for i, text in enumerate(texts)}
    encoded = dict(tables)
    for name, table in large.items():
        table = table.copy()
        for col in DICTIONARY_COLUMNS:
            if col in table:
                table[col] = table[col].map(ids, na_action="ignore").astype("Int64")
                table = table.rename(columns={col: f"{col}_id"})
        encoded[name] = table
    return encoded, strings


def _decode(table: pd.DataFrame, strings: pd.Series) -> pd.DataFrame:
    for col in DICTIONARY_COLUMNS:
        if f"{col}_id" in table:
            at = table.columns.get_loc(f"{col}_id")
            ids = pd.to_numeric(table.pop(f"{col}_id"))
            table.insert(at, col, ids.map(strings, na_action="ignore"))
    return table


def _table_file(name: str, table: pd.DataFrame) -> str:
    """Large tables are gzipped CSV; small ones stay plain CSV so `git diff` reads them."""
    return f"{name}.csv.gz" if len(table) > 2000 else f"{name}.csv"


def write_json_atomic(path: Path, document: Mapping) -> None:
    """Write JSON through a temporary file in the same directory, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are for sharing
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_stamp() -> str:
    """The local time as run ids end with it, e.g. `20261129T153138`: sortable, no separators."""
    return dt.datetime.now().strftime("%Y%m%dT%H%M%S")


def unique_run_dir(root: Path, run_id: str) -> Path:
    """`root/run_id`, or `root/run_id-2`, `-3`... if taken: runs are never overwritten."""
    candidate, n = root / run_id, 1
    while candidate.exists():
        n += 1
        candidate = root / f"{run_id}-{n}"
    return candidate


def write_run(
    root: str | Path,
    run_id: str,
    meta: Mapping,
    tables: Mapping[str, pd.DataFrame],
    extra_files: Sequence[Path | None] = (),
) -> Path:
    """Write a complete run directory atomically and return its path.

    `extra_files` (e.g. a gzipped Chrome trace) are moved in with the tables.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{run_id}.", dir=root))
    try:
        files = {}
        tables, strings = _encode(tables)
        if len(strings):
            strings.to_csv(tmp / STRINGS_FILE, index_label="id")
        for name, table in tables.items():
            files[name] = _table_file(name, table)
            table.to_csv(tmp / files[name], index=table.index.name is not None)
        extras = [Path(f) for f in extra_files if f is not None]
        for extra in extras:
            shutil.move(extra, tmp / extra.name)
        document = {
            **meta,
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "tables": files,
            "files": sorted(e.name for e in extras),
        }
        write_json_atomic(tmp / RUN_FILE, document)
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700
        final = unique_run_dir(root, run_id)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_meta(run_dir: str | Path) -> dict:
    """`run.json` of a run directory, checked."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ArtifactError(f"{run_dir} is not a run directory; give a folder under raw/.")
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise ArtifactError(
            f"{run_dir} has no {RUN_FILE}: it is not a workbench run, or its capture did not "
            "finish. Re-run the capture."
        )
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path} is not valid JSON ({err}); re-run the capture.") from None
    version = meta.get("schema_version") if isinstance(meta, dict) else None
    if not isinstance(version, int):
        raise ArtifactError(f"{path} has no schema_version; it was not written by the workbench.")
    if version > SCHEMA_VERSION:
        raise ArtifactError(
            f"{path} has schema version {version}, newer than this workbench reads "
            f"({SCHEMA_VERSION}); upgrade the workbench (git pull; pip install -e .)."
        )
    return meta


def read_table(run_dir: str | Path, meta: Mapping, name: str) -> pd.DataFrame:
    """One table of a run directory, as written by `write_run`."""
    files = meta.get("tables", {})
    if name not in files:
        raise ArtifactError(
            f"{run_dir} has no '{name}' table; it holds: {', '.join(files) or 'none'}."
        )
    path = Path(run_dir) / files[name]
    if not path.is_file():
        raise ArtifactError(f"{path} is listed in {RUN_FILE} but missing; re-run the capture.")
    try:
        table = pd.read_csv(path)
        if any(f"{col}_id" in table for col in DICTIONARY_COLUMNS):
            strings = pd.read_csv(Path(run_dir) / STRINGS_FILE, index_col="id")["text"]
            table = _decode(table, strings)
    except (OSError, EOFError, ValueError, KeyError, pd.errors.ParserError) as err:
        raise ArtifactError(f"{path} cannot be read ({err}); re-run the capture.") from None
    return table
