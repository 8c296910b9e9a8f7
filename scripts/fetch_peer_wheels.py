"""Download the peers' wheels into .whl/ (ignored by git) for a GPU box without a registry.

The GPU box cannot reach a package index, so the peers travel as wheels beside the working
tree (the device tool's `carry`, 64 MiB a call) and are installed there with
`python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl`
(plans/peers-dense.toml). Wheels are fetched for the box, not for this machine: CPython 3.12,
manylinux_2_28 x86-64, binary only, no dependencies resolved.

WHEELS lists what the box lacks. humming-kernels' own requirements (torch, triton, numpy,
safetensors, jinja2, cuda-bindings, tqdm, tabulate) are in the box's image; tabulate was read
there on 2026-11-17 but not in an older list, so it is fetched too, as a guard: a pure-Python
wheel of 40 kB that shadows the image's copy only under PYTHONPATH=/tmp/site.

    python3 scripts/fetch_peer_wheels.py            # into .whl/
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ("humming-kernels==0.1.19", "tabulate==0.10.0")
BOX = ("--python-version", "3.12", "--implementation", "cp",
       "--platform", "manylinux_2_28_x86_64")  # fmt: skip
CARRY_LIMIT = 64 * 2**20  # what one device call carries, the working tree included


def fetch(dest: Path = ROOT / ".whl") -> list[Path]:
    """Download WHEELS into `dest` and return the wheel files there."""
    dest.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               *BOX, "-d", str(dest), *WHEELS]  # fmt: skip
    subprocess.run(command, check=True)
    return sorted(dest.glob("*.whl"))


def main() -> int:
    wheels = fetch()
    total = sum(w.stat().st_size for w in wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**10:9.0f} KiB  {wheel.relative_to(ROOT)}")
    print(f"{total / 2**20:.1f} MiB in .whl/; carry it with the device call (carry=['.whl']).")
    if total > CARRY_LIMIT:
        print("over the 64 MiB a device call carries: stage the wheels across calls.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
