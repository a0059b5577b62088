"""Orbax checkpoints of a run: device state (parameters, optimizer states) plus host state as JSON.

Host state is everything the controller, schedules, RNG and metrics history hold between steps. It is
plain data, written next to the arrays in the same orbax step so a resumed run continues exactly.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves every `every` steps (and on demand), keeps the newest `keep`, restores the latest."""

  def __init__(self, directory: str, *, keep: int = 2):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=('state', 'host'))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, host: dict) -> None:
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     host=ocp.args.JsonSave(host)), force=True)
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[int, Any, dict]:
    """Restores into the shapes, dtypes and shardings of `abstract_state` (arrays or ShapeDtypeStructs)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f'no checkpoint in {self.directory}')
    target = jax.tree.map(_as_abstract, abstract_state)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), host=ocp.args.JsonRestore()))
    return step, restored['state'], restored['host']

  def close(self) -> None:
    self._manager.close()


def _as_abstract(x):
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, 'sharding', None))
