"""Li2SAO's bootstrap phase: group-relative actor advantages, the critic's group-residual targets.

Groups are [N, G] (N prompts, G = n_b responses); token arrays are [N, G, T] over response
positions.
- actor: A_i = (R_i - mu_g) / (sigma_g + eps), sigma_g with the (n_b - 1) denominator, on every
  model token;
- critic target: G~_{i,t} = R_i - mu_g (lambda = gamma = 1); groups with identical rewards are
  dropped;
- divergence mask: d(i, j) = first response position where i and j differ, d_i = max over j with
  R_j != R_i; the critic trains on model tokens t >= d_i (no opposite outcome: last model token);
- ranking pairs (i+, i-) with R_i+ > R_i-, for the hinge at the last action token (critic_loss);
- readiness statistics on mixed groups: residual explained variance e_k and pair-ordering accuracy
  a_k.
"""

from __future__ import annotations

import jax.numpy as jnp

from ac2_jax.rl import advantages


def _present(rewards_NxG, mask_NxG):
  if mask_NxG is None:
    return jnp.ones(jnp.shape(rewards_NxG), bool)
  return jnp.asarray(mask_NxG, bool)


def actor_advantages(rewards_NxG, mask_NxG=None, *, eps: float = 1e-6):
  """(R_i - mu_g) / (sigma_g + eps) with the sample (n - 1) standard deviation."""
  return advantages.grpo_advantages(rewards_NxG, mask_NxG, normalize_std=True, eps=eps, std_ddof=1)


def mixed_groups(rewards_NxG, mask_NxG=None):
  """True for groups whose present rewards are not all identical (the critic trains on these)."""
  present = _present(rewards_NxG, mask_NxG)
  r = jnp.asarray(rewards_NxG, jnp.float32)
  high = jnp.where(present, r, -jnp.inf).max(-1)
  low = jnp.where(present, r, jnp.inf).min(-1)
  return high > low


def residual_targets(rewards_NxG, mask_NxG=None):
  """Centred outcomes Z_i = R_i - mu_g, and the rows the critic trains on (mixed groups only)."""
  present = _present(rewards_NxG, mask_NxG)
  z_NxG = advantages.grpo_advantages(rewards_NxG, present)
  keep_NxG = present & mixed_groups(rewards_NxG, present)[:, None]
  return jnp.where(keep_NxG, z_NxG, 0.0), keep_NxG


def divergence_mask(tokens_NxGxT, lengths_NxG, model_mask_NxGxT, rewards_NxG, mask_NxG=None):
  """Li2SAO's critic mask c_{i,t}: model tokens at or after d_i = max_{j: R_j != R_i} d(i, j).

  d(i, j) is the first position where the responses differ; a response that is a prefix of the other
  differs at its end. A response with no opposite-outcome partner keeps only its last model token,
  and so does one whose d_i falls past its last model token (identical text, different outcome).
  `lengths_NxG` are response lengths (positions >= length are padding).
  """
  tokens = jnp.asarray(tokens_NxGxT)
  n, g, t = tokens.shape
  present = _present(rewards_NxG, mask_NxG)
  model = jnp.asarray(model_mask_NxGxT, bool)
  lengths = jnp.asarray(lengths_NxG)
  pos_T = jnp.arange(t)
  beyond_NxGxT = pos_T[None, None, :] >= lengths[:, :, None]
  differ_NxGxGxT = ((tokens[:, :, None, :] != tokens[:, None, :, :])
                    | beyond_NxGxT[:, :, None, :] | beyond_NxGxT[:, None, :, :])
  # First differing position; t when the rows never differ inside the array.
  first_NxGxG = jnp.where(differ_NxGxGxT.any(-1), jnp.argmax(differ_NxGxGxT, axis=-1), t)
  r = jnp.asarray(rewards_NxG, jnp.float32)
  opposite_NxGxG = (r[:, :, None] != r[:, None, :]) & present[:, None, :] & present[:, :, None]
  d_NxG = jnp.where(opposite_NxGxG, first_NxGxG, -1).max(-1)
  model = model & ~beyond_NxGxT
  last_model_NxG = t - 1 - jnp.argmax(model[..., ::-1], axis=-1)
  last_only_NxGxT = pos_T[None, None, :] == last_model_NxG[:, :, None]
  after_NxGxT = pos_T[None, None, :] >= d_NxG[:, :, None]
  has_kept_NxG = (model & after_NxGxT).any(-1) & (d_NxG >= 0)
  mask_NxGxT = jnp.where(has_kept_NxG[:, :, None], after_NxGxT, last_only_NxGxT) & model
  return mask_NxGxT & present[:, :, None]


def ranking_pairs(rewards_NxG, mask_NxG=None):
  """pairs_NxGxG[n, i, j] = R_i > R_j for present responses i, j of group n."""
  present = _present(rewards_NxG, mask_NxG)
  r = jnp.asarray(rewards_NxG, jnp.float32)
  return (r[:, :, None] > r[:, None, :]) & present[:, :, None] & present[:, None, :]


def explained_variance(z_NxG, terminal_values_NxG, keep_NxG):
  """e_k = 1 - Var(Z - V(s_T)) / Var(Z) over the kept rows (mixed groups); 0 when Var(Z) = 0."""
  keep = jnp.asarray(keep_NxG, jnp.float32)
  count = jnp.maximum(keep.sum(), 1.0)

  def var(x):
    mean = (x * keep).sum() / count
    return (((x - mean) * keep) ** 2).sum() / count

  z = jnp.asarray(z_NxG, jnp.float32)
  var_z = var(z)
  residual = var(z - jnp.asarray(terminal_values_NxG, jnp.float32))
  return jnp.where(var_z > 0, 1.0 - residual / jnp.where(var_z > 0, var_z, 1.0), 0.0)


def ranking_accuracy(terminal_values_NxG, pairs_NxGxG):
  """a_k: the fraction of pairs (i+, i-) with V(i+) > V(i-); 0 when there are no pairs."""
  v = jnp.asarray(terminal_values_NxG, jnp.float32)
  pairs = jnp.asarray(pairs_NxGxG, jnp.float32)
  correct = (v[:, :, None] > v[:, None, :]).astype(jnp.float32) * pairs
  return correct.sum() / jnp.maximum(pairs.sum(), 1.0)
