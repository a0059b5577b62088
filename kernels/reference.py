"""Pure-jnp references for the Pallas attention kernels (tests and GPU checks compare to these).

They materialise the full T x S score matrix, so they are only for small shapes.
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


def attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B, segment_ids_BxT=None,
              kv_segment_ids_BxS=None) -> jax.Array:
  """Grouped-query attention with a float32 softmax; output in the dtype of `q`."""
  B, T, H, D = q_BxTxHxD.shape
  S, K = k_BxSxKxD.shape[1], k_BxSxKxD.shape[2]
  if segment_ids_BxT is not None and kv_segment_ids_BxS is None:
    kv_segment_ids_BxS = segment_ids_BxT
  q_BxTxKxGxD = q_BxTxHxD.reshape(B, T, K, H // K, D)
  scores_BxKxGxTxS = jnp.einsum('btkgd,bskd->bkgts', q_BxTxKxGxD, k_BxSxKxD,
                                preferred_element_type=jnp.float32) * (D ** -0.5)
  visible = visible_BxTxS(q_pos_BxT, kv_len_B, S, segment_ids_BxT,
                          kv_segment_ids_BxS)[:, None, None]
  scores_BxKxGxTxS = jnp.where(visible, scores_BxKxGxTxS, -jnp.inf)
  row_max = jnp.max(scores_BxKxGxTxS, axis=-1, keepdims=True)
  row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
  weights = jnp.where(visible, jnp.exp(scores_BxKxGxTxS - jax.lax.stop_gradient(row_max)), 0.0)
  total = jnp.sum(weights, axis=-1, keepdims=True)
  probs = weights / jnp.where(total > 0, total, 1.0)
  out_BxTxKxGxD = jnp.einsum('bkgts,bskd->btkgd', probs, v_BxSxKxD.astype(jnp.float32))
  return out_BxTxKxGxD.reshape(B, T, H, D).astype(q_BxTxHxD.dtype)


def decode_attention(q_BxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_B, kv_len_B) -> jax.Array:
  """One query per row against a KV cache with per-row valid lengths."""
  out_Bx1xHxD = attention(q_BxHxD[:, None], k_BxSxKxD, v_BxSxKxD, q_pos_B[:, None], kv_len_B)
  return out_Bx1xHxD[:, 0]
