import itertools
import math

import numpy as np
import pytest

from ac2_jax.train import eval_stats
from ac2_jax.train.eval_stats import pass_at_k


def test_pass_at_k_matches_enumeration():
  n, c, k = 6, 2, 3
  correct = [1] * c + [0] * (n - c)
  subsets = list(itertools.combinations(correct, k))
  expected = sum(any(s) for s in subsets) / len(subsets)
  assert pass_at_k(n, c, k) == pytest.approx(expected)
  assert pass_at_k(n, 0, k) == 0.0
  assert pass_at_k(n, 5, 2) == 1.0
  with pytest.raises(ValueError, match='pass_at_k'):
    pass_at_k(4, 5, 1)


def test_best_of_n_bootstrap_close_to_exact():
  scores = np.array([[0.0, 0.0, 1.0, 0.5], [0.2, 0.2, 0.2, 0.2]])
  rng = np.random.default_rng(0)
  # Exact expectation of the max of 2 draws with replacement: problem 1 -> 1 - (3/4)^2 for the 1.0 ...
  p1 = 1 * (1 - 0.75 ** 2) + 0.5 * (0.75 ** 2 - 0.5 ** 2)
  exact = (p1 + 0.2) / 2
  assert eval_stats.best_of_n_bootstrap(scores, 2, rng, resamples=20000) == pytest.approx(exact, abs=0.01)
  assert eval_stats.mean_score(scores) == pytest.approx(scores.mean())
  assert math.isnan(eval_stats.mean_score(np.zeros((0, 4))))
