"""Validation statistics over n responses per problem: mean score, best-of-n by bootstrap, pass@k."""

from __future__ import annotations

import math

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


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
  """Unbiased estimator 1 - C(n - c, k) / C(n, k) (ALGORITHMS.md, Evaluation; launch/evaluate.py)."""
  if not 0 <= num_correct <= num_samples or not 1 <= k <= num_samples:
    raise ValueError(f'pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={num_samples}, '
                     f'c={num_correct}, k={k}')
  if num_samples - num_correct < k:
    return 1.0
  return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)
