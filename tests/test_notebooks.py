"""Executes each notebook top to bottom (nbclient, kernel python3): no error, at least one plot."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Add notebooks here; each runs on CPU in under two minutes.
NOTEBOOKS = [
    'notebooks/advantage_estimators.ipynb',
]


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS)
def test_notebook_runs(path):
  nb = nbformat.read(os.path.join(_ROOT, path), as_version=4)
  assert nb.metadata['kernelspec']['name'] == 'python3'
  # A failing cell (including the notebook's own asserts) raises CellExecutionError here.
  NotebookClient(nb, timeout=240, kernel_name='python3',
                 resources={'metadata': {'path': _ROOT}}).execute()
  outputs = [o for cell in nb.cells if cell.cell_type == 'code' for o in cell.get('outputs', [])]
  assert not [o for o in outputs if o.get('output_type') == 'error']
  assert any('image/png' in o.get('data', {}) for o in outputs), f'{path} produced no plot'
