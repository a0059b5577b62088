"""Rollout rows and the value-head critic: per-token reads and critic minibatches.

Per-token arrays of a row have one entry per generated token (`Row.new_N`), as its sampling
log-probs do: entry i belongs to token i, so a value is V(s) of the state before that token. On the
device they sit at the token's position of the right-padded (context + new tokens) batch, as in
`rows.actor_batch`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ac2_jax import sampling
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import value_critic
from ac2_jax.learner.runtime import Runtime
from ac2_jax.sampling import sampler


def _per_row(rows: Sequence[rows_lib.Row], x_BxT) -> list[np.ndarray]:
  """The generated-token entries of each row of a device [B, T] array, on the host (its rows
  gathered from every process when the batch spans several)."""
  x = np.asarray(sampler.to_host(x_BxT, 'value_reads'))
  out = []
  for b, r in enumerate(rows):
    c = len(r.context_P)
    out.append(x[b, c:c + len(r.new_N)].astype(np.float32))
  return out


def read_values(rt: Runtime, value_params, rows: Sequence[rows_lib.Row]) -> list[np.ndarray]:
  """V(s_t) of every generated token of every row, from the value critic `value_params`."""
  if not rows:
    return []
  tokens_BxT = rows_lib.actor_batch(rt, rows).tokens_BxT
  return _per_row(rows, value_critic.link(rt.value_settings,
                                          rt.value_logits(value_params, tokens_BxT)))


def read_logprobs(rt: Runtime, params, rows: Sequence[rows_lib.Row]) -> list[np.ndarray]:
  """log pi(token) of every generated token under the policy `params` (at the training
  temperature, as the actor loss reads them)."""
  if not rows:
    return []
  tokens_BxT = rows_lib.actor_batch(rt, rows).tokens_BxT
  return _per_row(rows, rt.policy_logprobs(params, tokens_BxT))


def count_pairs(groups: Sequence[int], rewards: Sequence[float]) -> int:
  """Ordered pairs (i, j) of one group with R_i > R_j: the ranking term's pairs."""
  g, r = np.asarray(groups), np.asarray(rewards, np.float32)
  return int(((g[:, None] == g[None, :]) & (r[:, None] > r[None, :])).sum())


def value_batch(rt: Runtime, rows: Sequence[rows_lib.Row], targets: Sequence[np.ndarray],
                masks: Sequence[np.ndarray], old_values: Sequence[np.ndarray],
                groups: Sequence[int] | None = None, rewards: Sequence[float] | None = None
                ) -> value_critic.ValueBatch:
  """Right-padded (context + new tokens) with per-token targets, masks and old values; with
  `groups` and `rewards` (per row) also the ranking term's rows (`ValueBatch`)."""
  T = sampling.train_bucket(max(len(r.context_P) + len(r.new_N) for r in rows))
  B = rows_lib.bucket_rows(len(rows), rt.batch_multiple)
  tokens = np.zeros((B, T), np.int32)
  per_token = np.zeros((3, B, T), np.float32)
  for b, r in enumerate(rows):
    c, n = len(r.context_P), len(r.new_N)
    tokens[b, :c] = r.context_P
    tokens[b, c:c + n] = r.new_N
    for k, x in enumerate((masks[b], targets[b], old_values[b])):
      per_token[k, b, c:c + n] = x
  mask, target, old = per_token
  if groups is None:
    return rt.put_batch(value_critic.ValueBatch(tokens, mask, target, old))
  group_B = np.full((B,), -1, np.int32)
  rewards_B = np.zeros((B,), np.float32)
  last_B = np.zeros((B,), np.int32)
  group_B[:len(rows)] = groups
  rewards_B[:len(rows)] = rewards
  last_B[:len(rows)] = [len(r.context_P) + len(r.new_N) - 1 for r in rows]
  pairs = count_pairs(groups, rewards)
  pair_scale_B = np.full((B,), mask.sum() / pairs if pairs else 0.0, np.float32)
  return rt.put_batch(value_critic.ValueBatch(tokens, mask, target, old, group_B, rewards_B,
                                              last_B, pair_scale_B))


def train_value(rt: Runtime, state, rows: Sequence[rows_lib.Row], targets: Sequence[np.ndarray],
                masks: Sequence[np.ndarray], old_values: Sequence[np.ndarray], minibatch: int,
                groups: Sequence[int] | None = None, rewards: Sequence[float] | None = None):
  """One critic update on minibatch `minibatch` (the actor's split, `rows.minibatch_rows`).

  `targets`, `masks` and `old_values` (and `groups`, `rewards` for the ranking term) are per row,
  aligned with `rows`. Returns (state, metrics on the device).
  """
  index = {id(r): i for i, r in enumerate(rows)}
  chosen = [index[id(r)] for r in rows_lib.minibatch_rows(rt, rows, minibatch)]
  if not chosen:
    return state, {'skipped_empty': 1.0}
  pick = lambda xs: [xs[i] for i in chosen]
  ranked = {} if groups is None else {'groups': pick(groups), 'rewards': pick(rewards)}
  batch = value_batch(rt, pick(rows), pick(targets), pick(masks), pick(old_values), **ranked)
  return rt.value_step(state, batch)
