"""Sequence-level advantage estimators over groups: GRPO, RLOO, AC2 chunks, AC2 with group size 1.

Groups are laid out as [N, G] (N prefixes or problems, G continuations each); `mask_NxG` marks the
rows that exist (ragged groups are padded). Every function is pure jnp and jits; results are 0 on
absent rows. `to_tokens` spreads a per-row advantage over that row's loss tokens.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ac2_jax.critic import values as critic_values


def _mask(x_NxG, mask_NxG):
  if mask_NxG is None:
    return jnp.ones(jnp.shape(x_NxG), jnp.float32)
  if jnp.shape(mask_NxG) != jnp.shape(x_NxG):
    raise ValueError(
        f'mask shape {jnp.shape(mask_NxG)} differs from values shape {jnp.shape(x_NxG)}')
  return jnp.asarray(mask_NxG, jnp.float32)


def _check_groups(x_NxG, name):
  if jnp.ndim(x_NxG) != 2:
    raise ValueError(f'{name} must be [N, G], got shape {jnp.shape(x_NxG)}')


def group_mean(x_NxG, mask_NxG=None):
  """Mean over the present rows of each group (0 for an empty group)."""
  m = _mask(x_NxG, mask_NxG)
  count_N = m.sum(-1)
  return (jnp.asarray(x_NxG, jnp.float32) * m).sum(-1) / jnp.maximum(count_N, 1.0)


def group_std(x_NxG, mask_NxG=None, *, ddof: int = 0):
  """Standard deviation over present rows with denominator (n - ddof); 0 where n <= ddof."""
  m = _mask(x_NxG, mask_NxG)
  count_N = m.sum(-1)
  centred = (jnp.asarray(x_NxG, jnp.float32) - group_mean(x_NxG, m)[:, None]) * m
  var_N = (centred ** 2).sum(-1) / jnp.maximum(count_N - ddof, 1.0)
  return jnp.where(count_N > ddof, jnp.sqrt(var_N), 0.0)


def grpo_advantages(rewards_NxG, mask_NxG=None, *, normalize_std: bool = False, eps: float = 1e-6,
                    std_ddof: int = 0):
  """A_i = R_i - mean_j R_j, optionally / (std_j + eps), std with denominator n - ddof."""
  _check_groups(rewards_NxG, 'rewards_NxG')
  m = _mask(rewards_NxG, mask_NxG)
  adv_NxG = jnp.asarray(rewards_NxG, jnp.float32) - group_mean(rewards_NxG, m)[:, None]
  if normalize_std:
    denom_N1 = group_std(rewards_NxG, m, ddof=std_ddof)[:, None] + eps
    # A constant group has a zero numerator; keep it 0 even with eps = 0.
    adv_NxG = jnp.where(denom_N1 > 0, adv_NxG / jnp.where(denom_N1 > 0, denom_N1, 1.0), 0.0)
  return adv_NxG * m


def rloo_advantages(rewards_NxG, mask_NxG=None):
  """Leave-one-out baseline: A_i = R_i - mean_{j != i} R_j; 0 in groups of fewer than two rows."""
  _check_groups(rewards_NxG, 'rewards_NxG')
  m = _mask(rewards_NxG, mask_NxG)
  r = jnp.asarray(rewards_NxG, jnp.float32) * m
  count_N1 = m.sum(-1, keepdims=True)
  others_mean = (r.sum(-1, keepdims=True) - r) / jnp.maximum(count_N1 - 1.0, 1.0)
  return jnp.where(count_N1 > 1, r - others_mean, 0.0) * m


def ac2_chunk_advantages(values_NxG, valid_NxG, mask_NxG=None):
  """AC2 advantages A_i = v_i - mean_j v_j with the invalid-value rules (ALGORITHMS.md, AC2 step 4).

  `values_NxG` holds endpoint values (critic reads or judge rewards; a judge failure is a valid 0);
  `valid_NxG` is False only where the critic's value was unparseable. An invalid v_i is replaced by
  the mean of the group's valid values (0 if none) before the group mean is taken, and its row gets
  loss weight 0 (multiply the row's loss mask by it, so it leaves the token count too).

  Returns (advantages_NxG, loss_weights_NxG, filled_values_NxG).
  """
  _check_groups(values_NxG, 'values_NxG')
  m = _mask(values_NxG, mask_NxG)
  valid = jnp.asarray(valid_NxG, jnp.float32) * m
  v = jnp.asarray(values_NxG, jnp.float32)
  v = jnp.where(valid > 0, v, 0.0)  # an invalid read may carry NaN or a sentinel
  fill_N = group_mean(v, valid)
  filled_NxG = jnp.where(valid > 0, v, fill_N[:, None]) * m
  adv_NxG = (filled_NxG - group_mean(filled_NxG, m)[:, None]) * m
  return adv_NxG, valid, filled_NxG


def ac2_critic_targets(values_NxG, target_valid_NxG, *, min_valid: int = 8):
  """Critic target per prefix: the mean of the valid values, rounded to the grid (ties down).

  `target_valid_NxG` excludes invalid critic reads AND judge failures (a judge failure still enters
  the actor loss with reward 0 but never a critic target). Returns (targets_N, has_target_N); a
  prefix has a target only with at least `min_valid` valid values (and at least one).
  """
  _check_groups(values_NxG, 'values_NxG')
  valid = jnp.asarray(target_valid_NxG, jnp.float32)
  v = jnp.where(valid > 0, jnp.asarray(values_NxG, jnp.float32), 0.0)
  count_N = valid.sum(-1)
  has_target_N = count_N >= max(min_valid, 1)
  targets_N = critic_values.round_to_grid_array(group_mean(v, valid), jnp)
  return jnp.where(has_target_N, targets_N, 0.0), has_target_N


def ac2_single_advantages(values_N, valid_N, baselines_N, baseline_valid_N):
  """AC2 with group size 1: A = v - V(s) for one continuation of prefix s (ALGORITHMS.md, variants).

  A row whose endpoint value v or baseline V(s) is invalid is dropped from the actor loss and from
  the critic targets. Returns (advantages_N, loss_weights_N, targets_N, has_target_N) with target =
  grid(v).
  """
  keep_N = jnp.asarray(valid_N, bool) & jnp.asarray(baseline_valid_N, bool)
  v_N = jnp.asarray(values_N, jnp.float32)
  adv_N = jnp.where(keep_N, v_N - jnp.asarray(baselines_N, jnp.float32), 0.0)
  targets_N = jnp.where(keep_N, critic_values.round_to_grid_array(
      jnp.where(keep_N, v_N, 0.0), jnp), 0.0)
  return adv_N, keep_N.astype(jnp.float32), targets_N, keep_N


def to_tokens(advantages_B, mask_BxT):
  """The same advantage on every loss token of a row: [B] x [B, T] -> [B, T]."""
  if jnp.ndim(advantages_B) != 1 or jnp.shape(advantages_B)[0] != jnp.shape(mask_BxT)[0]:
    raise ValueError(
        f'advantages_B {jnp.shape(advantages_B)} does not match mask_BxT {jnp.shape(mask_BxT)}')
  return jnp.asarray(advantages_B, jnp.float32)[:, None] * jnp.asarray(mask_BxT, jnp.float32)


def zero_variance_share(groups) -> float | None:
  """Share of groups (sequences of endpoint values) whose values are all equal: they teach nothing.

  Groups of one value are left out (group-size-1 singles have a critic baseline instead); None
  when no group is left.
  """
  sized = [np.asarray(g, np.float64) for g in groups if len(g) > 1]
  if not sized:
    return None
  return float(np.mean([np.ptp(g) < 1e-9 for g in sized]))
