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
import re
import shutil
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.errors import ArtifactError

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
ROWS_FILE = "rows.jsonl"  # experiments: one JSON row per finished configuration


# Long, repetitive text columns of large tables are stored as ids into one `strings.csv` per
# run: a GPU kernel table repeats a few hundred kernel names across ~10^6 rows, too far apart
# for gzip's 32 KB window to fold them, and the ids cut the file several times over.
DICTIONARY_COLUMNS = ("name", "op")
STRINGS_FILE = "strings.csv"
LARGE_ROWS = 2000  # tables longer than this are compressed and dictionary-coded
# xz's preset 1, not pandas' default 6: on a 33,863-token profile's kernel table (144K rows)
# preset 6 took 4.7 s of a 35 s profile on two cores for a file 20% smaller; preset 1, 0.34 s.
XZ = {"method": "xz", "preset": 1}

# Steadily growing numeric columns of large tables are stored as differences from the row
# above, `<col>@delta` (integers) or `<col>@delta/<scale>` (floats, as integer multiples of
# 1/scale, a power of two so that the division back is exact). Kernel start times are unique
# 15-17 digit floats, most of a kernel table's compressed size; their differences repeat from
# one decode step to the next, which xz folds. On the committed H200 profiles this and xz
# instead of gzip make kernel tables 40% of their gzipped size, every value bit-identical.
# A column that cannot be coded exactly (NaN, off any power-of-two grid) is stored as it is.
DELTA_COLUMNS = ("start_us", "correlation")
DELTA_MARK = re.compile(r"^(?P<col>.+)@delta(?:/(?P<scale>\d+))?$")
MAX_SCALE_BITS = 30  # finest grid tried: 2^-30 of the column's unit
EXACT_INTEGERS = 2**53  # float64 holds every integer below this


def _delta_scale(values: np.ndarray) -> int | None:
    """The smallest power of two `s` such that values * s are exact integers, or None."""
    if not np.isfinite(values).all() or np.signbit(values[values == 0]).any():
        return None  # NaN and infinities have no difference; -0.0 would come back as 0.0
    limit = np.abs(values).max(initial=0.0)
    for bits in range(MAX_SCALE_BITS + 1):
        scale = 1 << bits
        if limit * scale >= EXACT_INTEGERS:
            return None
        scaled = values * scale  # exact: a power-of-two product only shifts the exponent
        if (scaled == np.round(scaled)).all():
            return scale
    return None


def _delta_encode(table: pd.DataFrame) -> pd.DataFrame:
    """Replace DELTA_COLUMNS by their row-to-row differences where that is exact."""
    for col in DELTA_COLUMNS:
        if col not in table or not len(table):
            continue
        series = table[col]
        if pd.api.types.is_integer_dtype(series.dtype) and not series.isna().any():
            ticks, mark = series.to_numpy(dtype=np.int64), f"{col}@delta"
        elif series.dtype == np.float64:
            values = series.to_numpy()
            scale = _delta_scale(values)
            if scale is None:
                continue
            ticks, mark = np.round(values * scale).astype(np.int64), f"{col}@delta/{scale}"
        else:
            continue
        at = table.columns.get_loc(col)
        table = table.drop(columns=col)
        table.insert(at, mark, np.diff(ticks, prepend=np.int64(0)))
    return table


def _delta_decode(table: pd.DataFrame) -> pd.DataFrame:
    """Undo `_delta_encode`: cumulative sums, divided back by the scale for float columns."""
    for mark in [c for c in table.columns if isinstance(c, str) and DELTA_MARK.match(c)]:
        found = DELTA_MARK.match(mark)
        ticks = np.cumsum(table[mark].to_numpy(dtype=np.int64))
        scale = found["scale"]
        values = ticks if scale is None else ticks / np.float64(int(scale))
        at = table.columns.get_loc(mark)
        table = table.drop(columns=mark)
        table.insert(at, found["col"], values)
    return table


def _encode(tables: Mapping[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], pd.Series]:
    """Replace DICTIONARY_COLUMNS of large tables by `<col>_id`; return the tables and strings."""
    large = {n: t for n, t in tables.items() if len(t) > LARGE_ROWS}
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
        encoded[name] = _delta_encode(table)
    return encoded, strings


def _decode(table: pd.DataFrame, strings: pd.Series) -> pd.DataFrame:
    for col in DICTIONARY_COLUMNS:
        if f"{col}_id" in table:
            at = table.columns.get_loc(f"{col}_id")
            ids = pd.to_numeric(table.pop(f"{col}_id"))
            table.insert(at, col, ids.map(strings, na_action="ignore"))
    return table


def _table_file(name: str, table: pd.DataFrame, packed: bool = False) -> str:
    """Large tables, and those the writer was told to pack, are xz-compressed CSV; small ones
    stay plain CSV so `git diff` reads them.

    xz (at preset 1, `XZ`) rather than gzip: its 1 MiB window reaches back over whole
    decode steps, where gzip's 32 KB does not, and makes the committed kernel tables about 30%
    smaller than gzip on the same CSV (60% smaller with the delta columns). Runs written as
    `.csv.gz` before still read: the file name comes from run.json and pandas picks the
    decompressor by its extension.
    """
    return f"{name}.csv.xz" if packed or len(table) > LARGE_ROWS else f"{name}.csv"


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
    meta: Mapping | Callable[[], Mapping],
    tables: Mapping[str, pd.DataFrame],
    extra_files: Sequence[Path | None] = (),
    packed: Collection[str] = (),
) -> Path:
    """Write a complete run directory atomically and return its path.

    `extra_files` (e.g. a gzipped Chrome trace) are moved in with the tables. A callable
    `meta` is called once the tables are written, so run.json can say how long that took.
    Tables named in `packed` are xz-compressed whatever their length: raw readings (a bench's
    samples, the GPU's state) that nobody reads in a diff and whose 17-digit floats would
    otherwise take more room than the table they back.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    # Staged under a hidden name that records its owner, so a killed writer's leftovers are
    # found and removed by the next capture (`capture.debris`).
    tmp = Path(tempfile.mkdtemp(prefix=f".{run_id}.pid{os.getpid()}.", dir=root))
    try:
        files = {}
        tables, strings = _encode(tables)
        if len(strings):
            strings.to_csv(tmp / STRINGS_FILE, index_label="id")
        for name, table in tables.items():
            files[name] = _table_file(name, table, name in packed)
            table.to_csv(tmp / files[name], index=table.index.name is not None,
                         compression=XZ if files[name].endswith(".xz") else None)  # fmt: skip
        extras = [Path(f) for f in extra_files if f is not None]
        for extra in extras:
            shutil.move(extra, tmp / extra.name)
        document = {
            **(meta() if callable(meta) else meta),
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
        table = _delta_decode(pd.read_csv(path))
        if any(f"{col}_id" in table for col in DICTIONARY_COLUMNS):
            strings = pd.read_csv(Path(run_dir) / STRINGS_FILE, index_col="id")["text"]
            table = _decode(table, strings)
    except (OSError, EOFError, ValueError, KeyError, pd.errors.ParserError) as err:
        raise ArtifactError(f"{path} cannot be read ({err}); re-run the capture.") from None
    return table


def read_rows(run_dir: str | Path) -> list[dict]:
    """Rows of rows.jsonl; lines that do not parse (a write cut short by a kill) are skipped,
    so their configurations run again on resume."""
    path = Path(run_dir) / ROWS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "key" in row:
            rows.append(row)
    return rows


def check_output_dir(path: str | Path, what: str = "out") -> Path:
    """Refuse, before any work, an output folder that cannot be made or written: a capture that
    ends in a path error loses its measurement."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ArtifactError(f"{what}={path} is a file, not a folder; give a folder for the runs.")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ArtifactError(f"{what}={path}: cannot write in {existing}; give a writable folder.")
    return path


def check_output_file(path: str | Path, what: str = "html") -> Path:
    """Refuse, before any work, an output file that cannot be written (a folder, or a path
    under a file or a read-only folder)."""
    path = Path(path)
    if path.is_dir():
        raise ArtifactError(f"{what}={path} is a folder; give a file name, e.g. {path}/page.html.")
    check_output_dir(path.parent, f"the folder of {what}")
    if path.exists() and not os.access(path, os.W_OK):
        raise ArtifactError(f"{what}={path} exists and is read-only; give another file name.")
    return path


def run_kind(path: str | Path) -> str:
    """What a folder holds, in words: its run kind ("profile", "sweep", "ab", "bench-moe"...),
    or why it is not a run (for messages that skip it)."""
    try:
        return str(read_meta(path).get("kind"))
    except ArtifactError as err:
        return f"not a run ({err})"
