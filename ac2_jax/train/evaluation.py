"""Validation: n sampled responses per validation problem, scored by the task's judge.

Evaluation decoding is not counted in the decoding-FLOPs axis (ALGORITHMS.md, Decoding FLOPs).
"""

from __future__ import annotations

import jax
import numpy as np

from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner.runtime import Runtime
from ac2_jax.train import eval_stats


def sample_scores(rt: Runtime, params, key: jax.Array, *, num_problems: int, num_responses: int,
                  max_new_tokens: int) -> tuple[np.ndarray, list, list]:
  """(scores_PxN in [0, 1], grades, rows) of n sampled responses to each of the first problems."""
  n_problems = min(num_problems, len(rt.val_records))
  if n_problems < 1:
    raise ValueError('evaluation needs at least one validation problem')
  pidx = np.repeat(np.arange(n_problems), num_responses)
  contexts = [rt.val_prompts[p] for p in pidx]
  rows, _ = rows_lib.generate_rows(rt, params, contexts, [0] * len(pidx), pidx,
                                   [max_new_tokens] * len(pidx), [max_new_tokens] * len(pidx), key,
                                   rt.eval_sampling)
  texts = rows_lib.response_texts(rt, rows)
  grades = rt.task.score_batch([rt.val_records[p] for p in pidx], texts)
  scores_PxN = np.array([g.reward for g in grades], np.float64).reshape(n_problems, num_responses)
  return scores_PxN, grades, rows


def evaluate(rt: Runtime, params, key: jax.Array, *, num_problems: int, num_responses: int,
             max_new_tokens: int, best_of: int | None = None) -> dict:
  """Mean score (points / 7) and bootstrap best-of-n over the first `num_problems` problems."""
  scores_PxN, grades, rows = sample_scores(rt, params, key, num_problems=num_problems,
                                           num_responses=num_responses,
                                           max_new_tokens=max_new_tokens)
  best_of = best_of or num_responses
  rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
  return {
      'val/mean_score': eval_stats.mean_score(scores_PxN),
      'val/best_of_n': eval_stats.best_of_n_bootstrap(scores_PxN, best_of, rng),
      'val/full_marks': float(np.mean(scores_PxN >= 1.0)),
      'val/judge_failures': sum(not g.valid for g in grades),
      'val/mean_new_tokens': float(np.mean([len(r.new_N) for r in rows])),
  }
