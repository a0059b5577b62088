"""Wall time of repeated calls, without importing JAX (the transformers worker uses it too)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
  """(median, all) wall seconds of `repeats` calls of `fn`, which must block until it is done."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times), times
