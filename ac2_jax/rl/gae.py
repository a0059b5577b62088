"""Token-level generalised advantage estimation (GAE) as reverse `lax.scan`s over [B, T] arrays.

Convention: `values_BxT[b, t]` = V(s_t), the value of the state BEFORE token t (s_t = x . y_<t);
`rewards_BxT[b, t]` is the reward for emitting token t (usually only the terminal reward, see
`terminal_rewards`). The value after the last step of a row is 0 (episodes end).

  delta_t = r_t + gamma V(s_next) - V(s_t);  A_t = delta_t + gamma lambda A_next;  G_t = A_t + V_t.

`gae` steps through every masked position, with "next" = t + 1 inside the mask (a masked-out
position ends the bootstrap chain: padding, or the end of a single-turn response).
`skip_observation_gae` (SAO) links each model token to the NEXT model token however many observation
tokens lie between (multi-turn tool use). On a single contiguous run of masked tokens the two
coincide.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _per_row(x, batch):
  x = jnp.asarray(x, jnp.float32)
  if x.ndim == 0:
    return jnp.full((batch,), x)
  if x.shape != (batch,):
    raise ValueError(f'per-row coefficient must be a scalar or shape ({batch},), got {x.shape}')
  return x


def _check(values_BxT, rewards_BxT, mask_BxT):
  shapes = {jnp.shape(values_BxT), jnp.shape(rewards_BxT), jnp.shape(mask_BxT)}
  if len(shapes) != 1 or jnp.ndim(values_BxT) != 2:
    raise ValueError('values_BxT, rewards_BxT and mask_BxT must share one [B, T] shape, got '
                     f'{jnp.shape(values_BxT)}, {jnp.shape(rewards_BxT)}, {jnp.shape(mask_BxT)}')


def _scan(values_BxT, rewards_BxT, mask_BxT, gamma, lam, skip):
  b = jnp.shape(values_BxT)[0]
  gamma_B, lam_B = _per_row(gamma, b), _per_row(lam, b)
  m = jnp.asarray(mask_BxT, jnp.float32)
  v = jnp.asarray(values_BxT, jnp.float32) * m
  r = jnp.asarray(rewards_BxT, jnp.float32) * m

  def step(carry, xs):
    next_value_B, next_adv_B = carry
    v_B, r_B, m_B = xs
    delta_B = r_B + gamma_B * next_value_B - v_B
    adv_B = delta_B + gamma_B * lam_B * next_adv_B
    if skip:
      # Unmasked (observation) positions pass the next model token's value and advantage through.
      carry = (jnp.where(m_B > 0, v_B, next_value_B), jnp.where(m_B > 0, adv_B, next_adv_B))
    else:
      carry = (v_B * m_B, adv_B * m_B)
    return carry, adv_B * m_B

  zeros = jnp.zeros((b,), jnp.float32)
  _, adv_TxB = jax.lax.scan(step, (zeros, zeros), (v.T, r.T, m.T), reverse=True)
  adv_BxT = adv_TxB.T
  return adv_BxT, (adv_BxT + v) * m


def gae(values_BxT, rewards_BxT, mask_BxT, *, gamma=1.0, lam=1.0):
  """GAE(lambda, gamma) over masked tokens. `gamma`/`lam` are scalars or per-row [B] arrays.

  Returns (advantages_BxT, returns_BxT), both 0 outside the mask. lam = 1 gives sum of discounted
  rewards minus V(s_t); lam = 0 the one-step residual r_t + gamma V(s_{t+1}) - V(s_t).
  """
  _check(values_BxT, rewards_BxT, mask_BxT)
  return _scan(values_BxT, rewards_BxT, mask_BxT, gamma, lam, skip=False)


def skip_observation_gae(values_BxT, rewards_BxT, mask_BxT, *, gamma=1.0, lam=1.0):
  """SAO's skip-observation GAE: the recursion runs over the positions with mask 1 only.

  For model positions u_1 < ... < u_M: delta_{u_j} = r_{u_j} + gamma V(s_{u_{j+1}}) - V(s_{u_j}),
  with zero bootstrap after u_M. Observation positions (mask 0) get 0. Returns (advantages_BxT,
  returns_BxT).
  """
  _check(values_BxT, rewards_BxT, mask_BxT)
  return _scan(values_BxT, rewards_BxT, mask_BxT, gamma, lam, skip=True)


def terminal_rewards(rewards_B, mask_BxT):
  """[B, T] rewards: R_b on row b's last masked token, 0 elsewhere (rows without tokens: all 0)."""
  m = jnp.asarray(mask_BxT, jnp.float32)
  t = jnp.shape(m)[1]
  last_B = t - 1 - jnp.argmax(m[:, ::-1] > 0, axis=1)
  is_last_BxT = (jnp.arange(t)[None, :] == last_B[:, None]) & (m.sum(1, keepdims=True) > 0)
  return jnp.where(is_last_BxT, jnp.asarray(rewards_B, jnp.float32)[:, None], 0.0)


def adaptive_lambda(num_model_tokens_B, *, alpha: float = 1.5):
  """Length-adaptive lambda = clamp(1 - 1 / (alpha L), 0, 1) per row (L = model tokens; 0 -> 0)."""
  length_B = jnp.asarray(num_model_tokens_B, jnp.float32)
  lam = 1.0 - 1.0 / jnp.maximum(alpha * length_B, 1e-6)
  return jnp.clip(lam, 0.0, 1.0)
