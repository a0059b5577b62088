"""Maintainers' check: every Pallas kernel exports for TPU (Mosaic) and GPU (Triton) from CPU.

  python scripts/check_kernel_exports.py            # about a minute on a laptop CPU

Runs the Pallas -> Mosaic and Pallas -> Triton lowerings (`kernels.export`) at shapes and block
settings that `tests/test_kernels_export.py` does not use: Qwen3 head layouts at long context,
long ragged decode caches, lengths one past a block, the larger TPU blocks, and the `small` and
Qwen3-0.6B decoders with attention_impl='pallas' (loss gradient and cached decode step). Prints
one line per export and exits non-zero if any fails. It checks lowering only; the backend
compilers (libtpu's Mosaic passes, ptxas) run when a program is compiled on the device.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from ac2_jax.models import get_config  # noqa: E402
from ac2_jax.models import qwen3  # noqa: E402
from kernels import export as export_lib  # noqa: E402
from kernels import ops  # noqa: E402

Shape = export_lib.Shape
DEFAULT = ops.Settings()
LARGE_BLOCKS = ops.Settings(block_q=256, block_k=512, block_q_bwd=256, block_k_bwd=256,
                            decode_block_k=512, decode_splits=8)

FLASH = [
    (Shape(B=1, T=384, S=768, H=16, K=4, D=128), DEFAULT),           # the measurement
    (Shape(B=1, T=4096, S=4096, H=32, K=8, D=128), LARGE_BLOCKS),    # Qwen3-4B heads at 4k
    (Shape(B=2, T=1000, S=1000, H=16, K=2, D=64, segments=True), DEFAULT),
    (Shape(B=1, T=513, S=1025, H=4, K=4, D=128, dtype='float32'), LARGE_BLOCKS),
    (Shape(B=4, T=1, S=2048, H=32, K=8, D=128), DEFAULT),            # flash at T = 1
]
DECODE = [
    (Shape(B=32, T=1, S=32768, H=32, K=8, D=128), LARGE_BLOCKS),     # Qwen3-4B decode at 32k
    (Shape(B=16, T=1, S=8191, H=16, K=8, D=128), DEFAULT),
    (Shape(B=8, T=1, S=4099, H=8, K=1, D=64, dtype='float32'), ops.Settings(decode_splits=3)),
    (Shape(B=2, T=1, S=3, H=4, K=2, D=128), DEFAULT),
]
MODELS = [('small', 2, 200, 520), ('qwen3_0_6b', 1, 1100, 4096)]


def _model_programs(name: str, platform: str, B: int, T: int, S: int):
  config = get_config(name).replace(attention_impl='pallas', dtype='bfloat16',
                                    pallas_backend=export_lib.BACKEND_OF[platform])
  params = jax.eval_shape(lambda: qwen3.init_params(config, jax.random.key(0)))
  lengths = jax.ShapeDtypeStruct((B,), jnp.int32)

  def loss_grad(params, tokens, lengths):
    loss = lambda p: jnp.mean(jax.nn.logsumexp(qwen3.logits(config, p, tokens, lengths), -1))
    return jax.grad(loss)(params)

  def decode_step(params, token, cache, cache_lengths):
    return qwen3.forward(config, params, token, cache=cache, cache_lengths_B=cache_lengths)

  cache = jax.eval_shape(lambda: qwen3.init_cache(config, B, S))
  return [(f'{name} loss gradient B{B} T{T}', loss_grad,
           (params, jax.ShapeDtypeStruct((B, T), jnp.int32), lengths), 3 * config.num_layers),
          (f'{name} decode step B{B} S{S}', decode_step,
           (params, jax.ShapeDtypeStruct((B, 1), jnp.int32), cache, lengths), config.num_layers)]


def _checks(platform: str):
  for shape, settings in FLASH:
    settings = export_lib.settings_for(platform, settings)
    yield f'flash fwd+bwd {shape}', *export_lib.flash_program(shape, settings), 3
  for shape, settings in DECODE:
    settings = export_lib.settings_for(platform, settings)
    yield f'decode {shape}', *export_lib.decode_program(shape, settings), 1
  for name, B, T, S in MODELS:
    yield from _model_programs(name, platform, B, T, S)


def main() -> int:
  failures = 0
  for platform in ('tpu', 'cuda'):
    for what, fn, args, want_calls in _checks(platform):
      start = time.perf_counter()
      try:
        calls = export_lib.kernel_calls(export_lib.export(fn, platform, *args), platform)
        status = 'ok' if calls == want_calls else f'FAIL: {calls} kernels, expected {want_calls}'
      except Exception as e:  # noqa: BLE001 - report every failing export, then exit non-zero.
        status = f'FAIL: {type(e).__name__}: {str(e).splitlines()[0][:200]}'
        traceback.print_exc(limit=2)
      failures += status != 'ok'
      print(f'{platform:4s}  {what:60s} {status}  ({time.perf_counter() - start:.1f} s)',
            flush=True)
  print(f'{failures} failure(s)')
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
