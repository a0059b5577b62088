"""Ragged decode attention `pallas_call` for TPU (Mosaic): one query per row against a KV cache.

Same arrays in and out as `kernels.decode_attention`. The cache stays in the model's layout
`[B, S, K, D]` (a decode step must not copy it) and is read through the free reshape
`[B, S*K, D]`: row `s*K + h` is slot s of KV head h. One block is `[block_k*K, D]`, all KV
heads of block_k slots (its last two dims are a multiple of 8 and whole), where a block over one
head (`[block_k, 1, D]`) would break Mosaic's (8, 128) tiling rule. The K*G query heads of a row
are scored against all of it at once, `s^T = cache q^T` of shape `[block_k*K, K*G]`, and a
block-diagonal mask keeps the pairs of the same head: K times the FLOPs of a per-head dot, which
decode (bound by reading the cache, about 2 K G FLOPs per cache element) can afford.

Each row's bound `last_B = min(q_pos, kv_len - 1)` is scalar-prefetched (SMEM): key blocks after
a row's last visible slot are skipped and their index map repeats the last visible block, so a
short row in a long cache issues no DMA for the rest. S need not be a multiple of block_k: the
final block is partial and its rows beyond S are masked (and their values zeroed, as Pallas
leaves them undefined). The cache can be split into `num_splits` ranges on a parallel grid axis;
`kernels.ops` merges the partial results by log-sum-exp.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.flash_attention import NEG
from kernels.tpu import flash_attention as flash_lib

_NT = (((1,), (1,)), ((), ()))  # a @ b.T


def _decode_kernel(last_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, acc_ref, max_ref, sum_ref, *,
                   scale: float, block_k: int, num_kv_heads: int, group: int,
                   blocks_per_split: int):
  b, t = pl.program_id(0), pl.program_id(2)
  K = num_kv_heads

  pl.when(t == 0)(lambda: flash_lib.online_softmax_init(acc_ref, max_ref, sum_ref))

  start = (pl.program_id(1) * blocks_per_split + t) * block_k
  last = last_ref[b]

  @pl.when(start <= last)
  def _step():
    q_RxD = q_ref[...]
    k_CxD, v_CxD = k_ref[...], v_ref[...]
    num_c, num_r = k_CxD.shape[0], q_RxD.shape[0]
    # Rows c < (last - start + 1) * K hold slots start .. last; later rows are unseen (or lie
    # past the cache in the final block, holding undefined values: zero them before the dot).
    seen_rows = (last - start + 1) * K
    c_CxR = lax.broadcasted_iota(jnp.int32, (num_c, num_r), 0)
    r_CxR = lax.broadcasted_iota(jnp.int32, (num_c, num_r), 1)
    mask_CxR = (c_CxR < seen_rows) & (lax.rem(c_CxR, jnp.int32(K)) == lax.div(r_CxR,
                                                                                jnp.int32(group)))
    v_CxD = jnp.where(lax.broadcasted_iota(jnp.int32, v_CxD.shape, 0) < seen_rows, v_CxD, 0)
    s_CxR = lax.dot_general(k_CxD, q_RxD, _NT, preferred_element_type=jnp.float32) * scale
    flash_lib.online_softmax_step(s_CxR, mask_CxR, v_CxD, acc_ref, max_ref, sum_ref)

  @pl.when(t == pl.num_programs(2) - 1)
  def _finish():
    # An empty split reports NEG so that it weighs nothing when the splits are merged.
    flash_lib.online_softmax_finish(acc_ref, max_ref, sum_ref, o_ref, lse_ref, empty_lse=NEG)


def decode(q_BxKxGxD, k_BxSxKxD, v_BxSxKxD, last_B, *, block_k: int, num_splits: int,
           interpret=False):
  """Per-split partial results: (out_BxKxNxGxD float32, lse_BxKxNxG float32), N = num_splits.

  Requires block_k <= S and block_k a multiple of 8.
  """
  B, K, G, D = q_BxKxGxD.shape
  S = k_BxSxKxD.shape[1]
  if block_k > S or block_k % 8:
    raise ValueError(f'TPU decode block_k={block_k} must be a multiple of 8 and <= S={S}')
  R = K * G
  num_blocks = pl.cdiv(S, block_k)
  blocks_per_split = pl.cdiv(num_blocks, num_splits)

  def kv_map(b, n, t, last_ref):
    seen = lax.div(jnp.maximum(last_ref[b], 0), jnp.int32(block_k))
    return b, jnp.minimum(n * blocks_per_split + t, seen), 0

  kv_spec = pl.BlockSpec((None, block_k * K, D), kv_map)
  kernel = functools.partial(_decode_kernel, scale=D ** -0.5, block_k=block_k, num_kv_heads=K,
                             group=G, blocks_per_split=blocks_per_split)
  params = (dict(interpret=interpret) if interpret else dict(
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=('parallel', 'parallel', 'arbitrary'))))
  out_BxNxDxR, lse_BxNx1xR = pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1,
          grid=(B, num_splits, blocks_per_split),
          in_specs=[pl.BlockSpec((None, R, D), lambda b, n, t, m: (b, 0, 0)), kv_spec, kv_spec],
          out_specs=[pl.BlockSpec((None, None, D, R), lambda b, n, t, m: (b, n, 0, 0)),
                     pl.BlockSpec((None, None, 1, R), lambda b, n, t, m: (b, n, 0, 0))],
          scratch_shapes=[pltpu.VMEM((D, R), jnp.float32), pltpu.VMEM((1, R), jnp.float32),
                          pltpu.VMEM((1, R), jnp.float32)]),
      out_shape=[jax.ShapeDtypeStruct((B, num_splits, D, R), jnp.float32),
                 jax.ShapeDtypeStruct((B, num_splits, 1, R), jnp.float32)],
      name='decode_attention_tpu',
      **params,
  )(last_B.astype(jnp.int32), q_BxKxGxD.reshape(B, R, D), k_BxSxKxD.reshape(B, S * K, D),
    v_BxSxKxD.reshape(B, S * K, D))
  out_BxKxNxGxD = jnp.transpose(out_BxNxDxR.reshape(B, num_splits, D, K, G), (0, 3, 1, 4, 2))
  lse_BxKxNxG = jnp.transpose(lse_BxNx1xR.reshape(B, num_splits, K, G), (0, 2, 1, 3))
  return out_BxKxNxGxD, lse_BxKxNxG
