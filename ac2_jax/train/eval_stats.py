"""Validation statistics over n responses per problem: mean score, best-of-n by bootstrap."""

from __future__ import annotations

import numpy as np


def mean_score(scores_PxN: np.ndarray) -> float:
  """Mean over problems and responses of the per-response score in [0, 1]."""
  return float(np.mean(scores_PxN)) if scores_PxN.size else float('nan')


def best_of_n_bootstrap(scores_PxN: np.ndarray, n: int, rng: np.random.Generator,
                        resamples: int = 200) -> float:
  """Expected max score of n responses drawn with replacement from each problem's responses."""
  if scores_PxN.size == 0:
    return float('nan')
  P, N = scores_PxN.shape
  picks_RxPxn = rng.integers(0, N, size=(resamples, P, n))
  drawn = np.take_along_axis(scores_PxN[None], picks_RxPxn, axis=2)
  return float(drawn.max(axis=2).mean())
