"""Every notebook in notebooks/ runs top to bottom without a cell error, in a
fresh python3 kernel started in notebooks/ (as a user would open it).
Notebooks named capture_* need PyTorch and are skipped without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_runs(path):
    if path.name.startswith("capture_") and importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert any(c.cell_type == "code" and c.get("outputs") for c in nb.cells)
