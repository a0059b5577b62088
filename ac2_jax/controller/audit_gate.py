"""The audit gate: ready chunks are trusted only while the audits show the critic ranks them.

A departure from the spec (`controller.audit_gate`, off in the paper). Readiness (readiness.py)
tests accuracy only: |V(s) - target| under tau. A critic that answers about one value per problem
passes it and then scores every ready chunk of a group alike, so their advantages are about 0 and
the ready slots train on nothing (BENCHMARKS.md, session 27: seed 2's critic, ready on 78% of the
slots, chunk advantages correlated 0.18 with the Monte Carlo ones; seeds 0 and 1: 0.76 / 0.80).

The audits already measure what matters. An audited slot runs its g continuations to the end and
reads the critic where each chunk would have ended, so every audited group gives the critic's
chunk advantages v_i - mean_j v_j beside the Monte Carlo ones r_i - mean_j r_j (v_i is r_i where
the continuation ended inside its chunk; the AC2 paper's Figure 4, right). The gate pools these
over the last `readiness_window` steps that had audits and is open while their Pearson
correlation is at least `audit_gate_corr` over at least `audit_gate_rows` rows. Until then, and
whenever it falls below, every ready slot is audited (alpha = 1): its continuations run to the end
and train on judge rewards as an unready slot's do, and the audits keep measuring the critic,
whose pairs keep entering the critic buffer, so the gate can open again.

The same window calibrates (`controller.audit_scale`, a departure of its own): a critic that ranks
chunks well may still move its values less than the rewards move (on seed 0 of the session-28 runs
the Monte Carlo advantages were about 2x the critic's at correlation 0.8), so a ready chunk's
advantage v_i - mean_j v_j is multiplied by the window's slope of Monte Carlo on critic advantages,
clipped to [1, audit_scale_max]: its expected Monte Carlo advantage given the critic's. On three
seeds it did not help (BENCHMARKS.md, session 29).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Sequence

import numpy as np

NAN = float('nan')


@dataclasses.dataclass(frozen=True)
class AuditAdvantages:
  """One audited group's values and advantages."""

  mean_value: float        # mean_i v_i, invalid reads filled
  mean_reward: float       # mean_i r_i
  critic_A: np.ndarray     # v_i - mean_j v_j of the valid rows
  reward_A: np.ndarray     # r_i - mean_j r_j of the same rows


def audit_advantages(rewards: Sequence[float | None], chunk_end_read: Sequence[bool],
                     chunk_end_value: Sequence[float | None]) -> AuditAdvantages | None:
  """One audited group's critic and Monte Carlo advantages; None when a judge call failed (a
  reward of None: the group's mean is not its own).

  v_i is the critic's read at the chunk end where the continuation ran past it, else r_i. AC2's
  rules for invalid reads: the row is left out, and its v_i is the mean of the valid v_j (0 if
  none) before the group mean is taken.
  """
  if not rewards or any(r is None for r in rewards):
    return None
  r_G = np.asarray(rewards, np.float64)
  read_G = np.asarray(chunk_end_read, bool)
  valid_G = np.array([not read or v is not None for read, v in zip(read_G, chunk_end_value)], bool)
  v_G = np.array([(NAN if v is None else v) if read else r
                  for read, v, r in zip(read_G, chunk_end_value, r_G)], np.float64)
  v_G[~valid_G] = v_G[valid_G].mean() if valid_G.any() else 0.0
  mean_v, mean_r = float(v_G.mean()), float(r_G.mean())
  return AuditAdvantages(mean_v, mean_r, (v_G - mean_v)[valid_G], (r_G - mean_r)[valid_G])


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
  """Pearson correlation; NaN with fewer than 2 points or a constant side."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.size < 2:
    return NAN
  dx, dy = x - x.mean(), y - y.mean()
  scale = math.sqrt(float(dx @ dx) * float(dy @ dy))
  return float(dx @ dy) / scale if scale > 0 else NAN


def advantage_slope(critic_A: np.ndarray, reward_A: np.ndarray) -> float:
  """Least-squares slope through 0 of the Monte Carlo advantages on the critic's: how far the
  expected reward moves per unit of critic chunk advantage (NaN when every critic one is 0)."""
  aa = float(critic_A @ critic_A)
  return float(critic_A @ reward_A) / aa if aa > 0 else NAN


class AuditGate:
  """The pooled audit rows of the last `window` steps that had any, and the test on them."""

  def __init__(self, window: int, min_corr: float, min_rows: int):
    self.min_corr = float(min_corr)
    self.min_rows = int(min_rows)
    # One [2, rows] array per step: critic advantages, then Monte Carlo advantages.
    self._window: collections.deque[np.ndarray] = collections.deque(maxlen=int(window))

  def record_step(self, groups: Sequence[AuditAdvantages]) -> None:
    """Adds one step's audited groups that had a chunk-end read; a step without any changes
    nothing (the gate keeps its verdict until audits say otherwise)."""
    if groups:
      self._window.append(np.stack([np.concatenate([g.critic_A for g in groups]),
                                    np.concatenate([g.reward_A for g in groups])]))

  def _pooled(self) -> np.ndarray:
    return np.concatenate(list(self._window), axis=1) if self._window else np.zeros((2, 0))

  @property
  def num_rows(self) -> int:
    return int(self._pooled().shape[1])

  def correlation(self) -> float:
    """Critic against Monte Carlo advantages over the window (NaN: too few rows or one side
    constant; a critic whose chunk advantages are all 0 does not rank)."""
    pooled = self._pooled()
    return pearson(pooled[0], pooled[1])

  def slope(self) -> float:
    """The window's `advantage_slope` (NaN under min_rows rows: too few to calibrate on)."""
    pooled = self._pooled()
    return advantage_slope(pooled[0], pooled[1]) if pooled.shape[1] >= self.min_rows else NAN

  def trusted(self) -> bool:
    corr = self.correlation()
    return self.num_rows >= self.min_rows and corr == corr and corr >= self.min_corr

  def state_dict(self) -> list[np.ndarray]:
    return [w.copy() for w in self._window]

  def load_state_dict(self, window: Sequence[np.ndarray]) -> None:
    self._window.clear()
    for w in window:  # a shorter window (a branched variant) keeps the newest steps
      w = np.asarray(w, np.float64)
      if w.ndim != 2 or w.shape[0] != 2:
        raise ValueError(f'audit gate state: a step of shape {w.shape}, expected (2, rows)')
      self._window.append(w.copy())
