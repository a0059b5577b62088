"""What a run prints: durations, an ETA from the steps done so far, and no progress-bar debris in logs.

A log file (stdout redirected) should hold one line per step; tfds's "Shuffling ..." and other tqdm
bars write carriage returns and terminal escape codes there, so launchers switch them off when
stdout or stderr is not a terminal (`quiet_progress_bars`).
"""

from __future__ import annotations

import math
import sys
import time


def format_duration(seconds: float | None) -> str:
  """`45s`, `12m05s`, `3h07m`; '?' when unknown."""
  if seconds is None or not math.isfinite(seconds) or seconds < 0:
    return '?'
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m{seconds % 60:02d}s'
  return f'{seconds // 3600}h{(seconds % 3600) // 60:02d}m'


class Eta:
  """Remaining time of a loop from the mean wall time of the iterations done in this process
  (evaluations and checkpoints included, so it is what a watcher waits)."""

  def __init__(self, first: int, last: int, clock=time.monotonic):
    self.first, self.last = first, last
    self._clock = clock
    self._start = clock()

  def seconds_left(self, done: int) -> float | None:
    """Seconds still to go once iteration `done` (first <= done <= last) has finished."""
    count = done - self.first + 1
    if count < 1:
      return None
    return (self._clock() - self._start) / count * (self.last - done)


def quiet_progress_bars(streams=(sys.stdout, sys.stderr)) -> bool:
  """Disables tfds's (tqdm) progress bars unless every stream is a terminal; True when disabled."""
  if all(getattr(s, 'isatty', lambda: False)() for s in streams):
    return False
  import tensorflow_datasets as tfds  # Only the data build draws bars; imported when needed.
  tfds.disable_progress_bar()
  return True
