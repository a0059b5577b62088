"""Ragged decode attention `pallas_call`: one new query per row against a KV cache.

The cache stays in the model's layout `[B, S, K, D]` (a decode step must not copy it); each
program reads one KV head of one row through a BlockSpec that squeezes the head axis. The G
query heads of that KV head are the rows of one small matmul (padded by `kernels.ops` to at
least 16 rows, the smallest Triton dot). Each row stops walking the cache at its own last
visible slot `last_B = min(q_pos, kv_len - 1)`, so short rows cost little in a long cache.

S need not be a multiple of the key block: the final block is shifted back to end at S and the
slots an earlier block already covered are masked, so no read leaves the cache and nothing is
padded. The cache can be split into `num_splits` ranges handled by separate programs (more
parallel work when B x K is small); `kernels.ops` merges the partial results by log-sum-exp.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels.flash_attention import NEG, visible

_NT = (((1,), (1,)), ((), ()))


def _decode_kernel(q_ref, k_ref, v_ref, last_ref, o_ref, lse_ref, *, scale: float,
                   block_k: int, blocks_per_split: int):
  q_GxD = q_ref[...]
  last = last_ref[...]
  num_slots = k_ref.shape[0]
  num_g = q_GxD.shape[0]
  last_G = jnp.full((num_g,), last, jnp.int32)

  def body(j, carry):
    acc_GxD, max_G, sum_G = carry
    nominal = j * block_k
    start = jnp.minimum(nominal, num_slots - block_k)
    k_KxD = k_ref[pl.ds(start, block_k), :]
    v_KxD = v_ref[pl.ds(start, block_k), :]
    s_GxK = lax.dot_general(q_GxD, k_KxD, _NT, preferred_element_type=jnp.float32) * scale
    fresh_K = start + lax.broadcasted_iota(jnp.int32, (num_g, block_k), 1) >= nominal
    mask_GxK = visible(start, last_G, block_k) & fresh_K
    new_max_G = jnp.maximum(max_G, jnp.max(jnp.where(mask_GxK, s_GxK, NEG), axis=1))
    p_GxK = jnp.where(mask_GxK, jnp.exp(s_GxK - new_max_G[:, None]), 0.0)
    rescale_G = jnp.exp(max_G - new_max_G)
    sum_G = rescale_G * sum_G + jnp.sum(p_GxK, axis=1)
    acc_GxD = rescale_G[:, None] * acc_GxD + jnp.dot(
        p_GxK.astype(v_KxD.dtype), v_KxD, preferred_element_type=jnp.float32)
    return acc_GxD, new_max_G, sum_G

  lo = pl.program_id(2) * blocks_per_split
  hi = jnp.minimum(lo + blocks_per_split, lax.div(last + block_k, jnp.int32(block_k)))
  init = (jnp.zeros(q_GxD.shape, jnp.float32), jnp.full((num_g,), NEG, jnp.float32),
          jnp.zeros((num_g,), jnp.float32))
  acc_GxD, max_G, sum_G = lax.fori_loop(lo, hi, body, init)
  safe_sum_G = jnp.where(sum_G > 0, sum_G, 1.0)
  o_ref[...] = acc_GxD / safe_sum_G[:, None]
  # An empty split reports NEG so that it weighs nothing when the splits are merged.
  lse_ref[...] = jnp.where(sum_G > 0, max_G + jnp.log(safe_sum_G), NEG)


def decode(q_BxKxGxD, k_BxSxKxD, v_BxSxKxD, last_B, *, block_k: int, num_splits: int,
           interpret: bool = False, compiler_params: Any = None):
  """Per-split partial results: (out_BxKxNxGxD float32, lse_BxKxNxG float32), N = num_splits.

  Requires block_k <= S; splits beyond the last visible block come back empty (lse = NEG).
  """
  B, K, G, D = q_BxKxGxD.shape
  S = k_BxSxKxD.shape[1]
  if block_k > S:
    raise ValueError(f'decode block_k={block_k} exceeds the cache length {S}')
  blocks_per_split = pl.cdiv(pl.cdiv(S, block_k), num_splits)
  kv_spec = pl.BlockSpec((None, S, None, D), lambda b, k, n: (b, 0, k, 0))
  kernel = functools.partial(_decode_kernel, scale=D ** -0.5, block_k=block_k,
                             blocks_per_split=blocks_per_split)
  return pl.pallas_call(
      kernel,
      grid=(B, K, num_splits),
      in_specs=[pl.BlockSpec((None, None, G, D), lambda b, k, n: (b, k, 0, 0)),
                kv_spec, kv_spec,
                pl.BlockSpec((None,), lambda b, k, n: (b,))],
      out_specs=[pl.BlockSpec((None, None, None, G, D), lambda b, k, n: (b, k, n, 0, 0)),
                 pl.BlockSpec((None, None, None, G), lambda b, k, n: (b, k, n, 0))],
      out_shape=[jax.ShapeDtypeStruct((B, K, num_splits, G, D), jnp.float32),
                 jax.ShapeDtypeStruct((B, K, num_splits, G), jnp.float32)],
      interpret=interpret,
      compiler_params=compiler_params,
      name='decode_attention',
  )(q_BxKxGxD, k_BxSxKxD, v_BxSxKxD, last_B)
