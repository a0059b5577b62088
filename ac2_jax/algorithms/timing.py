"""Wall time of a step's phases (generation, judge, critic reads, updates, controller), per step.

    timer = PhaseTimer()
    with timer('generate'):
      rows = ...
    metrics.update(timer.metrics())   # {'time/generate': seconds, ...}

A phase that ends in a device call is timed up to the host's read of its result, so the times add
up to the step's wall time only where each phase reads what it computed.
"""

from __future__ import annotations

import contextlib
import time


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
