"""Wall time of a step's phases (generation, judge, critic reads, updates, controller), per step.

    timer = PhaseTimer()
    with timer('generate'):
      rows = ...
    metrics.update(timer.metrics())   # {'time/generate': seconds, ...}

JAX dispatches device work asynchronously: a phase that ends in a device call is timed through
`ready(...)`, which waits for its outputs, so its time is its own and not the next phase's.
"""

from __future__ import annotations

import contextlib
import time

import jax


class PhaseTimer:

  def __init__(self):
    self._seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, phase: str):
    start = time.perf_counter()
    try:
      yield
    finally:
      self._seconds[phase] = self._seconds.get(phase, 0.0) + time.perf_counter() - start

  def metrics(self) -> dict[str, float]:
    return {f'time/{k}': v for k, v in self._seconds.items()}


def ready(outputs):
  """`outputs` once every array in it is computed (for timing device work)."""
  return jax.block_until_ready(outputs)
