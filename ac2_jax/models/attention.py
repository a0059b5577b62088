"""Attention over a key/value sequence with causal + ragged masking, and its backend dispatch.

One masking rule serves training, prefill and decoding, the Pallas kernels and their references:
`kernels.reference.visible_BxTxS` (a query at absolute position `q_pos` sees key slot `s` iff
`s <= q_pos` and `s < kv_len`, the row's number of valid key slots). Training is the case
`q_pos = arange(T)`, `kv_len = lengths`; decoding appends queries at per-row offsets into a
preallocated cache.

`xla_attention` is the production XLA path: the body of `kernels.reference.attention` (one copy)
with the value matmul in the values' dtype (bf16 in a bf16 run) where the float32 reference the
kernels are tested against upcasts; the two agree to that dtype's precision.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels import reference


def xla_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B):
  """Grouped-query attention in plain jnp (float32 softmax), the `attention_impl='xla'` path."""
  return reference.attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B,
                             value_dtype=v_BxSxKxD.dtype)


def xla_cached_attention(q_BxTxHxD, k_BxKxDxS, v_BxKxSxD, q_pos_BxT, kv_len_B):
  """`xla_attention` over a cache in the XLA path's layout (`qwen3.layer_cache_shapes`): keys
  [B, K, D, S] and values [B, K, S, D]. The queries are moved to [B, K, G*T, D] first, so that
  both matmuls are plain batched matmuls over (B, K) that read the cache where it lies (measured
  on CPU with the T axis left between B and K: XLA copied the cache to another layout at every
  step and ran 10x slower)."""
  B, T, H, D = q_BxTxHxD.shape
  K, S = k_BxKxDxS.shape[1], k_BxKxDxS.shape[3]
  G = H // K
  q_BxKxMxD = q_BxTxHxD.reshape(B, T, K, G, D).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, D)
  scores_BxKxMxS = jnp.einsum('bkmd,bkds->bkms', q_BxKxMxD, k_BxKxDxS,
                              preferred_element_type=jnp.float32) * (D ** -0.5)
  probs_BxKxGxTxS = reference.masked_softmax(scores_BxKxMxS.reshape(B, K, G, T, S),
                                             reference.visible_BxTxS(q_pos_BxT, kv_len_B, S))
  out_BxKxMxD = jnp.einsum('bkms,bksd->bkmd',
                           probs_BxKxGxTxS.reshape(B, K, G * T, S).astype(v_BxKxSxD.dtype),
                           v_BxKxSxD)
  return out_BxKxMxD.reshape(B, K, G, T, D).transpose(0, 3, 1, 2, 4).reshape(B, T, H, D)


def attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B, *, impl: str = 'xla',
              interpret: bool = False, backend: str | None = None):
  """Dispatches to the XLA reference or the Pallas kernels (`kernels/`) of `backend`."""
  if impl == 'xla':
    return xla_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B)
  if impl == 'pallas':
    from kernels import ops  # Imported lazily: the kernels package is only needed on this path.
    return ops.attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B,
                         settings=ops.Settings(interpret=interpret, backend=backend))
  raise ValueError(f'unknown attention_impl {impl!r}')
