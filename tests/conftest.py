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

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import cpu_experiments  # noqa: E402


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
