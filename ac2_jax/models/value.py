"""A value network: the Qwen3 decoder with a scalar head in place of the vocabulary projection.

Its parameter tree is the policy's (`qwen3.py`) without `lm_head`, plus `value_head`
(`kernel` [E], `bias` []): the same names, so the same partition rules shard it, and the body is
initialised from the policy's weights. The head reads the final normed hidden state, so position t
scores the sequence up to and including token t.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ac2_jax.models import qwen3
from ac2_jax.models.config import ModelConfig

HEAD = 'value_head'


def init_value_params(config: ModelConfig, policy_params, key: jax.Array, *,
                      head_std: float = 0.02):
  """A value network initialised from `policy_params` (copied: the two trees share no buffer, so
  donating one never frees the other) with a normal(head_std) head and a zero bias.

  The head is not zero: with a zero kernel no gradient reaches the body in the first update.
  """
  body = {k: jax.tree.map(jnp.copy, v) for k, v in policy_params.items() if k != 'lm_head'}
  dtype = config.jnp_param_dtype
  kernel_E = head_std * jax.random.normal(key, (config.hidden_size,), jnp.float32)
  body[HEAD] = {'kernel': kernel_E.astype(dtype), 'bias': jnp.zeros((), dtype)}
  return body


def value_logits(config: ModelConfig, params, tokens_BxT: jax.Array) -> jax.Array:
  """Float32 head outputs [B, T]: entry t scores tokens_BxT[:, :t + 1] (a causal pass)."""
  body = {k: v for k, v in params.items() if k != HEAD}
  hidden_BxTxE = qwen3.forward(config, body, tokens_BxT, output='hidden')[0]
  head = params[HEAD]
  z_BxT = jnp.einsum('bte,e->bt', hidden_BxTxE.astype(jnp.float32),
                     head['kernel'].astype(jnp.float32))
  return z_BxT + head['bias'].astype(jnp.float32)
