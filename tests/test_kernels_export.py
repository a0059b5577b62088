"""Every kernel, and the model with attention_impl='pallas', exports for TPU and for GPU from CPU.

`jax.export(..., platforms=['tpu'])` runs the Pallas -> Mosaic lowering (the (8, 128) tiling
rule, scalar prefetch, the kernel bodies) and `platforms=['cuda']` Pallas -> Triton, so a
kernel that cannot lower for either fails here, on a CPU. Each export takes well under a second.
The matrix: GQA 1/4/8, head_dim 64/128, bf16 and f32, T not a multiple of the block, prefill
into a longer cache, packed segments, ragged decode with and without splits.
"""

import jax
import jax.numpy as jnp
import pytest

from ac2_jax.models import get_config
from ac2_jax.models import qwen3
from kernels import export as export_lib
from kernels import ops

PLATFORMS = ('tpu', 'cuda')
Shape = export_lib.Shape

FLASH_SHAPES = [
    Shape(B=2, T=200, S=200, H=4, K=4, D=64),                       # GQA 1, T not a multiple
    Shape(B=2, T=256, S=256, H=8, K=2, D=128, segments=True),       # GQA 4, packed sequences
    Shape(B=1, T=130, S=300, H=8, K=1, D=128, dtype='float32'),     # GQA 8, prefill into a cache
    Shape(B=3, T=24, S=24, H=4, K=2, D=64),                         # shorter than one block
]
DECODE_SHAPES = [
    Shape(B=3, T=1, S=100, H=4, K=4, D=64),                         # GQA 1
    Shape(B=2, T=1, S=1000, H=8, K=2, D=128),                       # GQA 4, S % 8 != 0
    Shape(B=2, T=1, S=77, H=8, K=1, D=128, dtype='float32'),        # GQA 8
    Shape(B=1, T=1, S=5, H=2, K=1, D=64),                           # a cache shorter than 8
]
SPLITS = ops.Settings(decode_splits=4)


def _kernel_names(exported, platform):
  text = exported.mlir_module()
  names = ('flash_attention_forward', 'flash_attention_dq', 'flash_attention_dkdv',
           'decode_attention')
  suffix = '_tpu' if platform == 'tpu' else ''
  found = {n for n in names if f'{n}{suffix}' in text}
  if platform == 'cuda':
    assert '_tpu' not in text, 'a GPU program must not hold the TPU kernels'
  return found


@pytest.mark.parametrize('platform', PLATFORMS)
@pytest.mark.parametrize('shape', FLASH_SHAPES, ids=str)
def test_flash_forward_and_backward_export(shape, platform):
  exported = export_lib.export_program(
      export_lib.flash_program(shape, export_lib.settings_for(platform)), platform)
  assert export_lib.kernel_calls(exported, platform) == 3
  assert _kernel_names(exported, platform) == {
      'flash_attention_forward', 'flash_attention_dq', 'flash_attention_dkdv'}


@pytest.mark.parametrize('platform', PLATFORMS)
@pytest.mark.parametrize('shape', DECODE_SHAPES, ids=str)
def test_decode_exports(shape, platform):
  exported = export_lib.export_program(
      export_lib.decode_program(shape, export_lib.settings_for(platform, SPLITS)), platform)
  assert export_lib.kernel_calls(exported, platform) == 1
  assert _kernel_names(exported, platform) == {'decode_attention'}


@pytest.mark.parametrize('platform', PLATFORMS)
def test_model_forward_backward_and_decode_step_export(platform):
  """The tiny decoder (GQA 4, head_dim 64) with Pallas attention: a loss gradient and a cached
  decode step both lower, one kernel set per layer."""
  config = get_config('tiny').replace(num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64,
                                      attention_impl='pallas',
                                      pallas_backend=export_lib.BACKEND_OF[platform])
  params = jax.eval_shape(lambda: qwen3.init_params(config, jax.random.key(0)))
  B, T, S = 2, 40, 96
  tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
  lengths = jax.ShapeDtypeStruct((B,), jnp.int32)

  def loss_grad(params, tokens, lengths):
    def loss(params):
      logits = qwen3.logits(config, params, tokens, lengths)
      return jnp.mean(jax.nn.logsumexp(logits, -1))
    return jax.grad(loss)(params)

  exported = export_lib.export(loss_grad, platform, params, tokens, lengths)
  assert export_lib.kernel_calls(exported, platform) == 3 * config.num_layers

  cache = jax.eval_shape(lambda: qwen3.init_cache(config, B, S))

  def decode_step(params, token, cache, cache_lengths):
    return qwen3.forward(config, params, token, cache=cache, cache_lengths_B=cache_lengths)

  exported = export_lib.export(decode_step, platform, params,
                               jax.ShapeDtypeStruct((B, 1), jnp.int32), cache, lengths)
  assert export_lib.kernel_calls(exported, platform) == config.num_layers
  assert _kernel_names(exported, platform) == {'decode_attention'}


def test_backend_setting_is_checked():
  with pytest.raises(ValueError, match="'gpu', 'tpu' or None"):
    ops.Settings(backend='cuda')
  with pytest.raises(ValueError, match="'gpu', 'tpu' or None"):
    get_config('tiny').replace(pallas_backend='cpu')
