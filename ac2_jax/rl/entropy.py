"""Token log-probabilities and entropy of the sampling distribution softmax(logits / temperature).

Both are what the sampler actually draws from: the adaptive entropy control measures H at the
sampling temperature, and the PPO ratio uses log-probs at the same temperature. Computed in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _scaled(logits_BxTxV, temperature):
  if isinstance(temperature, (int, float)) and temperature <= 0:
    raise ValueError(f'temperature must be > 0, got {temperature}')
  return jnp.asarray(logits_BxTxV, jnp.float32) / temperature


def entropy_from_logits(logits_BxTxV, temperature=1.0):
  """H(softmax(logits / temperature)) in nats per position: [..., V] -> [...]."""
  z = _scaled(logits_BxTxV, temperature)
  log_p = jax.nn.log_softmax(z, axis=-1)
  # Logits of -inf (masked vocabulary) have p = 0 and contribute 0, not 0 * -inf.
  return -jnp.where(log_p > -jnp.inf, jnp.exp(log_p) * log_p, 0.0).sum(-1)


def token_logprobs(logits_BxTxV, tokens_BxT, temperature=1.0):
  """log softmax(logits / temperature)[token] per position: [B, T, V], [B, T] -> [B, T]."""
  if jnp.shape(logits_BxTxV)[:-1] != jnp.shape(tokens_BxT):
    raise ValueError(
        f'logits {jnp.shape(logits_BxTxV)} and tokens {jnp.shape(tokens_BxT)} do not match')
  z = _scaled(logits_BxTxV, temperature)
  picked = jnp.take_along_axis(z, jnp.asarray(tokens_BxT)[..., None], axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(z, axis=-1)


def masked_mean(x_BxT, mask_BxT):
  """Mean of x over masked positions (0 if none), e.g. the mean entropy of generated tokens."""
  m = jnp.asarray(mask_BxT, jnp.float32)
  return jnp.where(m > 0, x_BxT, 0.0).sum() / jnp.maximum(m.sum(), 1.0)
