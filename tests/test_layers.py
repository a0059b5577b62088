"""Dependencies point one way (DESIGN.md, Layout): a module imports only from its own layer or the
layers below. The imports are read with `ast` (function-level imports included), nothing is run."""

from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS = (
    ('kernels', 'ac2_jax.models', 'ac2_jax.sharding', 'ac2_jax.tokenization',
     'ac2_jax.device_reads'),
    ('ac2_jax.sampling', 'ac2_jax.rl', 'ac2_jax.critic', 'ac2_jax.controller', 'ac2_jax.tasks',
     'ac2_jax.judges'),
    ('ac2_jax.learner',),
    ('ac2_jax.algorithms',),
    ('ac2_jax.train', 'ac2_jax.bench'),
    ('launch',),
)
SOURCES = ('ac2_jax', 'kernels', 'launch')
JAX_PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax')


def layer_of(module: str) -> int | None:
  best, layer = '', None
  for i, prefixes in enumerate(LAYERS):
    for prefix in prefixes:
      if (module == prefix or module.startswith(prefix + '.')) and len(prefix) > len(best):
        best, layer = prefix, i
  return layer


def module_files(root: str) -> dict[str, str]:
  """Dotted module name -> path, for every .py file under the source folders of `root`."""
  out = {}
  for top in SOURCES:
    for folder, _, files in os.walk(os.path.join(root, top)):
      for name in files:
        if name.endswith('.py'):
          path = os.path.join(folder, name)
          parts = os.path.relpath(path, root)[:-3].split(os.sep)
          if parts[-1] == '__init__':
            parts = parts[:-1]
          out['.'.join(parts)] = path
  return out


def imports_of(path: str, known: set[str]) -> set[str]:
  """Modules a file imports; `from package import name` counts `package.name` when that is a
  module of the tree."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found.add(node.module)
      for alias in node.names:
        if f'{node.module}.{alias.name}' in known:
          found.add(f'{node.module}.{alias.name}')
  return found


def upward_imports(root: str) -> list[str]:
  files = module_files(root)
  problems = []
  for module, path in sorted(files.items()):
    own = layer_of(module)
    if own is None:
      continue
    for imported in sorted(imports_of(path, set(files))):
      theirs = layer_of(imported)
      if theirs is not None and theirs > own:
        problems.append(f'{module} (layer {own}) imports {imported} (layer {theirs})')
  return problems


def transitive_imports(root: str, start: str) -> set[str]:
  """Every module `start` (and the packages it lives in) reaches, external ones included."""
  files = module_files(root)
  seen, todo = set(), [start]
  while todo:
    module = todo.pop()
    if module in seen:
      continue
    seen.add(module)
    parts = module.split('.')
    # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
    todo += ['.'.join(parts[:i]) for i in range(1, len(parts)) if '.'.join(parts[:i]) in files]
    if module in files:
      todo += sorted(imports_of(files[module], set(files)))
  return seen


def test_no_module_imports_a_higher_layer():
  assert not upward_imports(REPO)


def test_every_source_module_has_a_layer():
  unplaced = [m for m in module_files(REPO) if layer_of(m) is None and m != 'ac2_jax']
  assert not unplaced


def test_a_planted_upward_import_is_caught(tmp_path):
  for package in ('ac2_jax', 'ac2_jax/controller', 'ac2_jax/train', 'ac2_jax/learner'):
    os.makedirs(tmp_path / package, exist_ok=True)
    (tmp_path / package / '__init__.py').write_text('')
  (tmp_path / 'ac2_jax/train/loop.py').write_text('from ac2_jax.learner import runtime\n')
  (tmp_path / 'ac2_jax/learner/runtime.py').write_text('import numpy\n')
  assert not upward_imports(str(tmp_path))
  (tmp_path / 'ac2_jax/learner/runtime.py').write_text(
      'def build():\n  from ac2_jax.train import loop\n')
  (tmp_path / 'ac2_jax/controller/planner.py').write_text('from ac2_jax import learner\n')
  problems = upward_imports(str(tmp_path))
  assert 'ac2_jax.controller.planner (layer 1) imports ac2_jax.learner (layer 2)' in problems
  assert 'ac2_jax.learner.runtime (layer 2) imports ac2_jax.train.loop (layer 4)' in problems
  assert not [p for p in problems if p.startswith('ac2_jax.train')]


def test_controller_imports_no_jax():
  reached = transitive_imports(REPO, 'ac2_jax.controller')
  assert 'ac2_jax.controller.planner' in reached
  assert not [m for m in reached if m.split('.')[0] in JAX_PACKAGES]
