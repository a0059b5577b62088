"""Qwen3 decoder: causality, ragged padding, KV-cache decoding, parameter counts, dtypes, remat."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax.models import forward, get_config, init_cache, init_params
from ac2_jax.models import logits as _logits
from ac2_jax.models import qwen3

# Jitted once per config: op-by-op execution of the decoder is far slower on CPU.
logits = jax.jit(_logits, static_argnums=0)


@pytest.fixture(scope='module')
def tiny():
  config = get_config('tiny')
  return config, jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))


def test_causality_gradient_of_earlier_positions_wrt_later_tokens_is_zero(tiny):
  # The tiny preset is untied, so the embedding table is used only at the input: with distinct
  # tokens, embedding row tokens[s] receives gradient from position t only through token s.
  config, params = tiny
  T, t = 10, 4
  tokens_1xT = jax.random.permutation(jax.random.key(1), config.vocab_size)[:T][None, :]

  def position_t_output(embedding):
    p = {**params, 'embed_tokens': {'embedding': embedding}}
    out = logits(config, p, tokens_1xT)
    return jnp.sum(out[0, t] * jnp.linspace(-1.0, 1.0, config.vocab_size))

  grad_VxE = jax.jit(jax.grad(position_t_output))(params['embed_tokens']['embedding'])
  row_norms_T = np.linalg.norm(np.asarray(grad_VxE)[np.asarray(tokens_1xT[0])], axis=-1)
  assert np.all(row_norms_T[t + 1:] == 0.0), row_norms_T
  assert np.all(row_norms_T[:t + 1] > 1e-6), row_norms_T


def test_hidden_output_and_padding_do_not_leak(tiny):
  config, params = tiny
  rng = np.random.default_rng(0)
  tokens_BxT = rng.integers(0, config.vocab_size, (2, 9)).astype(np.int32)
  lengths_B = np.array([9, 6], np.int32)
  out_BxTxV = logits(config, params, tokens_BxT, lengths_B)
  noisy = tokens_BxT.copy()
  noisy[1, 6:] = rng.integers(0, config.vocab_size, 3)
  out2_BxTxV = logits(config, params, noisy, lengths_B)
  np.testing.assert_array_equal(out_BxTxV[1, :6], out2_BxTxV[1, :6])
  # A row on its own (no padding) gives the same valid logits as inside the padded batch.
  alone = logits(config, params, tokens_BxT[1:, :6])
  np.testing.assert_allclose(alone[0], out_BxTxV[1, :6], atol=1e-5)
  hidden_BxTxE, cache = jax.jit(forward, static_argnums=0, static_argnames='output')(
      config, params, tokens_BxT, lengths_B=lengths_B, output='hidden')
  assert hidden_BxTxE.shape == (2, 9, config.hidden_size) and cache is None
  np.testing.assert_allclose(hidden_BxTxE @ params['lm_head']['kernel'], out_BxTxV, atol=1e-4)


def test_kv_cache_decoding_equals_full_forward_with_ragged_offsets(tiny):
  config, params = tiny
  rng = np.random.default_rng(1)
  prompt_B = np.array([5, 8, 3], np.int32)
  new = 4
  P, S = int(prompt_B.max()), 16
  full_lengths_B = prompt_B + new
  seqs_BxT = rng.integers(0, config.vocab_size, (3, int(full_lengths_B.max()))).astype(np.int32)
  want_BxTxV = np.asarray(logits(config, params, seqs_BxT, full_lengths_B))

  step = jax.jit(lambda p, tok, lens, cache, offs: forward(
      config, p, tok, lengths_B=lens, cache=cache, cache_lengths_B=offs))
  prompts_BxP = np.where(np.arange(P)[None] < prompt_B[:, None], seqs_BxT[:, :P], 0)
  cache = init_cache(config, 3, S)
  out_BxPxV, cache = step(params, prompts_BxP, prompt_B, cache, np.zeros(3, np.int32))
  for b in range(3):
    np.testing.assert_allclose(out_BxPxV[b, :prompt_B[b]], want_BxTxV[b, :prompt_B[b]], atol=1e-4)
  # Decode one token at a time, each row at its own offset.
  for j in range(new - 2):
    offs_B = prompt_B + j
    tok_Bx1 = seqs_BxT[np.arange(3), offs_B][:, None]
    out_Bx1xV, cache = step(params, tok_Bx1, np.ones(3, np.int32), cache, offs_B)
    np.testing.assert_allclose(out_Bx1xV[:, 0], want_BxTxV[np.arange(3), offs_B], atol=1e-4)
  # Then a block of 2 tokens appended at ragged offsets (chunked continuation).
  offs_B = prompt_B + new - 2
  block_Bx2 = np.stack([seqs_BxT[np.arange(3), offs_B], seqs_BxT[np.arange(3), offs_B + 1]], 1)
  out_Bx2xV, cache = step(params, block_Bx2, np.full(3, 2, np.int32), cache, offs_B)
  for k in range(2):
    np.testing.assert_allclose(out_Bx2xV[:, k], want_BxTxV[np.arange(3), offs_B + k], atol=1e-4)
  k_shape, v_shape = qwen3.layer_cache_shapes(config, 3, S)
  assert cache['k'].shape == (config.num_layers, *k_shape)
  assert cache['v'].shape == (config.num_layers, *v_shape)


def _param_count(name):
  config = get_config(name)
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes)), config


def test_official_parameter_counts():
  assert _param_count('qwen3_4b')[0] == 4_022_468_096
  assert _param_count('qwen3_0_6b')[0] == 596_049_920
  # Qwen3-1.7B ties its embeddings: 1,720,574,976 distinct parameters. Its safetensors also store
  # lm_head.weight (a copy of the embedding), which is why Hugging Face lists 2,031,739,904.
  count, config = _param_count('qwen3_1_7b')
  assert count == 1_720_574_976
  assert count + config.vocab_size * config.hidden_size == 2_031_739_904
  assert 1_000_000 <= _param_count('tiny')[0] <= 4_000_000
  # tiny_deep is tiny with twice the layers: the same embeddings and head, twice the blocks.
  tiny, deep = _param_count('tiny')[0], _param_count('tiny_deep')[0]
  blocks = deep - tiny
  assert get_config('tiny_deep').num_layers == 2 * get_config('tiny').num_layers
  assert tiny - blocks == 2 * 512 * 128 + 128  # embeddings, untied head and the final norm
  assert 20_000_000 <= _param_count('small')[0] <= 50_000_000


def test_bfloat16_forward(tiny):
  config, params = tiny
  config16 = config.replace(param_dtype='bfloat16', dtype='bfloat16')
  params16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
  tokens_BxT = np.random.default_rng(2).integers(0, config.vocab_size, (2, 12)).astype(np.int32)
  out16 = logits(config16, params16, tokens_BxT)
  out32 = logits(config, params, tokens_BxT)
  assert out16.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(out16)))
  scale = float(jnp.std(out32))
  err = float(jnp.max(jnp.abs(out16 - out32)))
  assert err < 0.1 * scale and err > 0.0, (err, scale)
  fresh = jax.eval_shape(lambda: init_params(config16, jax.random.key(0)))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(fresh))


def test_remat_gives_the_same_gradients(tiny):
  config, params = tiny
  # Two layers are enough to compare; halves the two compilations.
  config = config.replace(num_layers=2)
  params = {k: v for k, v in params.items() if k not in ('layers_2', 'layers_3')}
  tokens_BxT = np.random.default_rng(3).integers(0, config.vocab_size, (2, 8)).astype(np.int32)

  def loss(p, c):
    out = logits(c, p, tokens_BxT)
    return jnp.mean(jax.nn.log_softmax(out)[..., 7])

  # The remat config really rematerialises (the backward pass holds a remat region).
  assert 'remat' in str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(
      params, config.replace(remat=True)))
  assert 'remat' not in str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(params, config))
  g_plain = jax.jit(jax.grad(loss), static_argnums=1)(params, config)
  g_remat = jax.jit(jax.grad(loss), static_argnums=1)(params, config.replace(remat=True))
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5),
                         g_remat, g_plain)
  assert float(jnp.max(jnp.abs(g_plain['layers_0']['mlp']['up_proj']['kernel']))) > 0


def test_import_pulls_in_neither_torch_nor_tensorflow():
  code = ('import sys, ac2_jax, ac2_jax.models, ac2_jax.sharding, ac2_jax.tokenization\n'
          'bad = sorted(m for m in sys.modules if m.split(".")[0] in '
          '("torch", "tensorflow", "transformers"))\n'
          'print("BAD", bad)')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'BAD []' in result.stdout


def test_config_errors():
  with pytest.raises(ValueError, match='unknown model preset'):
    get_config('qwen3_5b')
  with pytest.raises(ValueError, match='multiple of num_kv_heads'):
    get_config('tiny', num_kv_heads=3)
