"""Executes each notebook top to bottom (nbclient, kernel python3): no error, at least one plot.

notebooks/critic_diagnostics.ipynb needs a run's workdir: tests/test_compare.py executes it on the
comparison's AC2 run (`execute_notebook` with WORKDIR set).
"""

import os

import nbformat
import pytest
from nbclient import NotebookClient

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Add notebooks here; each runs on CPU in under two minutes.
NOTEBOOKS = [
    'notebooks/advantage_estimators.ipynb',
]


def execute_notebook(path: str, parameters: dict | None = None):
  """Runs the notebook at `path` (from the repository root) and checks it; `parameters` are
  assigned in a cell put right after its cell tagged 'parameters' (as papermill does). Returns the
  executed notebook."""
  nb = nbformat.read(os.path.join(_ROOT, path), as_version=4)
  assert nb.metadata['kernelspec']['name'] == 'python3'
  if parameters:
    at = next(i for i, c in enumerate(nb.cells) if 'parameters' in c.metadata.get('tags', []))
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(
        '\n'.join(f'{name} = {value!r}' for name, value in parameters.items())))
  # A failing cell (including the notebook's own asserts) raises CellExecutionError here.
  NotebookClient(nb, timeout=240, kernel_name='python3',
                 resources={'metadata': {'path': _ROOT}}).execute()
  outputs = [o for cell in nb.cells if cell.cell_type == 'code' for o in cell.get('outputs', [])]
  assert not [o for o in outputs if o.get('output_type') == 'error']
  assert any('image/png' in o.get('data', {}) for o in outputs), f'{path} produced no plot'
  return nb


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS)
def test_notebook_runs(path):
  execute_notebook(path)
