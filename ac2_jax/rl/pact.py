"""PACT (policy-aligned critic training): lambda = gamma = 1 advantages, ratio-corrected targets.

Actor-then-critic: advantages A_t = R - V^(s_t) come from the critic before the actor steps; after
the actor steps, one forward pass of pi_{k+1} gives rho_t = exp(logp_new - logp_old) (no gradient),
and the critic (a sigmoid head, soft BCE) fits Y_t = rho_t R on tokens with 0 <= rho_t <= max_ratio.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

MAX_RATIO = 6.0


def advantages(rewards_B, values_BxT, mask_BxT):
  """A_t = R - V(s_t) on masked tokens, V read before the actor update (a constant here)."""
  v = jax.lax.stop_gradient(jnp.asarray(values_BxT, jnp.float32))
  m = jnp.asarray(mask_BxT, jnp.float32)
  return jnp.where(m > 0, jnp.asarray(rewards_B, jnp.float32)[:, None] - v, 0.0)


def critic_targets(new_logprobs_BxT, old_logprobs_BxT, rewards_B, mask_BxT, *,
                   max_ratio: float = MAX_RATIO):
  """(targets_BxT = rho R, critic_mask_BxT = mask & 0 <= rho <= max_ratio), rho = pi_k+1 / pi_k."""
  m = jnp.asarray(mask_BxT, jnp.float32) > 0
  log_ratio = jnp.where(m, jnp.asarray(new_logprobs_BxT, jnp.float32)
                        - jnp.asarray(old_logprobs_BxT, jnp.float32), 0.0)
  rho = jax.lax.stop_gradient(jnp.exp(log_ratio))
  keep = m & (rho >= 0.0) & (rho <= max_ratio)
  targets = jnp.where(keep, rho * jnp.asarray(rewards_B, jnp.float32)[:, None], 0.0)
  return targets, keep
