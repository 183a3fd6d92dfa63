"""The notebooks in notebooks/: committed without outputs, and each runs top to bottom in a fresh kernel."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Each notebook runs in about 15 to 30 s on 2 CPU cores; a cell that takes longer than this has gone wrong.
CELL_TIMEOUT_S = 300


def test_the_four_stories_are_there():
    assert [p.stem for p in NOTEBOOKS] == ["01_method", "02_decoding", "03_training", "04_kernels"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path):
    """Outputs stay out of git (they would hold machine-specific numbers and figures, and bloat diffs)."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    dirty = [i for i, cell in enumerate(notebook.cells)
             if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_top_to_bottom(path):
    """Each notebook runs without edits in a fresh kernel; its own asserts check what it shows. A cell that raises
    fails the test (nbclient's CellExecutionError, with the cell and its traceback)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
