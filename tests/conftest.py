"""Shared pytest setup: Triton runs under its interpreter unless GPU tests are asked for.

TRITON_INTERPRET must be set before any @triton.jit function is defined, i.e. before a test
module imports kernels, so it is set here, first thing at import. An explicit switch decides
rather than torch.cuda.is_available(), so the choice is made before anything imports triton:
set WORKBENCH_GPU_TESTS=1 to compile the kernels for the GPU instead.
"""

import os

GPU_TESTS = os.environ.get("WORKBENCH_GPU_TESTS") == "1"
if not GPU_TESTS:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import ROOT, cpu_experiments  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device() -> torch.device:
    """Where kernel tests put their tensors: the GPU under WORKBENCH_GPU_TESTS=1, else the CPU."""
    return torch.device("cuda" if GPU_TESTS else "cpu")


@pytest.fixture(scope="session")
def experiments_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one real tiny sweep and one A/B run made on this machine (see
    helpers.cpu_experiments), shared by the notebook, widget and report tests."""
    return cpu_experiments(tmp_path_factory.mktemp("raw"))


@pytest.fixture(scope="session", autouse=True)
def committed_ncu_reports_load_once() -> Iterator[None]:
    """Each committed report under ncu/ is read by ncu_report once per test session.

    ncu_report never frees a loaded report: every load of the 134-launch decode-step report
    kept ~420 MB, and ~2.6 GB more once its hot spots were read, so the dozens of loads across
    the suite (every test of every real report, each `report` and `collect`) held over 10 GB
    by the end. Later loads of the same unchanged file get a new NcuReport (or NcuResult) over
    the first load's launches, hot lines included; the first load of each file, and every
    other file (the packed, cut and stand-in reports tests make), goes through the real path.
    """
    try:
        from workbench.analysis import ncu
        from workbench.analysis.ncu_files import read_sidecar
    except ImportError:  # no ncu_report here (the GPU machine): nothing to share
        yield
        return
    committed = (ROOT / "ncu").resolve()
    first: dict[tuple, ncu.NcuReport] = {}
    real_load = ncu.NcuReport.load.__func__

    def load(cls: type[ncu.NcuReport], path: str | Path) -> ncu.NcuReport:
        resolved = Path(path).resolve()
        if resolved.parent != committed or not resolved.is_file():
            return real_load(cls, path)
        stat = resolved.stat()
        key = (resolved, stat.st_mtime_ns, stat.st_size)
        if key not in first:
            first[key] = real_load(ncu.NcuReport, path)
        done = first[key]
        report = cls(Path(path), done._actions, read_sidecar(Path(path)), done._context,
                     done.launches.copy())  # fmt: skip
        report._hot = done._hot  # the same launches' hot lines: made once
        return report

    patch = pytest.MonkeyPatch()
    patch.setattr(ncu.NcuReport, "load", classmethod(load))
    yield
    patch.undo()
