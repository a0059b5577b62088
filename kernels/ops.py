"""Differentiable entry points of the Pallas attention kernels, with backend dispatch.

  attention(q, k, v, q_pos, kv_len)        what the model calls: T == 1 -> decode, else flash
  flash_attention(..., segment_ids_BxT)    training / prefill, optionally packed sequences
  decode_attention(q_BxHxD, k, v, ...)     one query per row against a ragged KV cache

Arrays arrive in the model's layout: q `[B, T, H, D]`, k and v `[B, S, K, D]`, H a multiple of
K (query head h reads KV head h // (H / K)). Query t of row b sees key slot s iff
`s <= q_pos[b, t]`, `s < kv_len[b]` and, with segment ids, the two segment ids are equal
(`q_pos` is the slot index of the query, not its RoPE position: packed sequences pass
`arange(T)` and segment ids). A query that sees nothing returns zeros.

Both paths are `custom_vjp`s whose backward runs the flash dq and dk/dv kernels, so no T x S
matrix is ever formed. `Settings.backend` picks the kernels: 'gpu' the portable ones in
`kernels/` (lowered through Triton), 'tpu' those in `kernels/tpu/` (lowered through Mosaic), None
the running backend's. An explicit backend lets a CPU export a GPU or TPU program
(`jax.export(..., platforms=['cuda' | 'tpu'])`). On CPU the kernels run through an interpreter
(`interpret=True`): the GPU kernels through the Pallas interpreter, the TPU kernels through TPU
interpret mode (`pltpu.InterpretParams`, which keeps SMEM/VMEM, scalar prefetch and grid order).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import decode_attention as decode_lib
from kernels import flash_attention as flash_lib
from kernels.tpu import decode_attention as tpu_decode_lib
from kernels.tpu import flash_attention as tpu_flash_lib

# Triton's smallest dot is 16 x 16 x 16; smaller blocks are only useful in interpret mode.
_MIN_BLOCK = 16
# Mosaic: query and key blocks lie on the 128-wide lane dimension; cache blocks on sublanes (8).
_TPU_MIN_BLOCK = 128
_TPU_SUBLANES = 8
# A GPU decode block of keys (and one of values) is at most this many bytes: Triton pipelines the
# cache walk, holding two stages of K and V blocks in shared memory, and an H200 has 227 KiB of
# it; a 256-slot block at D = 128 in bf16 asked for 268 KiB there (session 16).
_GPU_DECODE_TILE_BYTES = 32 * 1024
BACKENDS = ('gpu', 'tpu')


@dataclasses.dataclass(frozen=True)
class Settings:
  """Block sizes and backend knobs (powers of two; clipped to the problem size).

  On TPU the flash blocks are raised to at least 128 (256 or 512 suit long sequences on v5e/v5p
  and later) and the decode block is a multiple of 8 slots; `decode_min_rows`, `num_warps` and
  `num_stages` are GPU-only.
  """

  # 64 x 64 forward blocks ran 1.6x (T = 4k) and 2.0x (T = 16k) faster than 128 x 128 on an
  # H200 at Qwen3-4B heads (BENCHMARKS.md, "Kernels"); TPU raises them to 128.
  block_q: int = 64
  block_k: int = 64
  block_q_bwd: int = 64
  block_k_bwd: int = 64
  decode_block_k: int = 256
  # Programs per (row, KV head) in decode; > 1 helps when batch x KV heads underfills the chip.
  decode_splits: int = 1
  # Query heads per KV head are padded to this many rows in decode (Triton dots need 16).
  decode_min_rows: int = _MIN_BLOCK
  interpret: bool = False
  # 'gpu' (Triton kernels), 'tpu' (Mosaic kernels) or None (those of jax.default_backend()).
  backend: str | None = None
  # Triton launch parameters (GPU only); None lets Pallas choose.
  num_warps: int | None = None
  num_stages: int | None = None

  def __post_init__(self):
    for name in ('block_q', 'block_k', 'block_q_bwd', 'block_k_bwd', 'decode_block_k',
                 'decode_min_rows'):
      value = getattr(self, name)
      if value < 1 or value & (value - 1):
        raise ValueError(f'Settings.{name}={value} must be a positive power of two')
    if self.decode_splits < 1:
      raise ValueError(f'Settings.decode_splits={self.decode_splits} must be >= 1')
    if self.backend is not None and self.backend not in BACKENDS:
      raise ValueError(f"Settings.backend={self.backend!r} must be 'gpu', 'tpu' or None")


def _settings(settings: Settings | None, interpret: bool) -> Settings:
  settings = settings or Settings()
  return dataclasses.replace(settings, interpret=True) if interpret else settings


def backend(settings: Settings) -> str:
  """The kernels a call lowers: the explicit setting, else the running backend's.

  On CPU without a setting only the interpreter can run them: interpret=True keeps the portable
  (GPU) kernels, as the existing CPU tests do; set backend='tpu' for TPU interpret mode.
  """
  if settings.backend is not None:
    return settings.backend
  running = jax.default_backend()
  if running in BACKENDS:
    return running
  if settings.interpret:
    return 'gpu'
  raise ValueError(f'Pallas attention kernels need a GPU or TPU, but the backend is '
                   f'{running!r}; pass interpret=True (ModelConfig.pallas_interpret) on CPU, '
                   f'or Settings(backend=...) to export for another platform')


def _gpu_kwargs(settings: Settings) -> dict:
  """`interpret` / Triton compiler params of the GPU kernels."""
  if settings.interpret:
    return dict(interpret=True)
  from jax.experimental.pallas import triton as pl_triton
  return dict(compiler_params=pl_triton.CompilerParams(num_warps=settings.num_warps,
                                                       num_stages=settings.num_stages))


def _tpu_interpret(settings: Settings):
  """TPU interpret mode on CPU; False lowers through Mosaic (the kernels set their params)."""
  if settings.interpret:
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.InterpretParams()
  return False


def _flash_kernels(settings: Settings):
  """(forward, backward) of the chosen backend, as functions of the same arrays."""
  if backend(settings) == 'tpu':
    kw = dict(interpret=_tpu_interpret(settings))
    return (functools.partial(tpu_flash_lib.forward, **kw),
            functools.partial(tpu_flash_lib.backward, **kw))
  kw = _gpu_kwargs(settings)
  return functools.partial(flash_lib.forward, **kw), functools.partial(flash_lib.backward, **kw)


def _block(block: int, length: int) -> int:
  """The block size actually used for a sequence of `length`: no larger than needed."""
  return min(block, max(_MIN_BLOCK, pl.next_power_of_2(length)))


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _check(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B):
  if q_BxTxHxD.ndim != 4 or k_BxSxKxD.ndim != 4 or v_BxSxKxD.ndim != 4:
    raise ValueError(f'q, k, v must be rank 4 ([B, T, H, D], [B, S, K, D]); got shapes '
                     f'{q_BxTxHxD.shape}, {k_BxSxKxD.shape}, {v_BxSxKxD.shape}')
  B, T, H, D = q_BxTxHxD.shape
  _, S, K, _ = k_BxSxKxD.shape
  if k_BxSxKxD.shape != v_BxSxKxD.shape:
    raise ValueError(f'k shape {k_BxSxKxD.shape} != v shape {v_BxSxKxD.shape}')
  if k_BxSxKxD.shape[0] != B or k_BxSxKxD.shape[3] != D:
    raise ValueError(f'k/v shape {k_BxSxKxD.shape} does not match q shape {q_BxTxHxD.shape} '
                     f'in batch or head_dim')
  if H % K:
    raise ValueError(f'query heads H={H} must be a multiple of KV heads K={K}')
  if q_pos_BxT.shape != (B, T):
    raise ValueError(f'q_pos shape {q_pos_BxT.shape} must be (B, T) = {(B, T)}')
  if kv_len_B.shape != (B,):
    raise ValueError(f'kv_len shape {kv_len_B.shape} must be (B,) = {(B,)}')
  for name, x in (('q_pos', q_pos_BxT), ('kv_len', kv_len_B)):
    if not jnp.issubdtype(x.dtype, jnp.integer):
      raise ValueError(f'{name} must be an integer array, got {x.dtype}')


def _last_visible(q_pos_BxT, kv_len_B, num_slots: int):
  """Folds causality and the valid length into one bound per query: sees s iff s <= last."""
  kv_last_B = jnp.minimum(kv_len_B.astype(jnp.int32), num_slots) - 1
  return jnp.minimum(q_pos_BxT.astype(jnp.int32), kv_last_B[:, None])


# ---- flash (T >= 1, training and prefill) -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _FlashPlan:
  """Static shapes of one flash call: blocks and padded lengths."""

  block_q: int
  block_k: int
  block_q_bwd: int
  block_k_bwd: int
  padded_t: int
  padded_s: int

  @classmethod
  def make(cls, settings: Settings, T: int, S: int) -> '_FlashPlan':
    block = _block
    if backend(settings) == 'tpu':
      block = lambda b, n: max(_TPU_MIN_BLOCK, min(b, pl.next_power_of_2(n)))
    bq, bk = block(settings.block_q, T), block(settings.block_k, S)
    bq_bwd, bk_bwd = block(settings.block_q_bwd, T), block(settings.block_k_bwd, S)
    return cls(bq, bk, bq_bwd, bk_bwd, _round_up(T, max(bq, bq_bwd)),
               _round_up(S, max(bk, bk_bwd)))


def _to_heads_major(x_BxLxNxD, padded: int):
  x_BxNxLxD = jnp.swapaxes(x_BxLxNxD, 1, 2)
  return jnp.pad(x_BxNxLxD, ((0, 0), (0, 0), (0, padded - x_BxNxLxD.shape[2]), (0, 0)))


def _pad_last(x, padded: int, value):
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, padded - x.shape[-1])],
                 constant_values=value)


def _flash_inputs(plan: _FlashPlan, q, k, v, last, seg, segk):
  """Head-major, padded kernel inputs. Padded queries get last = -1 and so see nothing."""
  seg_p = None if seg is None else _pad_last(seg.astype(jnp.int32), plan.padded_t, -1)
  segk_p = None if segk is None else _pad_last(segk.astype(jnp.int32), plan.padded_s, -2)
  return (_to_heads_major(q, plan.padded_t), _to_heads_major(k, plan.padded_s),
          _to_heads_major(v, plan.padded_s), _pad_last(last, plan.padded_t, -1), seg_p, segk_p)


def _flash_grads(plan: _FlashPlan, settings: Settings, inputs, out_p, lse_p, dout_BxTxHxD,
                 q_shape, k_shape):
  T, S = q_shape[1], k_shape[1]
  dq_p, dk_p, dv_p = _flash_kernels(settings)[1](
      *inputs, out_p, lse_p, _to_heads_major(dout_BxTxHxD.astype(out_p.dtype), plan.padded_t),
      block_q=plan.block_q_bwd, block_k=plan.block_k_bwd)
  return (jnp.swapaxes(dq_p[:, :, :T], 1, 2), jnp.swapaxes(dk_p[:, :, :S], 1, 2),
          jnp.swapaxes(dv_p[:, :, :S], 1, 2))


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q, k, v, last, seg, segk, settings):
  return _flash_fwd(q, k, v, last, seg, segk, settings)[0]


def _flash_fwd(q, k, v, last, seg, segk, settings):
  plan = _FlashPlan.make(settings, q.shape[1], k.shape[1])
  inputs = _flash_inputs(plan, q, k, v, last, seg, segk)
  out_p, lse_p = _flash_kernels(settings)[0](*inputs, block_q=plan.block_q,
                                              block_k=plan.block_k)
  out = jnp.swapaxes(out_p[:, :, :q.shape[1]], 1, 2)
  return out, (inputs, out_p, lse_p, q.shape, k.shape)


def _flash_bwd(settings, residuals, dout):
  inputs, out_p, lse_p, q_shape, k_shape = residuals
  plan = _FlashPlan.make(settings, q_shape[1], k_shape[1])
  dq, dk, dv = _flash_grads(plan, settings, inputs, out_p, lse_p, dout, q_shape, k_shape)
  return dq, dk, dv, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def flash_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B, *,
                    segment_ids_BxT=None, kv_segment_ids_BxS=None, interpret: bool = False,
                    settings: Settings | None = None) -> jax.Array:
  """Causal, ragged, grouped-query flash attention; differentiable in q, k, v.

  `kv_segment_ids_BxS` defaults to `segment_ids_BxT` (self-attention over a packed sequence,
  which needs S == T).
  """
  _check(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B)
  B, T = q_pos_BxT.shape
  S = k_BxSxKxD.shape[1]
  if segment_ids_BxT is None and kv_segment_ids_BxS is not None:
    raise ValueError('kv_segment_ids_BxS was given without segment_ids_BxT')
  if segment_ids_BxT is not None:
    if kv_segment_ids_BxS is None:
      if S != T:
        raise ValueError(f'segment_ids_BxT alone needs S == T (got S={S}, T={T}); '
                         f'pass kv_segment_ids_BxS for the keys')
      kv_segment_ids_BxS = segment_ids_BxT
    if segment_ids_BxT.shape != (B, T) or kv_segment_ids_BxS.shape != (B, S):
      raise ValueError(f'segment ids shapes {segment_ids_BxT.shape}, '
                       f'{kv_segment_ids_BxS.shape} must be (B, T) = {(B, T)}, (B, S) = {(B, S)}')
  settings = _settings(settings, interpret)
  backend(settings)  # Fails early, outside any trace, on an unsupported backend.
  last_BxT = _last_visible(q_pos_BxT, kv_len_B, S)
  return _flash(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, last_BxT, segment_ids_BxT,
                kv_segment_ids_BxS, settings)


# ---- decode (T == 1 against a cache) ------------------------------------------------------


def gpu_decode_block_k(settings: Settings, S: int, D: int, itemsize: int) -> int:
  """The GPU decode kernel's block of cache slots.

  The largest power of two no larger than the setting, the cache (the tail block overlaps its
  predecessor) and a shared-memory tile of `_GPU_DECODE_TILE_BYTES`.
  """
  tile = max(_MIN_BLOCK, _GPU_DECODE_TILE_BYTES // (D * itemsize))
  return min(settings.decode_block_k, 1 << (S.bit_length() - 1), 1 << (tile.bit_length() - 1))


def _gpu_decode_partials(q_BxKxGxD, k_BxSxKxD, v_BxSxKxD, last_B, settings: Settings):
  G = q_BxKxGxD.shape[2]
  S = k_BxSxKxD.shape[1]
  rows = max(settings.decode_min_rows, pl.next_power_of_2(G))
  q_BxKxRxD = jnp.pad(q_BxKxGxD, ((0, 0), (0, 0), (0, rows - G), (0, 0)))
  if S < _MIN_BLOCK:  # A tiny cache is padded (cheap) rather than given a sub-dot block.
    pad = ((0, 0), (0, _MIN_BLOCK - S), (0, 0), (0, 0))
    k_BxSxKxD, v_BxSxKxD = jnp.pad(k_BxSxKxD, pad), jnp.pad(v_BxSxKxD, pad)
    S = _MIN_BLOCK
  block_k = gpu_decode_block_k(settings, S, k_BxSxKxD.shape[3], k_BxSxKxD.dtype.itemsize)
  num_splits = min(settings.decode_splits, pl.cdiv(S, block_k))
  return decode_lib.decode(q_BxKxRxD, k_BxSxKxD, v_BxSxKxD, last_B, block_k=block_k,
                           num_splits=num_splits, **_gpu_kwargs(settings))


def _tpu_decode_partials(q_BxKxGxD, k_BxSxKxD, v_BxSxKxD, last_B, settings: Settings):
  S = k_BxSxKxD.shape[1]
  if S < _TPU_SUBLANES:  # A tiny cache is padded (cheap) to one sublane tile of slots.
    pad = ((0, 0), (0, _TPU_SUBLANES - S), (0, 0), (0, 0))
    k_BxSxKxD, v_BxSxKxD = jnp.pad(k_BxSxKxD, pad), jnp.pad(v_BxSxKxD, pad)
    S = _TPU_SUBLANES
  # A multiple of 8 slots no longer than S; a final partial block is masked in the kernel.
  block_k = max(_TPU_SUBLANES, min(settings.decode_block_k, S - S % _TPU_SUBLANES))
  num_splits = min(settings.decode_splits, pl.cdiv(S, block_k))
  return tpu_decode_lib.decode(q_BxKxGxD, k_BxSxKxD, v_BxSxKxD, last_B, block_k=block_k,
                               num_splits=num_splits, interpret=_tpu_interpret(settings))


def _decode_forward(q_BxHxD, k_BxSxKxD, v_BxSxKxD, last_B, settings: Settings):
  """Returns (out_BxHxD in q's dtype, lse_BxH float32)."""
  B, H, D = q_BxHxD.shape
  K = k_BxSxKxD.shape[2]
  G = H // K
  partials = _tpu_decode_partials if backend(settings) == 'tpu' else _gpu_decode_partials
  # R >= G rows per KV head (the GPU kernel pads them); only the first G are kept.
  out_BxKxNxRxD, lse_BxKxNxR = partials(q_BxHxD.reshape(B, K, G, D), k_BxSxKxD, v_BxSxKxD,
                                        last_B, settings)
  # Merge the splits: each holds a softmax over its own slots, weighted by its total mass.
  lse_BxKxR = jax.nn.logsumexp(lse_BxKxNxR, axis=2)
  weight_BxKxNxR = jnp.exp(lse_BxKxNxR - lse_BxKxR[:, :, None])
  out_BxKxRxD = jnp.sum(weight_BxKxNxR[..., None] * out_BxKxNxRxD, axis=2)
  out_BxHxD = out_BxKxRxD[:, :, :G].reshape(B, H, D).astype(q_BxHxD.dtype)
  return out_BxHxD, lse_BxKxR[:, :, :G].reshape(B, H)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _decode(q_BxHxD, k_BxSxKxD, v_BxSxKxD, last_B, settings):
  return _decode_forward(q_BxHxD, k_BxSxKxD, v_BxSxKxD, last_B, settings)[0]


def _decode_fwd(q_BxHxD, k_BxSxKxD, v_BxSxKxD, last_B, settings):
  out_BxHxD, lse_BxH = _decode_forward(q_BxHxD, k_BxSxKxD, v_BxSxKxD, last_B, settings)
  return out_BxHxD, (q_BxHxD, k_BxSxKxD, v_BxSxKxD, last_B, out_BxHxD, lse_BxH)


def _decode_bwd(settings, residuals, dout_BxHxD):
  # Gradients through a decode step are rare (a length-1 training batch): reuse the flash
  # backward kernels with T = 1, which needs the cache transposed once.
  q_BxHxD, k_BxSxKxD, v_BxSxKxD, last_B, out_BxHxD, lse_BxH = residuals
  q_shape, k_shape = (q_BxHxD.shape[0], 1) + q_BxHxD.shape[1:], k_BxSxKxD.shape
  plan = _FlashPlan.make(settings, 1, k_shape[1])
  inputs = _flash_inputs(plan, q_BxHxD[:, None], k_BxSxKxD, v_BxSxKxD, last_B[:, None], None,
                         None)
  out_p = _to_heads_major(out_BxHxD[:, None], plan.padded_t)
  # Rows that see nothing carry a meaningless lse; their probabilities are masked to zero.
  lse_p = _pad_last(lse_BxH[:, :, None], plan.padded_t, 0.0)
  dq, dk, dv = _flash_grads(plan, settings, inputs, out_p, lse_p, dout_BxHxD[:, None], q_shape,
                            k_shape)
  return dq[:, 0], dk, dv, None


_decode.defvjp(_decode_fwd, _decode_bwd)


def decode_attention(q_BxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_B, kv_len_B, *,
                     interpret: bool = False, settings: Settings | None = None) -> jax.Array:
  """One query per row (at slot q_pos_B) against a cache with kv_len_B valid slots per row."""
  _check(q_BxHxD[:, None], k_BxSxKxD, v_BxSxKxD, q_pos_B[:, None], kv_len_B)
  settings = _settings(settings, interpret)
  backend(settings)
  last_B = _last_visible(q_pos_B[:, None], kv_len_B, k_BxSxKxD.shape[1])[:, 0]
  return _decode(q_BxHxD, k_BxSxKxD, v_BxSxKxD, last_B, settings)


def attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B, *,
              interpret: bool = False, settings: Settings | None = None) -> jax.Array:
  """The model's entry point: a single query step runs the decode kernel, longer blocks flash."""
  if q_BxTxHxD.ndim == 4 and q_BxTxHxD.shape[1] == 1:
    return decode_attention(q_BxTxHxD[:, 0], k_BxSxKxD, v_BxSxKxD, q_pos_BxT[:, 0], kv_len_B,
                            interpret=interpret, settings=settings)[:, None]
  return flash_attention(q_BxTxHxD, k_BxSxKxD, v_BxSxKxD, q_pos_BxT, kv_len_B,
                         interpret=interpret, settings=settings)
