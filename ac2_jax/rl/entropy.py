"""Token log-probabilities and entropy of the sampling distribution softmax(logits / temperature).

Both are what the sampler actually draws from: the adaptive entropy control measures H at the
sampling temperature, and the PPO ratio uses log-probs at the same temperature. Computed in float32.
With `valid_vocab_size` > 0, ids at or past it (embedding rows a padded checkpoint has but the
tokenizer lacks) are outside the support, as the sampler masks them (`sampling.distribution`): the
learner then normalises over the ids the sampler could draw, and an on-policy ratio is 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _scaled(logits_BxTxV, temperature, valid_vocab_size: int = 0):
  """Float32 logits / temperature, -inf at ids >= `valid_vocab_size` (0 = none masked)."""
  if isinstance(temperature, (int, float)) and temperature <= 0:
    raise ValueError(f'temperature must be > 0, got {temperature}')
  z = jnp.asarray(logits_BxTxV, jnp.float32) / temperature
  V = z.shape[-1]
  if valid_vocab_size > V:
    raise ValueError(f'valid_vocab_size {valid_vocab_size} exceeds the {V} vocabulary rows')
  if 0 < valid_vocab_size < V:
    z = jnp.where(jnp.arange(V) < valid_vocab_size, z, -jnp.inf)
  return z


def entropy_from_logits(logits_BxTxV, temperature=1.0, valid_vocab_size: int = 0):
  """H(softmax(logits / temperature)) in nats per position: [..., V] -> [...]."""
  z = _scaled(logits_BxTxV, temperature, valid_vocab_size)
  log_p = jax.nn.log_softmax(z, axis=-1)
  # Logits of -inf (masked vocabulary) have p = 0 and contribute 0, not 0 * -inf.
  return -jnp.where(log_p > -jnp.inf, jnp.exp(log_p) * log_p, 0.0).sum(-1)


def token_logprobs(logits_BxTxV, tokens_BxT, temperature=1.0, valid_vocab_size: int = 0):
  """log softmax(logits / temperature)[token] per position: [B, T, V], [B, T] -> [B, T]."""
  if jnp.shape(logits_BxTxV)[:-1] != jnp.shape(tokens_BxT):
    raise ValueError(
        f'logits {jnp.shape(logits_BxTxV)} and tokens {jnp.shape(tokens_BxT)} do not match')
  z = _scaled(logits_BxTxV, temperature, valid_vocab_size)
  picked = jnp.take_along_axis(z, jnp.asarray(tokens_BxT)[..., None], axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(z, axis=-1)


def masked_mean(x_BxT, mask_BxT):
  """Mean of x over masked positions (0 if none), e.g. the mean entropy of generated tokens."""
  m = jnp.asarray(mask_BxT, jnp.float32)
  return jnp.where(m > 0, x_BxT, 0.0).sum() / jnp.maximum(m.sum(), 1.0)
