"""The notebooks run top to bottom on CPU (their cells assert equality with eager), issue 8."""

import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (the `test` extra installs it)")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (the `test` extra installs it)")

NOTEBOOKS = os.path.join(os.path.dirname(__file__), os.pardir, "notebooks")


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb")))
def test_notebook_runs(name):
    path = os.path.join(NOTEBOOKS, name)
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "store notebooks with outputs stripped"
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}})
    client.execute()  # raises CellExecutionError (with the cell and traceback) if a cell fails
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "Traceback" not in text
