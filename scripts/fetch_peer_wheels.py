"""Download the peers' wheels into .whl/ (ignored by git) for a GPU box without a registry.

The GPU box cannot reach a package index, so the peers travel as wheels beside the working
tree (the device tool's `carry`, 64 MiB a call) and are installed there with
`python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl`
(plans/peers.toml). Wheels are fetched for the box, not for this machine: CPython 3.12,
manylinux_2_28 (or 2_25) x86-64, binary only, no dependencies resolved.

DeepGEMM has no wheel of its own: it ships inside vLLM's (336 MB, VLLM below), under
vllm/third_party/deep_gemm with its compiled extension on torch's stable ABI. The wheel is
downloaded into a temporary folder and only that package is kept, as .whl/deep_gemm.tgz (about
10 MB), which the peer plans unpack into /tmp/site on the box.

WHEELS lists what the box lacks. humming-kernels' own requirements (torch, triton, numpy,
safetensors, jinja2, cuda-bindings, tqdm, tabulate) are in the box's image; tabulate was read
there on 2026-11-17 but not in an older list, so it is fetched too, as a guard: a pure-Python
wheel of 40 kB that shadows the image's copy only under PYTHONPATH=/tmp/site.

    python3 scripts/fetch_peer_wheels.py            # into .whl/
    python3 scripts/fetch_peer_wheels.py --ncu      # NCU_REPORT into .whl-ncu/

The box's image has no `ncu_report` (NVIDIA's reader of .ncu-rep files, which `workbench ncu`
loads to write a report's summary), and Nsight Compute's own copy under extras/python
crashed there (a segfault on 2026-11-30). Its wheel is 17 MB: beside the tracked tree and
.whl/ it would pass the 64 MiB a call carries, so it has its own folder, carried by the calls
that capture with ncu (plans/attention.toml's ncu steps).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ("humming-kernels==0.1.19", "tabulate==0.10.0")
BOX = ("--python-version", "3.12", "--implementation", "cp",
       "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_25_x86_64")  # fmt: skip
CARRY_LIMIT = 64 * 2**20  # what one device call carries, the working tree included
VLLM = "vllm==0.33.0"
NCU_REPORT = "ncu-report==2026.3.1"
DEEP_GEMM = "vllm/third_party/deep_gemm/"


def _download(dest: Path, *wheels: str) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               *BOX, "-d", str(dest), *wheels]  # fmt: skip
    subprocess.run(command, check=True)


def fetch_deep_gemm(dest: Path) -> Path:
    """Cut vLLM's bundled DeepGEMM package out of its wheel into dest/deep_gemm.tgz."""
    target = dest / "deep_gemm.tgz"
    with tempfile.TemporaryDirectory() as tmp:
        _download(Path(tmp), VLLM)
        (wheel,) = Path(tmp).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as z, tarfile.open(target, "w:gz") as tgz:
            for name in z.namelist():
                if name.startswith(DEEP_GEMM) and not name.endswith("/"):
                    info = tarfile.TarInfo("deep_gemm/" + name.removeprefix(DEEP_GEMM))
                    info.size, info.mode = z.getinfo(name).file_size, 0o644
                    with z.open(name) as member:
                        tgz.addfile(info, member)
    return target


def fetch(dest: Path = ROOT / ".whl") -> list[Path]:
    """Download WHEELS and DeepGEMM into `dest` and return the files there."""
    dest.mkdir(exist_ok=True)
    _download(dest, *WHEELS)
    if not (dest / "deep_gemm.tgz").exists():
        fetch_deep_gemm(dest)
    return sorted([*dest.glob("*.whl"), dest / "deep_gemm.tgz"])


def main() -> int:
    if sys.argv[1:] == ["--ncu"]:
        _download(ROOT / ".whl-ncu", NCU_REPORT)
        print("ncu_report in .whl-ncu/; carry it with the ncu call (carry=['.whl-ncu']).")
        return 0
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
