"""Flash attention forward and backward `pallas_call`s (training and prefill).

Layout inside the kernels is head-major, `[B, H, T, D]` for queries and `[B, K, S, D]` for keys
and values, with T a multiple of the query block and S a multiple of the key block (`kernels.ops`
transposes and pads). The masking rule arrives folded into one int32 per query,
`last_BxT = min(q_pos, kv_len - 1)`: query t sees key slot s iff `s <= last[t]` (and, for packed
sequences, its segment id equals the slot's); `last = -1` marks a query that sees nothing.

Only the portable Pallas subset is used (BlockSpec + grid, `pl.program_id`, ref slicing with
`pl.ds`, `lax.fori_loop`/`lax.cond`, 2-D dots), so the same kernels lower through Triton on GPU
and Mosaic on TPU. Keys and values of one head are handed to a program whole and walked with a
loop, because a Triton grid has no sequential axis to accumulate over.

The backward never forms the T x S matrix: the dq kernel walks key blocks for one query block,
the dk/dv kernel walks query blocks for one key block. For grouped-query attention the dk/dv
kernel runs per KV head and sees the G query heads of its group as one sequence of G*T rows
(a free reshape of `[B, H, T, D]`), so key/value gradients are summed over the group in-kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Finite stand-in for -inf: keeps exp(m_old - m_new) and the masked max free of inf - inf.
NEG = -1e30

_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def visible(start, last_R, num_slots: int, seg_R=None, seg_C=None) -> jax.Array:
  """[R, C] mask of which key slots `start + c` each query row sees."""
  slots_RxC = start + lax.broadcasted_iota(jnp.int32, (last_R.shape[0], num_slots), 1)
  mask_RxC = slots_RxC <= last_R[:, None]
  if seg_R is not None:
    mask_RxC &= seg_R[:, None] == seg_C[None, :]
  return mask_RxC


def _num_blocks_seen(last_R, block: int, num_blocks: int):
  """Number of leading key blocks any row of the query block can see (0 when none)."""
  return jnp.minimum(lax.div(jnp.max(last_R) + block, jnp.int32(block)), num_blocks)


def _key_block(j, block_k: int, q_QxD, k_ref, v_ref, segk_ref, last_Q, seg_Q, scale: float):
  """Keys, values, scaled scores and visibility of key block j for a block of queries."""
  start = j * block_k
  k_KxD = k_ref[pl.ds(start, block_k), :]
  v_KxD = v_ref[pl.ds(start, block_k), :]
  s_QxK = lax.dot_general(q_QxD, k_KxD, _NT, preferred_element_type=jnp.float32) * scale
  seg_K = None if segk_ref is None else segk_ref[pl.ds(start, block_k)]
  return k_KxD, v_KxD, s_QxK, visible(start, last_Q, block_k, seg_Q, seg_K)


def _forward_kernel(*refs, scale: float, block_k: int, segmented: bool):
  if segmented:
    q_ref, k_ref, v_ref, last_ref, segq_ref, segk_ref, o_ref, lse_ref = refs
    seg_Q = segq_ref[...]
  else:
    q_ref, k_ref, v_ref, last_ref, o_ref, lse_ref = refs
    segk_ref = seg_Q = None
  q_QxD = q_ref[...]
  last_Q = last_ref[...]
  num_q, head_dim = q_QxD.shape

  def body(j, carry):
    acc_QxD, max_Q, sum_Q = carry
    k_KxD, v_KxD, s_QxK, mask_QxK = _key_block(j, block_k, q_QxD, k_ref, v_ref, segk_ref, last_Q,
                                               seg_Q, scale)
    new_max_Q = jnp.maximum(max_Q, jnp.max(jnp.where(mask_QxK, s_QxK, NEG), axis=1))
    p_QxK = jnp.where(mask_QxK, jnp.exp(s_QxK - new_max_Q[:, None]), 0.0)
    rescale_Q = jnp.exp(max_Q - new_max_Q)
    sum_Q = rescale_Q * sum_Q + jnp.sum(p_QxK, axis=1)
    acc_QxD = rescale_Q[:, None] * acc_QxD + jnp.dot(
        p_QxK.astype(v_KxD.dtype), v_KxD, preferred_element_type=jnp.float32)
    return acc_QxD, new_max_Q, sum_Q

  hi = _num_blocks_seen(last_Q, block_k, k_ref.shape[0] // block_k)
  init = (jnp.zeros((num_q, head_dim), jnp.float32), jnp.full((num_q,), NEG, jnp.float32),
          jnp.zeros((num_q,), jnp.float32))
  acc_QxD, max_Q, sum_Q = lax.fori_loop(0, hi, body, init)
  # Rows that see nothing keep acc = 0 and sum = 0: output 0, log-sum-exp 0 (never used).
  safe_sum_Q = jnp.where(sum_Q > 0, sum_Q, 1.0)
  o_ref[...] = (acc_QxD / safe_sum_Q[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(sum_Q > 0, max_Q + jnp.log(safe_sum_Q), 0.0)


def forward(q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, last_BxT, seg_BxT=None, segk_BxS=None, *,
            block_q: int, block_k: int, interpret: bool = False,
            compiler_params: Any = None):
  """Returns (out_BxHxTxD in q's dtype, lse_BxHxT float32)."""
  B, H, T, D = q_BxHxTxD.shape
  K, S = k_BxKxSxD.shape[1], k_BxKxSxD.shape[2]
  G = H // K
  segmented = seg_BxT is not None
  in_specs = [
      pl.BlockSpec((None, None, block_q, D), lambda b, h, i: (b, h, i, 0)),
      pl.BlockSpec((None, None, S, D), lambda b, h, i: (b, h // G, 0, 0)),
      pl.BlockSpec((None, None, S, D), lambda b, h, i: (b, h // G, 0, 0)),
      pl.BlockSpec((None, block_q), lambda b, h, i: (b, i)),
  ]
  args = [q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, last_BxT]
  if segmented:
    in_specs += [pl.BlockSpec((None, block_q), lambda b, h, i: (b, i)),
                 pl.BlockSpec((None, S), lambda b, h, i: (b, 0))]
    args += [seg_BxT, segk_BxS]
  kernel = functools.partial(_forward_kernel, scale=D ** -0.5, block_k=block_k,
                             segmented=segmented)
  return pl.pallas_call(
      kernel,
      grid=(B, H, T // block_q),
      in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, None, block_q, D), lambda b, h, i: (b, h, i, 0)),
                 pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i))],
      out_shape=[jax.ShapeDtypeStruct((B, H, T, D), q_BxHxTxD.dtype),
                 jax.ShapeDtypeStruct((B, H, T), jnp.float32)],
      interpret=interpret,
      compiler_params=compiler_params,
      name='flash_attention_forward',
  )(*args)


def _dq_kernel(*refs, scale: float, block_k: int, segmented: bool):
  if segmented:
    (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, last_ref, segq_ref, segk_ref,
     dq_ref) = refs
    seg_Q = segq_ref[...]
  else:
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, last_ref, dq_ref = refs
    segk_ref = seg_Q = None
  q_QxD = q_ref[...]
  do_QxD = do_ref[...]
  lse_Q = lse_ref[...]
  delta_Q = delta_ref[...]
  last_Q = last_ref[...]

  def body(j, dq_QxD):
    k_KxD, v_KxD, s_QxK, mask_QxK = _key_block(j, block_k, q_QxD, k_ref, v_ref, segk_ref, last_Q,
                                               seg_Q, scale)
    p_QxK = jnp.where(mask_QxK, jnp.exp(s_QxK - lse_Q[:, None]), 0.0)
    dp_QxK = lax.dot_general(do_QxD, v_KxD, _NT, preferred_element_type=jnp.float32)
    ds_QxK = p_QxK * (dp_QxK - delta_Q[:, None])
    return dq_QxD + jnp.dot(ds_QxK.astype(k_KxD.dtype), k_KxD,
                            preferred_element_type=jnp.float32)

  hi = _num_blocks_seen(last_Q, block_k, k_ref.shape[0] // block_k)
  dq_QxD = lax.fori_loop(0, hi, body, jnp.zeros(q_QxD.shape, jnp.float32))
  dq_ref[...] = (dq_QxD * scale).astype(dq_ref.dtype)


def _dkdv_kernel(*refs, scale: float, block_q: int, segmented: bool):
  if segmented:
    (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, last_ref, segq_ref, segk_ref,
     dk_ref, dv_ref) = refs
    seg_K = segk_ref[...]
  else:
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, last_ref, dk_ref, dv_ref = refs
    segq_ref = seg_K = None
  k_KxD = k_ref[...]
  v_KxD = v_ref[...]
  block_k = k_KxD.shape[0]
  start = pl.program_id(2) * block_k

  def body(i, carry):
    rows = pl.ds(i * block_q, block_q)
    last_Q = last_ref[rows]

    def accumulate(carry):
      dk_KxD, dv_KxD = carry
      q_QxD = q_ref[rows, :]
      do_QxD = do_ref[rows, :]
      seg_Q = None if segq_ref is None else segq_ref[rows]
      s_QxK = lax.dot_general(q_QxD, k_KxD, _NT, preferred_element_type=jnp.float32) * scale
      mask_QxK = visible(start, last_Q, block_k, seg_Q, seg_K)
      p_QxK = jnp.where(mask_QxK, jnp.exp(s_QxK - lse_ref[rows][:, None]), 0.0)
      dv_KxD += lax.dot_general(p_QxK.astype(do_QxD.dtype), do_QxD, _TN,
                                preferred_element_type=jnp.float32)
      dp_QxK = lax.dot_general(do_QxD, v_KxD, _NT, preferred_element_type=jnp.float32)
      ds_QxK = p_QxK * (dp_QxK - delta_ref[rows][:, None])
      dk_KxD += lax.dot_general(ds_QxK.astype(q_QxD.dtype), q_QxD, _TN,
                                preferred_element_type=jnp.float32)
      return dk_KxD, dv_KxD

    # Query blocks that see none of this key block (causal upper triangle, padding) are skipped.
    return lax.cond(jnp.max(last_Q) >= start, accumulate, lambda c: c, carry)

  zeros = jnp.zeros(k_KxD.shape, jnp.float32)
  dk_KxD, dv_KxD = lax.fori_loop(0, q_ref.shape[0] // block_q, body, (zeros, zeros))
  dk_ref[...] = (dk_KxD * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv_KxD.astype(dv_ref.dtype)


def backward(q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, last_BxT, seg_BxT, segk_BxS, out_BxHxTxD,
             lse_BxHxT, dout_BxHxTxD, *, block_q: int, block_k: int, interpret: bool = False,
             compiler_params: Any = None):
  """Returns (dq, dk, dv) in the dtypes of q, k, v."""
  B, H, T, D = q_BxHxTxD.shape
  K, S = k_BxKxSxD.shape[1], k_BxKxSxD.shape[2]
  G = H // K
  segmented = seg_BxT is not None
  scale = D ** -0.5
  # delta_t = sum_d dO * O: the row term of the softmax backward, O(T D) so plain jnp.
  delta_BxHxT = jnp.sum(out_BxHxTxD.astype(jnp.float32) * dout_BxHxTxD.astype(jnp.float32), -1)

  q_spec = pl.BlockSpec((None, None, block_q, D), lambda b, h, i: (b, h, i, 0))
  kv_spec = pl.BlockSpec((None, None, S, D), lambda b, h, i: (b, h // G, 0, 0))
  row_spec = pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i))
  last_spec = pl.BlockSpec((None, block_q), lambda b, h, i: (b, i))
  in_specs = [q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec, last_spec]
  args = [q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, dout_BxHxTxD, lse_BxHxT, delta_BxHxT, last_BxT]
  if segmented:
    in_specs += [last_spec, pl.BlockSpec((None, S), lambda b, h, i: (b, 0))]
    args += [seg_BxT, segk_BxS]
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, scale=scale, block_k=block_k, segmented=segmented),
      grid=(B, H, T // block_q),
      in_specs=in_specs,
      out_specs=q_spec,
      out_shape=jax.ShapeDtypeStruct(q_BxHxTxD.shape, q_BxHxTxD.dtype),
      interpret=interpret,
      compiler_params=compiler_params,
      name='flash_attention_dq',
  )(*args)

  # The G query heads of KV head k are rows [k*G*T, (k+1)*G*T) of this view (h = k*G + g).
  GT = G * T
  group_spec = pl.BlockSpec((None, None, GT, D), lambda b, k, j: (b, k, 0, 0))
  group_row_spec = pl.BlockSpec((None, None, GT), lambda b, k, j: (b, k, 0))
  kblock_spec = pl.BlockSpec((None, None, block_k, D), lambda b, k, j: (b, k, j, 0))
  group_last_spec = pl.BlockSpec((None, GT), lambda b, k, j: (b, 0))
  in_specs = [group_spec, kblock_spec, kblock_spec, group_spec, group_row_spec, group_row_spec,
              group_last_spec]
  args = [q_BxHxTxD.reshape(B, K, GT, D), k_BxKxSxD, v_BxKxSxD,
          dout_BxHxTxD.reshape(B, K, GT, D), lse_BxHxT.reshape(B, K, GT),
          delta_BxHxT.reshape(B, K, GT), jnp.tile(last_BxT, (1, G))]
  if segmented:
    in_specs += [group_last_spec, pl.BlockSpec((None, block_k), lambda b, k, j: (b, j))]
    args += [jnp.tile(seg_BxT, (1, G)), segk_BxS]
  dk, dv = pl.pallas_call(
      functools.partial(_dkdv_kernel, scale=scale, block_q=block_q, segmented=segmented),
      grid=(B, K, S // block_k),
      in_specs=in_specs,
      out_specs=[kblock_spec, kblock_spec],
      out_shape=[jax.ShapeDtypeStruct(k_BxKxSxD.shape, k_BxKxSxD.dtype),
                 jax.ShapeDtypeStruct(v_BxKxSxD.shape, v_BxKxSxD.dtype)],
      interpret=interpret,
      compiler_params=compiler_params,
      name='flash_attention_dkdv',
  )(*args)
  return dq, dk, dv
