"""Wall time of a step's phases (generation, judge, critic reads, updates, controller), per step.

    timer = PhaseTimer()
    with timer('generate'):
      rows = ...
    metrics.update(timer.metrics())   # {'time/generate': seconds, ...}

JAX dispatches device work asynchronously: a phase that ends in a device call is timed through
`ready(...)`, which waits for its outputs, so its time is its own and not the next phase's.

`CompileClock` counts the seconds JAX spends tracing, lowering and compiling, inside whichever
phases need a new program: the trainer logs them per step (`time/compile`), so that a step's time
can be read with and without them.
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


# Tracing, lowering and XLA compilation: consecutive, so their seconds add up.
COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
                  '/jax/core/compile/jaxpr_to_mlir_module_duration',
                  '/jax/core/compile/backend_compile_duration')


class CompileClock:
  """Seconds JAX spent tracing, lowering and compiling since the last `lap`, while in its `with`
  block (the listener is global to the process, so it leaves with the block)."""

  def __init__(self):
    self.seconds = 0.0

  def __enter__(self) -> 'CompileClock':
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *_) -> None:
    jax.monitoring.unregister_event_duration_listener(self._listen)

  def _listen(self, event: str, duration: float, **_) -> None:
    if event in COMPILE_EVENTS:
      self.seconds += duration

  def lap(self) -> float:
    seconds, self.seconds = self.seconds, 0.0
    return seconds
