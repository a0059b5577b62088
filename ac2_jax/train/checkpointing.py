"""Orbax checkpoints of a run: device state (parameters, optimizer states) plus host state as JSON.

Host state is everything the controller, schedules, RNG and metrics history hold between steps. It is
plain data, written next to the arrays in the same orbax step so a resumed run continues exactly.

Every saved step also gets a manifest (FILES_MANIFEST: each file's size and CRC32), so a checkpoint
damaged after it was written (a truncated or deleted file, a flipped bit, a cut host JSON) is found
before orbax reads it; `restore_newest_intact` reports such a checkpoint in one line, moves it to
`checkpoints_corrupt/` beside the checkpoint directory and falls back to the next older one.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

FILES_MANIFEST = 'ac2_files.json'
_CHUNK = 1 << 24


def _crc32(path: str) -> int:
  crc = 0
  with open(path, 'rb') as f:
    while block := f.read(_CHUNK):
      crc = zlib.crc32(block, crc)
  return crc


def _files(step_dir: str) -> dict[str, list[int]]:
  out = {}
  for root, _, names in os.walk(step_dir):
    for name in names:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, step_dir)
      if not rel.startswith(FILES_MANIFEST):
        out[rel] = [os.path.getsize(path), _crc32(path)]
  return out


def verify(step_dir: str) -> None:
  """Raises ValueError naming the first file of `step_dir` that is missing, resized or changed
  since it was saved (a step without a manifest, from an older version, is not checked)."""
  manifest = os.path.join(step_dir, FILES_MANIFEST)
  if not os.path.exists(manifest):
    return
  with open(manifest) as f:
    expected = json.load(f)
  for rel, (size, crc) in sorted(expected.items()):
    path = os.path.join(step_dir, rel)
    if not os.path.exists(path):
      raise ValueError(f'{rel} is missing')
    if os.path.getsize(path) != size:
      raise ValueError(f'{rel} has {os.path.getsize(path)} bytes, {size} were saved')
    if _crc32(path) != crc:
      raise ValueError(f'{rel} changed since it was saved (CRC32 mismatch)')


class Checkpointer:
  """Saves every `every` steps (and on demand), keeps the newest `keep`, restores the latest."""

  def __init__(self, directory: str, *, keep: int = 2):
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
      raise ValueError(f'checkpoints_kept must be an integer >= 1, got {keep!r}')
    self.directory = os.path.abspath(directory)
    self._keep = keep
    self._manager = self._open()

  def _open(self):
    options = ocp.CheckpointManagerOptions(max_to_keep=self._keep, create=True,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(self.directory, options=options, item_names=('state', 'host'))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def save(self, step: int, state: Any, host: dict) -> None:
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     host=ocp.args.JsonSave(host)), force=True)
    self._manager.wait_until_finished()
    if jax.process_index() == 0 and os.path.isdir(self.step_dir(step)):
      manifest = os.path.join(self.step_dir(step), FILES_MANIFEST)
      files = _files(self.step_dir(step))
      with open(manifest + '.tmp', 'w') as f:
        json.dump(files, f)
      os.replace(manifest + '.tmp', manifest)

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[int, Any, dict]:
    """Restores into the shapes, dtypes and shardings of `abstract_state` (arrays or ShapeDtypeStructs)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f'no checkpoint in {self.directory}')
    verify(self.step_dir(step))
    target = jax.tree.map(_as_abstract, abstract_state)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), host=ocp.args.JsonRestore()))
    if not isinstance(restored['host'], dict):
      raise ValueError(f'host state is {type(restored["host"]).__name__}, not a JSON object')
    return step, restored['state'], restored['host']

  def restore_newest_intact(self, abstract_state: Any, log: Callable[[str], Any] = print
                            ) -> tuple[int, Any, dict] | None:
    """The newest checkpoint that restores; None when there is none.

    Each one that fails is reported in one line with its path and moved aside (process 0), so the
    run saves that step again later. Raises RuntimeError when checkpoints exist but none restores.
    """
    steps = sorted(self._manager.all_steps(), reverse=True)
    failed = []
    for step in steps:
      try:
        result = self.restore(abstract_state, step)
      except Exception as e:  # noqa: BLE001 - any damage: orbax, tensorstore, JSON, our manifest
        reason = ' '.join(f'{type(e).__name__}: {e}'.split())[:300]
        log(f'checkpoint {self.step_dir(step)} does not restore ({reason})')
        failed.append(step)
        continue
      if failed:
        self._set_aside(failed)
        log(f'falling back to the newest intact checkpoint, step {step} ({self.step_dir(step)}); '
            f'moved the damaged one(s) to {self._aside_dir()}')
      return result
    if failed:
      raise RuntimeError(f'no checkpoint in {self.directory} restores (steps {failed}; see above); '
                         'move the directory away to start the run afresh')
    return None

  def _aside_dir(self) -> str:
    return self.directory.rstrip('/') + '_corrupt'

  def _set_aside(self, steps: list[int]) -> None:
    if jax.process_index() == 0:
      os.makedirs(self._aside_dir(), exist_ok=True)
      for step in steps:
        target = os.path.join(self._aside_dir(), str(step))
        if os.path.exists(target):
          shutil.rmtree(target)
        shutil.move(self.step_dir(step), target)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices('ac2_jax checkpoints set aside')
    self._manager.close()
    self._manager = self._open()

  def close(self) -> None:
    self._manager.close()


def _as_abstract(x):
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, 'sharding', None))
