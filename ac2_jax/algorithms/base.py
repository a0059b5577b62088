"""The algorithm protocol: what the host loop (train/loop.py) calls, and nothing else.

An algorithm is built by train/experiment.py from typed settings and the learner's `Runtime`; it
keeps its host state (buffers, schedules) itself and hands it to the checkpoint as JSON data.
`step` runs one training step: sample with `state.params`, score, update, and return the new state
with the step's metrics as host numbers (read from the device once, at the end of the step).
"""

from __future__ import annotations

from typing import Protocol

import jax

from ac2_jax import device_reads
from ac2_jax.learner.runtime import Runtime
from ac2_jax.learner.state import TrainState

Metrics = dict[str, float | int | None]


class Algorithm(Protocol):

  def step(self, rt: Runtime, state: TrainState, step: int,
           key: jax.Array) -> tuple[TrainState, Metrics]:
    """One training step; `key` is a pure function of (seed, step)."""
    ...

  def state_dict(self) -> dict:
    """The host state kept between steps, as JSON data (saved beside the parameters)."""
    ...

  def load_state_dict(self, data: dict) -> None:
    ...

  def audited_groups(self) -> list[dict] | None:
    """The last step's audited groups as JSON data (AC2: `ac2.audit_records`), which the loop
    appends to WORKDIR/audits.jsonl; None: the algorithm audits nothing (no file)."""
    return None

  def close(self) -> None:
    """Stops what the algorithm runs beside the loop (an in-flight rollout worker); the loop calls
    it once at the end of a run."""
    return None


def host_metrics(device_metrics: dict) -> dict[str, float]:
  """The one read of a step's update metrics (nested dicts of arrays), as floats."""
  host = device_reads.read('update_metrics', device_metrics)
  return jax.tree.map(float, host)
