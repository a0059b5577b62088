"""A value network: the Qwen3 decoder with a scalar head in place of the vocabulary projection.

Its parameter tree is the policy's (`qwen3.py`) without `lm_head`, plus `value_head`
(`kernel` [E], `bias` []): the same names, so the same partition rules shard it, and the body is
initialised from the policy's weights or from a checkpoint of the policy's architecture
(`BODY_FIELDS`). The head reads the final normed hidden state, so position t scores the sequence up
to and including token t.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ac2_jax.models import qwen3
from ac2_jax.models.config import ModelConfig

HEAD = 'value_head'
# The ModelConfig fields a body checkpoint must share with the policy. The critic runs with the
# policy's ModelConfig (`value_logits`), so other shapes would not load and another rope_theta or
# norm epsilon would run the weights as a network they were not trained as. `tie_embeddings` may
# differ: the body has no vocabulary projection.
BODY_FIELDS = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_layers', 'num_heads',
               'num_kv_heads', 'head_dim', 'rope_theta', 'rms_norm_eps')


def body_differences(policy: ModelConfig, body: ModelConfig,
                     fields: tuple[str, ...] = BODY_FIELDS) -> list[str]:
  """'field BODY_VALUE (policy POLICY_VALUE)' for each of `fields` where the two differ."""
  return [f'{f} {getattr(body, f)!r} (policy {getattr(policy, f)!r})' for f in fields
          if getattr(body, f) != getattr(policy, f)]


def init_value_params(config: ModelConfig, body_params, key: jax.Array, *,
                      head_std: float = 0.02):
  """A value network whose body is `body_params` (the policy's, or a checkpoint's of its
  architecture; copied: the two trees share no buffer, so donating one never frees the other; any
  `lm_head` dropped) with a normal(head_std) head and a zero bias.

  The head is not zero: with a zero kernel no gradient reaches the body in the first update.
  """
  body = {k: jax.tree.map(jnp.copy, v) for k, v in body_params.items() if k != 'lm_head'}
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
