"""Flash attention forward, dq and dk/dv `pallas_call`s for TPU (Mosaic).

Same arrays in and out as `kernels.flash_attention` (head-major `[B, H, T, D]` queries, `[B, K,
S, D]` keys and values, T and S padded to the blocks by `kernels.ops`, one bound per query
`last_BxT`: query t sees slot s iff `s <= last[t]`), laid out the way Mosaic tiles them:

- Keys are walked on a sequential grid axis (`'arbitrary'`), one `[block_k, D]` block per step,
  with the running max, sum and accumulator in VMEM scratch, instead of a whole head per program.
- Scores are computed transposed, `s^T = k q^T` of shape `[block_k, block_q]`, so every
  per-query value (the bound `last`, the segment id, log-sum-exp, the row term `delta`) is a
  lane row `[1, block_q]` of an array laid out `[B, (H,) 1, T]`: its block's last two dims are
  (1, block_q), whole and a multiple of 128. The forward accumulates `o^T` and the dq kernel
  `dq^T` (`[D, block_q]`), written to `[B, H, D, T]` and transposed back outside the kernel.
  Key segment ids, per sublane, arrive broadcast over 128 lanes (`[B, S, 128]`).
- The number of key blocks each query block sees is scalar-prefetched (SMEM): invisible key
  blocks are skipped, and their index map repeats the previous block so no DMA is issued.

block_q and block_k must be multiples of 128 (the lane dimension); `kernels.ops` chooses them.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.flash_attention import NEG

LANES = 128
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def max_last(last_BxT, block_q: int):
  """[B, T // block_q] int32: the largest bound in each query block (scalar prefetch)."""
  B, T = last_BxT.shape
  return jnp.max(last_BxT.reshape(B, T // block_q, block_q), axis=-1)


def _visible_T(start, last_1xQ, block_k: int, segq_1xQ=None, segk_Kx1=None):
  """[block_k, block_q] mask: key slot start + r is seen by query column c."""
  slots_KxQ = start + lax.broadcasted_iota(jnp.int32, (block_k, last_1xQ.shape[1]), 0)
  mask_KxQ = slots_KxQ <= last_1xQ
  if segq_1xQ is not None:
    mask_KxQ &= segk_Kx1 == segq_1xQ
  return mask_KxQ


def _rows(seg_BxT, segk_BxS):
  """Segment ids in the kernels' layouts: query ids as rows, key ids broadcast over lanes."""
  if seg_BxT is None:
    return None, None
  B, S = segk_BxS.shape
  return seg_BxT[:, None, :], jnp.broadcast_to(segk_BxS[:, :, None], (B, S, LANES))


def _params(interpret, semantics):
  if interpret:
    return dict(interpret=interpret)
  return dict(compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))


_SEMANTICS = ('parallel', 'parallel', 'parallel', 'arbitrary')


def online_softmax_init(acc_ref, max_ref, sum_ref):
  acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
  max_ref[...] = jnp.full(max_ref.shape, NEG, jnp.float32)
  sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)


def online_softmax_step(s_KxQ, mask_KxQ, v_KxD, acc_ref, max_ref, sum_ref):
  """Folds one key block into the running max and sum (`[1, Q]`) and `acc^T = v^T p` (`[D, Q]`)."""
  max_1xQ = max_ref[...]
  new_max_1xQ = jnp.maximum(
      max_1xQ, jnp.max(jnp.where(mask_KxQ, s_KxQ, NEG), axis=0, keepdims=True))
  p_KxQ = jnp.where(mask_KxQ, jnp.exp(s_KxQ - new_max_1xQ), 0.0)
  rescale_1xQ = jnp.exp(max_1xQ - new_max_1xQ)
  sum_ref[...] = rescale_1xQ * sum_ref[...] + jnp.sum(p_KxQ, axis=0, keepdims=True)
  acc_ref[...] = rescale_1xQ * acc_ref[...] + lax.dot_general(
      v_KxD, p_KxQ.astype(v_KxD.dtype), _TN, preferred_element_type=jnp.float32)
  max_ref[...] = new_max_1xQ


def online_softmax_finish(acc_ref, max_ref, sum_ref, o_ref, lse_ref, *, empty_lse: float):
  """Writes `o^T = acc^T / sum` and the log-sum-exp; columns that saw nothing get 0 and
  `empty_lse`."""
  sum_1xQ = sum_ref[...]
  safe_1xQ = jnp.where(sum_1xQ > 0, sum_1xQ, 1.0)
  o_ref[...] = (acc_ref[...] / safe_1xQ).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(sum_1xQ > 0, max_ref[...] + jnp.log(safe_1xQ), empty_lse)


def _forward_kernel(maxlast_ref, q_ref, k_ref, v_ref, last_ref, *refs, scale: float,
                    block_k: int, segmented: bool):
  if segmented:
    segq_ref, segk_ref, o_ref, lse_ref, acc_ref, max_ref, sum_ref = refs
  else:
    o_ref, lse_ref, acc_ref, max_ref, sum_ref = refs
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

  pl.when(j == 0)(lambda: online_softmax_init(acc_ref, max_ref, sum_ref))

  start = j * block_k

  @pl.when(start <= maxlast_ref[b, i])
  def _step():
    k_KxD, v_KxD = k_ref[...], v_ref[...]
    s_KxQ = lax.dot_general(k_KxD, q_ref[...], _NT, preferred_element_type=jnp.float32) * scale
    mask_KxQ = _visible_T(start, last_ref[...], block_k,
                          segq_ref[...] if segmented else None,
                          segk_ref[:, :1] if segmented else None)
    online_softmax_step(s_KxQ, mask_KxQ, v_KxD, acc_ref, max_ref, sum_ref)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    # Queries that see nothing: output 0, log-sum-exp 0 (never used), as on GPU.
    online_softmax_finish(acc_ref, max_ref, sum_ref, o_ref, lse_ref, empty_lse=0.0)


def _seen_block(b, i, j, maxlast_ref, block_k: int):
  """Key block to fetch at step j: j itself, or the last visible one once past it (no DMA)."""
  return jnp.minimum(j, lax.div(jnp.maximum(maxlast_ref[b, i], 0), jnp.int32(block_k)))


def forward(q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, last_BxT, seg_BxT=None, segk_BxS=None, *,
            block_q: int, block_k: int, interpret=False):
  """Returns (out_BxHxTxD in q's dtype, lse_BxHxT float32)."""
  B, H, T, D = q_BxHxTxD.shape
  K, S = k_BxKxSxD.shape[1], k_BxKxSxD.shape[2]
  G = H // K
  segmented = seg_BxT is not None
  kv_map = lambda b, h, i, j, m: (b, lax.div(h, jnp.int32(G)), _seen_block(b, i, j, m, block_k), 0)
  row_map = lambda b, h, i, j, m: (b, 0, i)
  in_specs = [pl.BlockSpec((None, None, block_q, D), lambda b, h, i, j, m: (b, h, i, 0)),
              pl.BlockSpec((None, None, block_k, D), kv_map),
              pl.BlockSpec((None, None, block_k, D), kv_map),
              pl.BlockSpec((None, 1, block_q), row_map)]
  args = [q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, last_BxT[:, None, :]]
  if segmented:
    in_specs += [pl.BlockSpec((None, 1, block_q), row_map),
                 pl.BlockSpec((None, block_k, LANES),
                              lambda b, h, i, j, m: (b, _seen_block(b, i, j, m, block_k), 0))]
    args += list(_rows(seg_BxT, segk_BxS))
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1,
      grid=(B, H, T // block_q, S // block_k),
      in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, None, D, block_q), lambda b, h, i, j, m: (b, h, 0, i)),
                 pl.BlockSpec((None, None, 1, block_q), lambda b, h, i, j, m: (b, h, 0, i))],
      scratch_shapes=[pltpu.VMEM((D, block_q), jnp.float32),
                      pltpu.VMEM((1, block_q), jnp.float32),
                      pltpu.VMEM((1, block_q), jnp.float32)])
  out_BxHxDxT, lse_BxHx1xT = pl.pallas_call(
      functools.partial(_forward_kernel, scale=D ** -0.5, block_k=block_k, segmented=segmented),
      grid_spec=grid_spec,
      out_shape=[jax.ShapeDtypeStruct((B, H, D, T), q_BxHxTxD.dtype),
                 jax.ShapeDtypeStruct((B, H, 1, T), jnp.float32)],
      name='flash_attention_forward_tpu',
      **_params(interpret, _SEMANTICS),
  )(max_last(last_BxT, block_q), *args)
  return jnp.swapaxes(out_BxHxDxT, 2, 3), lse_BxHx1xT[:, :, 0]


def _probs_T(k_KxD, q_QxD, lse_1xQ, mask_KxQ, scale: float):
  s_KxQ = lax.dot_general(k_KxD, q_QxD, _NT, preferred_element_type=jnp.float32) * scale
  return jnp.where(mask_KxQ, jnp.exp(s_KxQ - lse_1xQ), 0.0)


def _dq_kernel(maxlast_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, last_ref, *refs,
               scale: float, block_k: int, segmented: bool):
  if segmented:
    segq_ref, segk_ref, dq_ref, acc_ref = refs
  else:
    dq_ref, acc_ref = refs
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  start = j * block_k

  @pl.when(start <= maxlast_ref[b, i])
  def _step():
    k_KxD = k_ref[...]
    mask_KxQ = _visible_T(start, last_ref[...], block_k,
                          segq_ref[...] if segmented else None,
                          segk_ref[:, :1] if segmented else None)
    p_KxQ = _probs_T(k_KxD, q_ref[...], lse_ref[...], mask_KxQ, scale)
    dp_KxQ = lax.dot_general(v_ref[...], do_ref[...], _NT, preferred_element_type=jnp.float32)
    ds_KxQ = p_KxQ * (dp_KxQ - delta_ref[...])
    acc_ref[...] += lax.dot_general(k_KxD, ds_KxQ.astype(k_KxD.dtype), _TN,
                                    preferred_element_type=jnp.float32)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    dq_ref[...] = (acc_ref[...] * scale).astype(dq_ref.dtype)


def _dkdv_kernel(maxlast_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, last_ref, *refs,
                 scale: float, block_k: int, num_q_blocks: int, segmented: bool):
  if segmented:
    segq_ref, segk_ref, dk_ref, dv_ref, dk_acc_ref, dv_acc_ref = refs
  else:
    dk_ref, dv_ref, dk_acc_ref, dv_acc_ref = refs
  b, j, r = pl.program_id(0), pl.program_id(2), pl.program_id(3)

  @pl.when(r == 0)
  def _init():
    dk_acc_ref[...] = jnp.zeros(dk_acc_ref.shape, jnp.float32)
    dv_acc_ref[...] = jnp.zeros(dv_acc_ref.shape, jnp.float32)

  start = j * block_k

  # Query blocks that see none of this key block (causal upper triangle, padding) are skipped.
  @pl.when(maxlast_ref[b, lax.rem(r, jnp.int32(num_q_blocks))] >= start)
  def _step():
    q_QxD, do_QxD, v_KxD = q_ref[...], do_ref[...], v_ref[...]
    mask_KxQ = _visible_T(start, last_ref[...], block_k,
                          segq_ref[...] if segmented else None,
                          segk_ref[:, :1] if segmented else None)
    p_KxQ = _probs_T(k_ref[...], q_QxD, lse_ref[...], mask_KxQ, scale)
    dv_acc_ref[...] += jnp.dot(p_KxQ.astype(do_QxD.dtype), do_QxD,
                               preferred_element_type=jnp.float32)
    dp_KxQ = lax.dot_general(v_KxD, do_QxD, _NT, preferred_element_type=jnp.float32)
    ds_KxQ = p_KxQ * (dp_KxQ - delta_ref[...])
    dk_acc_ref[...] += jnp.dot(ds_KxQ.astype(q_QxD.dtype), q_QxD,
                               preferred_element_type=jnp.float32)

  @pl.when(r == pl.num_programs(3) - 1)
  def _finish():
    dk_ref[...] = (dk_acc_ref[...] * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_acc_ref[...].astype(dv_ref.dtype)


def backward(q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, last_BxT, seg_BxT, segk_BxS, out_BxHxTxD,
             lse_BxHxT, dout_BxHxTxD, *, block_q: int, block_k: int, interpret=False):
  """Returns (dq, dk, dv) in the dtypes of q, k, v."""
  B, H, T, D = q_BxHxTxD.shape
  K, S = k_BxKxSxD.shape[1], k_BxKxSxD.shape[2]
  G = H // K
  nq, nk = T // block_q, S // block_k
  segmented = seg_BxT is not None
  scale = D ** -0.5
  # delta_t = sum_d dO * O: the row term of the softmax backward, O(T D) so plain jnp.
  delta_BxHx1xT = jnp.sum(out_BxHxTxD.astype(jnp.float32) * dout_BxHxTxD.astype(jnp.float32),
                          -1)[:, :, None, :]
  lse_BxHx1xT = lse_BxHxT[:, :, None, :]
  maxlast_BxNq = max_last(last_BxT, block_q)
  segq_Bx1xT, segk_BxSxL = _rows(seg_BxT, segk_BxS)
  kernel_kw = dict(scale=scale, block_k=block_k, segmented=segmented)

  # dq: grid (b, h, query block i, key block j), j sequential.
  q_spec = pl.BlockSpec((None, None, block_q, D), lambda b, h, i, j, m: (b, h, i, 0))
  kv_map = lambda b, h, i, j, m: (b, lax.div(h, jnp.int32(G)), _seen_block(b, i, j, m, block_k), 0)
  kv_spec = pl.BlockSpec((None, None, block_k, D), kv_map)
  head_row_spec = pl.BlockSpec((None, None, 1, block_q), lambda b, h, i, j, m: (b, h, 0, i))
  row_spec = pl.BlockSpec((None, 1, block_q), lambda b, h, i, j, m: (b, 0, i))
  in_specs = [q_spec, kv_spec, kv_spec, q_spec, head_row_spec, head_row_spec, row_spec]
  args = [q_BxHxTxD, k_BxKxSxD, v_BxKxSxD, dout_BxHxTxD, lse_BxHx1xT, delta_BxHx1xT,
          last_BxT[:, None, :]]
  if segmented:
    in_specs += [row_spec, pl.BlockSpec(
        (None, block_k, LANES), lambda b, h, i, j, m: (b, _seen_block(b, i, j, m, block_k), 0))]
    args += [segq_Bx1xT, segk_BxSxL]
  dq_BxHxDxT = pl.pallas_call(
      functools.partial(_dq_kernel, **kernel_kw),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(B, H, nq, nk), in_specs=in_specs,
          out_specs=pl.BlockSpec((None, None, D, block_q), lambda b, h, i, j, m: (b, h, 0, i)),
          scratch_shapes=[pltpu.VMEM((D, block_q), jnp.float32)]),
      out_shape=jax.ShapeDtypeStruct((B, H, D, T), q_BxHxTxD.dtype),
      name='flash_attention_dq_tpu',
      **_params(interpret, _SEMANTICS),
  )(maxlast_BxNq, *args)

  # dk/dv: grid (b, KV head k, key block j, r) with r walking the G query heads of the group
  # and their query blocks in sequence (h = k*G + r // nq, query block r % nq).
  head = lambda k, r: k * G + lax.div(r, jnp.int32(nq))
  qblock = lambda r: lax.rem(r, jnp.int32(nq))
  q_spec = pl.BlockSpec((None, None, block_q, D),
                        lambda b, k, j, r, m: (b, head(k, r), qblock(r), 0))
  kv_spec = pl.BlockSpec((None, None, block_k, D), lambda b, k, j, r, m: (b, k, j, 0))
  head_row_spec = pl.BlockSpec((None, None, 1, block_q),
                               lambda b, k, j, r, m: (b, head(k, r), 0, qblock(r)))
  row_spec = pl.BlockSpec((None, 1, block_q), lambda b, k, j, r, m: (b, 0, qblock(r)))
  in_specs = [q_spec, kv_spec, kv_spec, q_spec, head_row_spec, head_row_spec, row_spec]
  if segmented:
    in_specs += [row_spec,
                 pl.BlockSpec((None, block_k, LANES), lambda b, k, j, r, m: (b, j, 0))]
  dk, dv = pl.pallas_call(
      functools.partial(_dkdv_kernel, num_q_blocks=nq, **kernel_kw),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(B, K, nk, G * nq), in_specs=in_specs,
          out_specs=[kv_spec, kv_spec],
          scratch_shapes=[pltpu.VMEM((block_k, D), jnp.float32),
                          pltpu.VMEM((block_k, D), jnp.float32)]),
      out_shape=[jax.ShapeDtypeStruct(k_BxKxSxD.shape, k_BxKxSxD.dtype),
                 jax.ShapeDtypeStruct(v_BxKxSxD.shape, v_BxKxSxD.dtype)],
      name='flash_attention_dkdv_tpu',
      **_params(interpret, _SEMANTICS),
  )(maxlast_BxNq, *args)
  return jnp.swapaxes(dq_BxHxDxT, 2, 3), dk, dv
