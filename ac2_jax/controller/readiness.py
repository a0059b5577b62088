"""Per-problem readiness: when the critic may replace terminal rewards (AC2 item 6).

A problem becomes ready at the end of a step when all of these hold:
  (a) global: the pooled mean of every individual error over the last `readiness_window` complete
      steps is below tau_global, and that many steps exist;
  (b) local: the problem's latest error is below tau_local;
  (c) the problem has a reference in the bank as it was before this step's additions;
  (d) the critic has predicted a nonzero V(s) for the problem at this or an earlier step.
The no-local-readiness variant makes every problem ready once (a) holds. Once ready, ready forever
(the spec), unless the controller revokes it (`readiness_revocable`: a failed audit); the flip takes
effect from the next plan.

Errors are |V(s) - target| with V(s) read before the update and an unparseable V(s) counted as 1.
A problem sampled at several slots in one step records the mean of that step's errors as its latest
error.
"""

from __future__ import annotations

import collections

import numpy as np

from ac2_jax.controller.settings import ControllerSettings


class Readiness:
  """Readiness state over the problems 0..P-1."""

  def __init__(self, num_problems: int, settings: ControllerSettings):
    self.settings = settings
    self.ready_P = np.zeros((num_problems,), bool)
    self.latest_error_P = np.full((num_problems,), np.nan)
    self.nonzero_prediction_P = np.zeros((num_problems,), bool)
    self._window: collections.deque[np.ndarray] = collections.deque(
        maxlen=settings.readiness_window)

  @property
  def num_ready(self) -> int:
    return int(self.ready_P.sum())

  def window_error(self) -> float:
    """Pooled mean error over the window (NaN when it holds no error)."""
    pooled = np.concatenate(list(self._window)) if self._window else np.zeros((0,))
    return float(pooled.mean()) if pooled.size else float('nan')

  def global_ok(self) -> bool:
    if len(self._window) < self.settings.readiness_window:
      return False
    error = self.window_error()
    return bool(error == error and error < self.settings.tau_global)

  def record_step(self, problems_E: np.ndarray, errors_E: np.ndarray,
                  nonzero_problems: np.ndarray) -> None:
    """Adds one complete step: its individual errors (with their problems) and the problems whose
    V(s) was predicted nonzero."""
    problems_E = np.asarray(problems_E, np.int64)
    errors_E = np.asarray(errors_E, np.float64)
    self._window.append(errors_E.copy())
    if problems_E.size:
      sums = np.bincount(problems_E, weights=errors_E, minlength=self.ready_P.shape[0])
      counts = np.bincount(problems_E, minlength=self.ready_P.shape[0])
      seen = counts > 0
      self.latest_error_P[seen] = sums[seen] / counts[seen]
    self.nonzero_prediction_P[np.asarray(nonzero_problems, np.int64)] = True

  def update(self, has_reference_P: np.ndarray) -> np.ndarray:
    """Flips the problems that meet every condition; returns their indices (ascending)."""
    if not self.global_ok():
      return np.zeros((0,), np.int64)
    if self.settings.no_local_readiness:
      flip_P = ~self.ready_P
    else:
      with np.errstate(invalid='ignore'):
        local_P = self.latest_error_P < self.settings.tau_local
      flip_P = ~self.ready_P & local_P & has_reference_P & self.nonzero_prediction_P
    self.ready_P |= flip_P
    return np.flatnonzero(flip_P)

  def revoke(self, problems: np.ndarray) -> np.ndarray:
    """Makes the given problems unready; returns those that were ready (ascending)."""
    problems = np.unique(np.asarray(problems, np.int64))
    was_ready = problems[self.ready_P[problems]]
    self.ready_P[was_ready] = False
    return was_ready

  def state_dict(self) -> dict:
    return {
        'ready': self.ready_P.copy(),
        'latest_error': self.latest_error_P.copy(),
        'nonzero_prediction': self.nonzero_prediction_P.copy(),
        'window': [w.copy() for w in self._window],
    }

  def load_state_dict(self, state: dict) -> None:
    num_problems = self.ready_P.shape[0]
    for name in ('ready', 'latest_error', 'nonzero_prediction'):
      if np.shape(state[name]) != (num_problems,):
        raise ValueError(f'readiness state {name!r} has shape {np.shape(state[name])}, '
                         f'expected ({num_problems},)')
    self.ready_P = np.asarray(state['ready'], bool).copy()
    self.latest_error_P = np.asarray(state['latest_error'], np.float64).copy()
    self.nonzero_prediction_P = np.asarray(state['nonzero_prediction'], bool).copy()
    self._window.clear()
    for errors in state['window']:  # a shorter window (a branched variant) keeps the newest steps
      self._window.append(np.asarray(errors, np.float64).copy())
