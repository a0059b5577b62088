"""The sampling distribution: padding ids masked, temperature, top-k and top-p applied to logits,
and draws from it.

The same function serves the decoder and anyone who recomputes the log-probabilities of sampled
tokens from a teacher-forced forward pass, so both see exactly the same distribution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ac2_jax.sampling.settings import SamplingSettings


def sampling_log_probs(logits_BxV: jax.Array, settings: SamplingSettings) -> jax.Array:
  """Float32 log-probabilities of the sampling distribution; -inf outside its support.

  Ids >= `settings.valid_vocab_size` (when set) are outside the support: vocabulary rows the
  tokenizer has no token for. Top-k keeps every token whose tempered logit is at least the k-th
  largest (ties kept); top-p then keeps the most likely tokens until the probability before a
  token reaches `top_p` (so the token that crosses `top_p` is kept). Both cuts are thresholds on
  logit values, so a recomputation on logits equal within rounding gives the same support.
  """
  x_BxV = logits_BxV.astype(jnp.float32) / settings.temperature
  V = x_BxV.shape[-1]
  neg_inf = jnp.float32(-jnp.inf)
  if settings.valid_vocab_size:
    if settings.valid_vocab_size > V:
      raise ValueError(f'SamplingSettings.valid_vocab_size {settings.valid_vocab_size} exceeds the '
                       f"model's {V} vocabulary rows")
    if settings.valid_vocab_size < V:
      x_BxV = jnp.where(jnp.arange(V) < settings.valid_vocab_size, x_BxV, neg_inf)
  top_k = settings.top_k if 0 < settings.top_k < V else 0
  if top_k:
    largest_BxK = jax.lax.top_k(x_BxV, top_k)[0]
    x_BxV = jnp.where(x_BxV >= largest_BxK[..., -1:], x_BxV, neg_inf)
  if settings.top_p < 1.0:
    # Only the top_k largest can survive a top-k cut, so sorting those suffices.
    sorted_BxK = jax.lax.top_k(x_BxV, top_k)[0] if top_k else -jnp.sort(-x_BxV, axis=-1)
    probs_BxK = jax.nn.softmax(sorted_BxK, axis=-1)
    before_BxK = jnp.cumsum(probs_BxK, axis=-1) - probs_BxK
    num_kept_B = jnp.sum(before_BxK < settings.top_p, axis=-1, keepdims=True)
    threshold_B = jnp.take_along_axis(sorted_BxK, num_kept_B - 1, axis=-1)
    x_BxV = jnp.where(x_BxV >= threshold_B, x_BxV, neg_inf)
  return jax.nn.log_softmax(x_BxV, axis=-1)


def entropy(log_probs_BxV: jax.Array) -> jax.Array:
  """Entropy in nats of each distribution given by (possibly -inf) log-probabilities."""
  p_log_p = jnp.where(jnp.isfinite(log_probs_BxV), jnp.exp(log_probs_BxV) * log_probs_BxV, 0.0)
  return -jnp.sum(p_log_p, axis=-1)


def draw(keys_B: jax.Array, log_probs_BxV: jax.Array, greedy: bool) -> jax.Array:
  """One token per row (int32): argmax when greedy, else a draw with that row's own key."""
  if greedy:
    return jnp.argmax(log_probs_BxV, axis=-1).astype(jnp.int32)
  return jax.vmap(jax.random.categorical)(keys_B, log_probs_BxV).astype(jnp.int32)


def token_log_probs(log_probs_BxV: jax.Array, tokens_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(log_probs_BxV, tokens_B[:, None], axis=-1)[:, 0]
