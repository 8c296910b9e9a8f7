"""What a killed capture leaves behind, found and removed by the next one.

A profile keeps its Chrome trace (megabytes) in a temporary folder and stages its run folder
as a hidden `.<run-id>.*` folder beside the runs; a normal end, an exception or SIGTERM removes
both, but SIGKILL (the OOM killer, a lost session) cannot. Both names carry the owner's
process id, so the next capture removes exactly those whose owner is gone, and says so.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

TEMP_PREFIX = "workbench-capture-"
OWNER = re.compile(r"\.pid(\d+)\.")  # `<name>.pid<pid>.<random>` names an owner process


def owned_prefix(name: str) -> str:
    """A temporary name prefix that records this process as the owner."""
    return f"{name}.pid{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def remove_leftovers(*folders: Path) -> list[str]:
    """Remove the temporary and staging folders of dead captures in `folders` (and the system's
    temporary folder); a line per removal, for the user to read."""
    said = []
    for folder in (Path(tempfile.gettempdir()), *folders):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            owner = OWNER.search(path.name)
            if not path.is_dir() or owner is None or _alive(int(owner.group(1))):
                continue
            if not (path.name.startswith(TEMP_PREFIX) or path.name.startswith(".")):
                continue
            size = _size(path)
            shutil.rmtree(path, ignore_errors=True)
            said.append(f"removed {path} ({size / 2**20:.1f} MB), left by a killed capture")
    return said
