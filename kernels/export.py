"""Cross-platform export of the kernels: checks their GPU (Triton) and TPU (Mosaic) lowering from
any machine, a CPU included.

`jax.export` with `platforms=['tpu']` runs the whole Pallas -> Mosaic lowering (block shapes,
tiling rules, scalar prefetch, the kernel body) and `platforms=['cuda']` the Pallas -> Triton
one; neither needs the accelerator. What it cannot check is the backend compiler behind them
(Mosaic's layout passes in libtpu, ptxas), which runs when the exported program is compiled on
the device. `tests/test_kernels_export.py` and `scripts/check_kernel_exports.py` call this.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kernels import ops

# jax.export platform -> the kernels it runs (`Settings.backend`).
BACKEND_OF = {'tpu': 'tpu', 'cuda': 'gpu'}
# The custom call each platform's Pallas kernels lower to.
KERNEL_CALL = {'tpu': 'tpu_custom_call', 'cuda': '__gpu$xla.gpu.triton'}
_DISABLED = {'tpu': (), 'cuda': (jax.export.DisabledSafetyCheck.custom_call(KERNEL_CALL['cuda']),)}


def export(fn, platform: str, *args) -> jax.export.Exported:
  """Exports `jax.jit(fn)` at `args` (arrays or `jax.ShapeDtypeStruct`s) for `platform`."""
  return jax.export.export(jax.jit(fn), platforms=[platform],
                           disabled_checks=list(_DISABLED[platform]))(*args)


def kernel_calls(exported: jax.export.Exported, platform: str) -> int:
  """How many Pallas kernels the exported program launches."""
  return exported.mlir_module().count(KERNEL_CALL[platform])


def settings_for(platform: str, settings: ops.Settings | None = None) -> ops.Settings:
  return dataclasses.replace(settings or ops.Settings(), backend=BACKEND_OF[platform],
                             interpret=False)


@dataclasses.dataclass(frozen=True)
class Shape:
  """One attention problem: B rows, T queries against S key slots, H query and K KV heads."""

  B: int
  T: int
  S: int
  H: int
  K: int
  D: int
  dtype: str = 'bfloat16'
  segments: bool = False

  def __str__(self):
    seg = '_segments' if self.segments else ''
    return (f'B{self.B}_T{self.T}_S{self.S}_gqa{self.H // self.K}_D{self.D}_'
            f'{jnp.dtype(self.dtype).name}{seg}')


def _struct(shape, dtype):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def flash_program(shape: Shape, settings: ops.Settings):
  """(fn, args): the flash output and its gradients in q, k, v (forward, dq and dk/dv kernels)."""
  s = shape

  def fn(q, k, v, q_pos, kv_len, *seg):
    def loss(q, k, v):
      out = ops.flash_attention(q, k, v, q_pos, kv_len, segment_ids_BxT=seg[0] if seg else None,
                                settings=settings)
      return jnp.sum(out.astype(jnp.float32)), out
    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return out, grads

  args = [_struct((s.B, s.T, s.H, s.D), s.dtype), _struct((s.B, s.S, s.K, s.D), s.dtype),
          _struct((s.B, s.S, s.K, s.D), s.dtype), _struct((s.B, s.T), jnp.int32),
          _struct((s.B,), jnp.int32)]
  if s.segments:
    if s.S != s.T:
      raise ValueError(f'packed segments need S == T, got {s}')
    args.append(_struct((s.B, s.T), jnp.int32))
  return fn, args


def decode_program(shape: Shape, settings: ops.Settings):
  """(fn, args): one decode step (T == 1) of every row against a ragged [B, S, K, D] cache."""
  s = shape
  fn = lambda q, k, v, q_pos, kv_len: ops.decode_attention(q, k, v, q_pos, kv_len,
                                                           settings=settings)
  return fn, [_struct((s.B, s.H, s.D), s.dtype), _struct((s.B, s.S, s.K, s.D), s.dtype),
              _struct((s.B, s.S, s.K, s.D), s.dtype), _struct((s.B,), jnp.int32),
              _struct((s.B,), jnp.int32)]


def export_program(program, platform: str) -> jax.export.Exported:
  """Exports a `(fn, args)` pair of `flash_program` / `decode_program` for `platform`."""
  fn, args = program
  return export(fn, platform, *args)
