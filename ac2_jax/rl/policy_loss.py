"""Policy losses over tokens: PPO's clipped surrogate (asymmetric clip, dual clip) and SAO's DIS.

Losses come back as (loss_sum, token_count, metric_sums): sums over the masked tokens of a
minibatch, so gradient accumulation over micro-batches and token-mean aggregation are exact:
`loss = total loss_sum / total token_count`. `metric_sums` are token sums too; `finalize_metrics`
divides.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _as_f32(*xs):
  shapes = {jnp.shape(x) for x in xs}
  if len(shapes) != 1:
    raise ValueError(f'token arrays must share one [B, T] shape, got {[jnp.shape(x) for x in xs]}')
  return tuple(jnp.asarray(x, jnp.float32) for x in xs)


def _masked_inputs(mask_BxT, *xs):
  # Padding may hold garbage log-probs; zeroing them first keeps inf/NaN out of values AND
  # gradients.
  (mask,) = _as_f32(mask_BxT)
  xs = _as_f32(mask, *xs)[1:]
  return (mask,) + tuple(jnp.where(mask > 0, x, 0.0) for x in xs)


def truncated_is_weights(old_logprobs_BxT, rollout_logprobs_BxT, *, cap: float = 2.0):
  """Truncated importance weights min(pi_old / pi_rollout, cap), constants for the gradient.

  Corrects for the sampler's log-probs differing from the trainer's pi_old (precision, kernels,
  stale weights); multiply into the per-token loss via `is_weights_BxT`.
  """
  old, rollout = _as_f32(old_logprobs_BxT, rollout_logprobs_BxT)
  return jax.lax.stop_gradient(jnp.minimum(jnp.exp(old - rollout), cap))


def ppo_loss(logprobs_BxT, old_logprobs_BxT, advantages_BxT, mask_BxT, *, eps_low=0.2,
             eps_high=0.28, dual_clip=3.0, is_weights_BxT=None):
  """PPO clipped surrogate with asymmetric clip and dual clip, summed over masked tokens.

  rho = exp(logp - logp_old); loss_t = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high));
  where A < 0, loss_t = min(loss_t, -dual_clip A) (dual_clip None disables it). `eps_high` may be
  a traced scalar (the adaptive entropy control changes it every step without recompiling).

  Returns (loss_sum, token_count, metric_sums) with metric sums 'clip_frac', 'dual_clip_frac',
  'ratio', 'approx_kl' (k3 estimator of KL(pi_old || pi)) and 'advantage'.
  """
  mask, logp, old_logp, adv = _masked_inputs(mask_BxT, logprobs_BxT, old_logprobs_BxT,
                                             advantages_BxT)
  log_ratio = logp - old_logp
  ratio = jnp.exp(log_ratio)
  clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  surrogate = -adv * ratio
  clipped_surrogate = -adv * clipped_ratio
  loss = jnp.maximum(surrogate, clipped_surrogate)
  clipped = clipped_surrogate > surrogate
  if dual_clip is not None:
    bound = -dual_clip * adv
    dual = (adv < 0) & (loss > bound)
    loss = jnp.where(dual, bound, loss)
  else:
    dual = jnp.zeros_like(clipped)
  if is_weights_BxT is not None:
    (weights,) = _masked_inputs(mask, is_weights_BxT)[1:]
    loss = loss * jax.lax.stop_gradient(weights)
  loss_sum = jnp.where(mask > 0, loss, 0.0).sum()
  count = mask.sum()

  def token_sum(x):
    return jax.lax.stop_gradient(jnp.where(mask > 0, x.astype(jnp.float32), 0.0).sum())

  metric_sums = {
      'clip_frac': token_sum(clipped),
      'dual_clip_frac': token_sum(dual),
      'ratio': token_sum(ratio),
      'approx_kl': token_sum(ratio - 1.0 - log_ratio),
      'advantage': token_sum(adv),
  }
  return loss_sum, count, metric_sums


def dis_loss(logprobs_BxT, rollout_logprobs_BxT, advantages_BxT, mask_BxT, *, ratio_low=0.7,
             ratio_high=6.0):
  """SAO's direct double-sided IS: loss_t = -f(rho_t) A_t, f(x) = x on (low, high), else 0.

  rho = pi_theta / pi_rollout with the log-prob stored when the token was sampled. Inside the open
  band the gradient is that of rho A; outside, the token contributes nothing (no gradient at all).
  Defaults are the math setting (0.7, 6.0). Returns (loss_sum, token_count, metric_sums) with
  'masked_frac' and 'ratio'.
  """
  mask, logp, rollout_logp, adv = _masked_inputs(mask_BxT, logprobs_BxT, rollout_logprobs_BxT,
                                                 advantages_BxT)
  ratio = jnp.exp(logp - rollout_logp)
  inside = (ratio > ratio_low) & (ratio < ratio_high)
  loss = jnp.where(inside & (mask > 0), -ratio * adv, 0.0)
  count = mask.sum()

  def token_sum(x):
    return jax.lax.stop_gradient(jnp.where(mask > 0, x.astype(jnp.float32), 0.0).sum())

  return loss.sum(), count, {'masked_frac': token_sum(~inside), 'ratio': token_sum(ratio)}


def finalize_metrics(metric_sums: dict, token_count) -> dict:
  """Token means from accumulated sums (0 when there were no tokens)."""
  denom = jnp.maximum(jnp.asarray(token_count, jnp.float32), 1.0)
  return {k: v / denom for k, v in metric_sums.items()}
