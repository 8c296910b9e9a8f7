"""Notebooks run headless (nbclient) from the committed artifacts, with no error output."""

from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU the notebooks profile live, minutes per run"
)
@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_runs_without_errors(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Showing 2 runs from the committed H200 artifacts" in text
    assert "425856 of 425856 replayed kernels attributed by position" in text
