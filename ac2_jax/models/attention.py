"""Attention over a key/value sequence with causal + ragged masking, and its backend dispatch.

One masking rule serves training, prefill and decoding, the Pallas kernels and their references:
`kernels.reference.visible_BxTxS` (a query at absolute position `q_pos` sees key slot `s` iff
`s <= q_pos` and `s < kv_len`, the row's number of valid key slots). Training is the case
`q_pos = arange(T)`, `kv_len = lengths`; decoding appends queries at per-row offsets into a
preallocated cache.

`xla_attention` is the production XLA path, not a second reference: it takes the value matmul in
the values' dtype (bf16 in a bf16 run) where `kernels.reference.attention`, the float32 reference
the kernels are tested against, upcasts; the two agree to that dtype's precision.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.reference import visible_BxTxS


def xla_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B):
  """Grouped-query attention in plain jnp (float32 softmax), the `attention_impl='xla'` path."""
  B, T, H, D = q_BxTxHxD.shape
  S, K = k_BxSxKxD.shape[1], k_BxSxKxD.shape[2]
  G = H // K
  q_BxTxKxGxD = q_BxTxHxD.reshape(B, T, K, G, D)
  scores_BxKxGxTxS = jnp.einsum('btkgd,bskd->bkgts', q_BxTxKxGxD, k_BxSxKxD,
                                preferred_element_type=jnp.float32) * (D ** -0.5)
  mask = visible_BxTxS(q_pos_BxT, kv_len_B, S)[:, None, None, :, :]
  scores_BxKxGxTxS = jnp.where(mask, scores_BxKxGxTxS, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores_BxKxGxTxS, axis=-1)
  # A query with no visible key (only on padded rows) gets a uniform row; zero it for hygiene.
  probs = jnp.where(mask.any(-1, keepdims=True), probs, 0.0)
  out_BxTxKxGxD = jnp.einsum('bkgts,bskd->btkgd', probs.astype(v_BxSxKxD.dtype), v_BxSxKxD)
  return out_BxTxKxGxD.reshape(B, T, H, D)


def attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B, *, impl: str = 'xla',
              interpret: bool = False):
  """Dispatches to the XLA reference or the Pallas kernels (`kernels/`)."""
  if impl == 'xla':
    return xla_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B)
  if impl == 'pallas':
    from kernels import ops  # Imported lazily: the kernels package is only needed on this path.
    return ops.attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B,
                         interpret=interpret)
  raise ValueError(f'unknown attention_impl {impl!r}')
