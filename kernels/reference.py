"""Pure-jnp attention: the reference the Pallas kernels are tested against, and (with the value
matmul in the values' dtype) the body of the models' XLA path, `ac2_jax.models.attention`.

They materialise the full T x S score matrix: the kernels exist for the shapes where that is
too large.
Masking rule shared with the kernels: a query at absolute slot position `q_pos` sees key slot
`s` iff `s <= q_pos`, `s < kv_len` and, when segment ids are given, the two segment ids match.
A query that sees no key gets a zero output (and zero gradients).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def visible_BxTxS(q_pos_BxT, kv_len_B, num_slots: int, segment_ids_BxT=None,
                  kv_segment_ids_BxS=None) -> jax.Array:
  slots_S = jnp.arange(num_slots)
  visible = ((slots_S[None, None, :] <= q_pos_BxT[:, :, None])
             & (slots_S[None, None, :] < kv_len_B[:, None, None]))
  if segment_ids_BxT is not None:
    visible &= segment_ids_BxT[:, :, None] == kv_segment_ids_BxS[:, None, :]
  return visible


def masked_softmax(scores_BxKxGxTxS, visible_BxTxS) -> jax.Array:
  """Float32 softmax over the visible key slots; a query that sees no key gets a zero row (and
  zero gradients)."""
  visible = visible_BxTxS[:, None, None]
  scores_BxKxGxTxS = jnp.where(visible, scores_BxKxGxTxS, -jnp.inf)
  row_max = jnp.max(scores_BxKxGxTxS, axis=-1, keepdims=True)
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  weights = jnp.where(visible, jnp.exp(scores_BxKxGxTxS - jax.lax.stop_gradient(row_max)), 0.0)
  total = jnp.sum(weights, axis=-1, keepdims=True)
  return weights / jnp.where(total > 0, total, 1.0)


def attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B, segment_ids_BxT=None,
              kv_segment_ids_BxS=None, *, value_dtype=jnp.float32) -> jax.Array:
  """Grouped-query attention with a float32 softmax; output in the dtype of `q`.

  `value_dtype` is the dtype of the probabilities-times-values matmul: float32 for the reference
  the kernels are tested against; the production XLA path (`ac2_jax.models.attention`) passes the
  values' own dtype (bf16 in a bf16 run), so the two agree to that dtype's precision.
  """
  B, T, H, D = q_BxTxHxD.shape
  S, K = k_BxSxKxD.shape[1], k_BxSxKxD.shape[2]
  if segment_ids_BxT is not None and kv_segment_ids_BxS is None:
    kv_segment_ids_BxS = segment_ids_BxT
  q_BxTxKxGxD = q_BxTxHxD.reshape(B, T, K, H // K, D)
  scores_BxKxGxTxS = jnp.einsum('btkgd,bskd->bkgts', q_BxTxKxGxD, k_BxSxKxD,
                                preferred_element_type=jnp.float32) * (D ** -0.5)
  probs = masked_softmax(scores_BxKxGxTxS, visible_BxTxS(q_pos_BxT, kv_len_B, S, segment_ids_BxT,
                                                         kv_segment_ids_BxS))
  out_BxTxKxGxD = jnp.einsum('bkgts,bskd->btkgd', probs.astype(value_dtype),
                             v_BxSxKxD.astype(value_dtype))
  return out_BxTxKxGxD.reshape(B, T, H, D).astype(q_BxTxHxD.dtype)


def decode_attention(q_BxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_B, kv_len_B) -> jax.Array:
  """One query per row against a KV cache with per-row valid lengths."""
  out_Bx1xHxD = attention(q_BxHxD[:, None], k_BxSxKxD, v_BxSxKxD, q_pos_B[:, None], kv_len_B)
  return out_Bx1xHxD[:, 0]
