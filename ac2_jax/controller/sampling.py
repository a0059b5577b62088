"""The random choices of a step's plan: fresh problems, replay slots, cut positions, audits.

Each function takes the numpy Generator of its purpose (see rng.py) and returns plain arrays.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ac2_jax.controller.replay import Trajectory


def cycle_draw(rng: np.random.Generator, population_K: np.ndarray, n: int) -> np.ndarray:
  """Permutes the population once and cycles through it until n are chosen.

  Without replacement while n <= K; beyond that every member appears floor(n/K) or ceil(n/K) times.
  """
  population_K = np.asarray(population_K)
  if n == 0:
    return population_K[:0]
  if population_K.shape[0] == 0:
    raise ValueError(f'cannot draw {n} items from an empty population')
  return np.resize(rng.permutation(population_K), n)


def cut_limit(length: int | np.ndarray, max_fraction: float) -> np.ndarray:
  """floor(max_fraction * L), robust to the float error of e.g. 0.9 * 10."""
  return np.floor(max_fraction * np.asarray(length, np.float64) + 1e-9).astype(np.int64)


def cut_ends(trajectories: Sequence[Trajectory]) -> np.ndarray:
  """Each trajectory's cut_end, its length where it has none."""
  return np.array([t.length if t.cut_end is None else t.cut_end for t in trajectories], np.int64)


def sample_cuts(rng: np.random.Generator, lengths_S: np.ndarray, grid: int,
                max_fraction: float, ends_S: np.ndarray | None = None) -> np.ndarray:
  """One cut per trajectory: a multiple of `grid` uniform in [0, max_fraction * L] (and in
  [0, ends_S] when given), capped at L - 1.

  0 (the empty prefix) is always allowed.
  """
  lengths_S = np.asarray(lengths_S, np.int64)
  if lengths_S.shape[0] == 0:
    return lengths_S.copy()
  limits_S = cut_limit(lengths_S, max_fraction)
  if ends_S is not None:
    limits_S = np.minimum(limits_S, np.asarray(ends_S, np.int64))
  choices_S = limits_S // grid + 1
  picks_S = rng.integers(0, choices_S)
  return np.minimum(picks_S * grid, np.maximum(lengths_S - 1, 0))


def cuts_at_ends(cuts_S: np.ndarray, trajectories: Sequence[Trajectory]) -> np.ndarray:
  """Each trajectory's cut_end (capped at L - 1) in place of its drawn cut, where it has one."""
  return np.array([c if t.cut_end is None else min(t.cut_end, max(t.length - 1, 0))
                   for c, t in zip(np.asarray(cuts_S).tolist(), trajectories)], np.int64)


def cut_candidates(length: int, grid: int, max_fraction: float, end: int | None = None
                   ) -> np.ndarray:
  """Every cut sample_cuts can return for a trajectory of this length (and cut end), ascending
  and distinct."""
  limit = int(cut_limit(length, max_fraction))
  if end is not None:
    limit = min(limit, int(end))
  positions = np.arange(limit // grid + 1, dtype=np.int64) * grid
  return np.unique(np.minimum(positions, max(length - 1, 0)))


def audit_count(num_ready: int, alpha: float) -> int:
  """ceil(alpha * n), without the float error of e.g. ceil(0.1 * 30) = 4."""
  return min(num_ready, math.ceil(round(alpha * num_ready, 9)))


def select_audits(rng: np.random.Generator, num_ready: int, alpha: float) -> np.ndarray:
  """Positions (among the ready slots, ascending) that get full rollouts."""
  count = audit_count(num_ready, alpha)
  if count == 0:
    return np.zeros((0,), np.int64)
  return np.sort(rng.choice(num_ready, size=count, replace=False))


def distinct_prefixes(rng: np.random.Generator, trajectories: Sequence[Trajectory], count: int,
                      grid: int, max_fraction: float) -> list[tuple[Trajectory, int]]:
  """`count` (trajectory, cut) pairs of one problem for group-size-1 singles.

  Pairs are drawn without replacement from every allowed cut of every stored trajectory of the
  problem, so the cuts are distinct while enough exist; beyond that the draw cycles.
  """
  candidates = [(t, int(c)) for t in trajectories
                for c in cut_candidates(t.length, grid, max_fraction, t.cut_end)]
  order = cycle_draw(rng, np.arange(len(candidates)), count)
  return [candidates[i] for i in order]
