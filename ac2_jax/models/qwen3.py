"""The Qwen3 decoder in Flax (linen), as pure functions over a parameter pytree.

Module names follow the Hugging Face checkpoint (`embed_tokens`, `layers_{i}.self_attn.q_proj`, ...)
so that `checkpoint.py` maps tensors by a fixed rename. Projections keep the head axis explicit
(`q_proj.kernel` is [hidden, heads, head_dim]) so that the `tensor` mesh axis can split heads.

A KV cache is a dict `{'k': [L, ...], 'v': [L, ...]}` of stacked layers, or per layer
`{'k': (L arrays), 'v': (...)}`; `forward` returns the form it was given. Decode loops carry the
per-layer form: restacking the [L, ...] array would copy the whole cache every token. A layer's
arrays are [B, K, D, S] keys and [B, K, S, D] values on the XLA path, [B, S, K, D] both for the
Pallas kernels (`layer_cache_shapes` says why). `forward` appends a block of T tokens to every
row at that row's own offset `cache_lengths_B`; prefill is the case offset 0, decoding the case
T = 1. The caller keeps `offset + T <= S`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ac2_jax.models import attention as attention_lib
from ac2_jax.models.config import ModelConfig


class RMSNorm(nn.Module):
  eps: float
  param_dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return scale.astype(x.dtype) * normed.astype(x.dtype)


def rope(x_BxTxHxD: jax.Array, positions_BxT: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding in the rotate-half layout used by Hugging Face Qwen3."""
  D = x_BxTxHxD.shape[-1]
  inv_freq_F = 1.0 / (theta ** (jnp.arange(0, D, 2, dtype=jnp.float32) / D))
  angles_BxTxF = positions_BxT.astype(jnp.float32)[..., None] * inv_freq_F
  cos = jnp.cos(angles_BxTxF)[:, :, None, :]
  sin = jnp.sin(angles_BxTxF)[:, :, None, :]
  x32 = x_BxTxHxD.astype(jnp.float32)
  x1, x2 = x32[..., : D // 2], x32[..., D // 2:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxHxD.dtype)


def _dense(features, name, config: ModelConfig, axis=-1):
  return nn.DenseGeneral(features=features, axis=axis, use_bias=False, name=name,
                         dtype=config.jnp_dtype, param_dtype=config.jnp_param_dtype,
                         kernel_init=nn.initializers.normal(0.02))


class Attention(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxE, positions_BxT, kv_len_B, layer_cache):
    c = self.config
    q = _dense((c.num_heads, c.head_dim), 'q_proj', c)(x_BxTxE)
    k = _dense((c.num_kv_heads, c.head_dim), 'k_proj', c)(x_BxTxE)
    v = _dense((c.num_kv_heads, c.head_dim), 'v_proj', c)(x_BxTxE)
    q = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name='q_norm')(q)
    k = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name='k_norm')(k)
    q = rope(q, positions_BxT, c.rope_theta)
    k = rope(k, positions_BxT, c.rope_theta)

    if layer_cache is not None and heads_major_cache(c):
      cache_k, cache_v = layer_cache
      offsets_B = positions_BxT[:, 0]
      write_k = jax.vmap(lambda buf, new, o: jax.lax.dynamic_update_slice(buf, new, (0, 0, o)))
      write_v = jax.vmap(lambda buf, new, o: jax.lax.dynamic_update_slice(buf, new, (0, o, 0)))
      keys_BxKxDxS = write_k(cache_k, k.transpose(0, 2, 3, 1).astype(cache_k.dtype), offsets_B)
      values_BxKxSxD = write_v(cache_v, v.transpose(0, 2, 1, 3).astype(cache_v.dtype), offsets_B)
      new_cache = (keys_BxKxDxS, values_BxKxSxD)
      out_BxTxHxD = attention_lib.xla_cached_attention(
          q, keys_BxKxDxS.astype(q.dtype), values_BxKxSxD.astype(q.dtype), positions_BxT,
          kv_len_B)
    else:
      if layer_cache is None:
        keys_BxSxKxD, values_BxSxKxD, new_cache = k, v, None
      else:
        cache_k, cache_v = layer_cache
        offsets_B = positions_BxT[:, 0]
        write = jax.vmap(lambda buf, new, o: jax.lax.dynamic_update_slice(buf, new, (o, 0, 0)))
        keys_BxSxKxD = write(cache_k, k.astype(cache_k.dtype), offsets_B)
        values_BxSxKxD = write(cache_v, v.astype(cache_v.dtype), offsets_B)
        new_cache = (keys_BxSxKxD, values_BxSxKxD)
      out_BxTxHxD = attention_lib.attention(
          q, keys_BxSxKxD.astype(q.dtype), values_BxSxKxD.astype(q.dtype), positions_BxT,
          kv_len_B, impl=c.attention_impl, interpret=c.pallas_interpret,
          backend=c.pallas_backend)
    out_BxTxE = _dense(c.hidden_size, 'o_proj', c, axis=(-2, -1))(out_BxTxHxD)
    return out_BxTxE, new_cache


class MLP(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxE):
    c = self.config
    gate = _dense(c.intermediate_size, 'gate_proj', c)(x_BxTxE)
    up = _dense(c.intermediate_size, 'up_proj', c)(x_BxTxE)
    return _dense(c.hidden_size, 'down_proj', c)(nn.silu(gate) * up)


class Block(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxE, positions_BxT, kv_len_B, layer_cache):
    c = self.config
    h = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name='input_layernorm')(x_BxTxE)
    attn_out, new_cache = Attention(c, name='self_attn')(h, positions_BxT, kv_len_B, layer_cache)
    x_BxTxE = x_BxTxE + attn_out
    h = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name='post_attention_layernorm')(x_BxTxE)
    x_BxTxE = x_BxTxE + MLP(c, name='mlp')(h)
    return x_BxTxE, new_cache


class Decoder(nn.Module):
  """Returns float32 logits [B, T, V] (or the final hidden states) and the updated cache."""
  config: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxT, positions_BxT, kv_len_B, cache=None, output='logits'):
    c = self.config
    embed = nn.Embed(c.vocab_size, c.hidden_size, dtype=c.jnp_dtype,
                     param_dtype=c.jnp_param_dtype, embedding_init=nn.initializers.normal(0.02),
                     name='embed_tokens')
    x_BxTxE = embed(tokens_BxT)
    block_cls = nn.remat(Block) if c.remat else Block
    new_k, new_v = [], []
    # Layers are unrolled rather than scanned: decoding on CPU is ~2x faster this way and the
    # per-layer cache update stays a plain in-place write under donation.
    for i in range(c.num_layers):
      layer_cache = None if cache is None else (cache['k'][i], cache['v'][i])
      x_BxTxE, layer_new = block_cls(c, name=f'layers_{i}')(x_BxTxE, positions_BxT, kv_len_B,
                                                            layer_cache)
      if cache is not None:
        new_k.append(layer_new[0])
        new_v.append(layer_new[1])
    x_BxTxE = RMSNorm(c.rms_norm_eps, c.jnp_param_dtype, name='norm')(x_BxTxE)
    if cache is None:
      new_cache = None
    elif isinstance(cache['k'], (tuple, list)):
      new_cache = {'k': tuple(new_k), 'v': tuple(new_v)}
    else:
      new_cache = {'k': jnp.stack(new_k), 'v': jnp.stack(new_v)}
    if output == 'hidden':
      return x_BxTxE, new_cache
    if c.tie_embeddings:
      logits = embed.attend(x_BxTxE)
    else:
      logits = _dense(c.vocab_size, 'lm_head', c)(x_BxTxE)
    return logits.astype(jnp.float32), new_cache


def init_params(config: ModelConfig, rng: jax.Array):
  """Random parameters (normal(0.02) kernels, unit norms)."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  return Decoder(config).init(rng, tokens, jnp.zeros((1, 1), jnp.int32),
                              jnp.ones((1,), jnp.int32))['params']


def heads_major_cache(config: ModelConfig) -> bool:
  """Whether the KV cache keeps heads before slots (the XLA path) or slots first (Pallas)."""
  return config.attention_impl == 'xla'


def layer_cache_shapes(config: ModelConfig, batch: int, slots: int) -> tuple[tuple, tuple]:
  """Shapes of one layer's (keys, values) cache.

  The XLA path keeps keys as [B, K, D, S] and values as [B, K, S, D]: the orders its two
  attention matmuls read, so a decode step reads the cache in place. With [B, S, K, D] XLA copied
  the whole cache into those orders at every step and layer (measured on CPU: a third of a decode
  step of issue 21's model at batch 64). The Pallas kernels take [B, S, K, D].
  """
  K, D = config.num_kv_heads, config.head_dim
  if heads_major_cache(config):
    return (batch, K, D, slots), (batch, K, slots, D)
  return (batch, slots, K, D), (batch, slots, K, D)


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype=None) -> dict:
  dtype = config.jnp_dtype if dtype is None else dtype
  k_shape, v_shape = layer_cache_shapes(config, batch, max_len)
  L = config.num_layers
  return {'k': jnp.zeros((L, *k_shape), dtype), 'v': jnp.zeros((L, *v_shape), dtype)}


def forward(config: ModelConfig, params, tokens_BxT, *, lengths_B=None, cache=None,
            cache_lengths_B=None, output: str = 'logits'):
  """Runs the decoder on a right-padded block of tokens.

  Args:
    tokens_BxT: int token ids; row b is valid for its first `lengths_B[b]` entries (default all).
    cache: None for a plain causal pass; else a KV cache the block is appended to.
    cache_lengths_B: per-row number of valid cache slots before this block (default zeros).
    output: 'logits' (float32 [B, T, V]) or 'hidden' (final normed hidden states).

  Returns:
    (logits_BxTxV or hidden_BxTxE, new_cache or None).
  """
  B, T = tokens_BxT.shape
  lengths_B = jnp.full((B,), T, jnp.int32) if lengths_B is None else lengths_B.astype(jnp.int32)
  offsets_B = (jnp.zeros((B,), jnp.int32) if cache_lengths_B is None
               else cache_lengths_B.astype(jnp.int32))
  positions_BxT = offsets_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
  kv_len_B = offsets_B + lengths_B
  return Decoder(config).apply({'params': params}, tokens_BxT, positions_BxT, kv_len_B, cache,
                               output)


def head_logits(config: ModelConfig, params, hidden_xE: jax.Array) -> jax.Array:
  """Float32 next-token logits [..., V] from final (normed) hidden states [..., E], as the
  decoder's head computes them: for callers that project only some positions onto the vocabulary."""
  dtype = config.jnp_dtype
  if config.tie_embeddings:
    return jnp.einsum('...e,ve->...v', hidden_xE.astype(dtype),
                      params['embed_tokens']['embedding'].astype(dtype),
                      preferred_element_type=jnp.float32)
  return jnp.einsum('...e,ev->...v', hidden_xE.astype(dtype),
                    params['lm_head']['kernel'].astype(dtype), preferred_element_type=jnp.float32)


def logits(config: ModelConfig, params, tokens_BxT, lengths_B=None) -> jax.Array:
  """Float32 logits [B, T, V] of a causal pass over a (right-padded) batch."""
  return forward(config, params, tokens_BxT, lengths_B=lengths_B)[0]
