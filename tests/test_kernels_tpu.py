"""The TPU (Mosaic) kernels in TPU interpret mode against the pure-jnp references.

`pltpu.InterpretParams` runs a TPU kernel on the CPU with TPU semantics (VMEM scratch, scalar
prefetch in SMEM, the grid's sequential order, undefined values past the end of an array), so
the numbers of the kernels that `Settings(backend='tpu')` lowers are checked here, not only
their lowering (`tests/test_kernels_export.py`). Shapes are the smallest that still satisfy
the tiling rules (blocks of 128 queries and keys, so 2 x 2 blocks at T = 200), and few, as each
grid step is interpreted. Tolerances are those of `tests/test_kernels.py`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax import models
from ac2_jax import sampling
from ac2_jax.models import qwen3
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from kernels import ops
from kernels import reference
from test_kernels import FlashCase, _assert_close, _output_and_grads, _qkv, check_flash_case

TPU = ops.Settings(backend='tpu', interpret=True)


CASES = [
    # GQA 4, 2 x 2 blocks (T = 200 pads to 256): key block 1 skipped for query block 0, a row
    # of padding only (zero output and gradients).
    FlashCase('gqa4_two_blocks_padded_row', T=200, S=200, H=4, K=1, kv_len=(200, 0)),
    # GQA 8 over packed sequences, one row shorter than T.
    FlashCase('gqa8_segments', T=130, S=130, H=8, K=1, kv_len=(130, 77), segments=True),
    # GQA 1: prefill of 20 tokens at per-row offsets into a 150-slot cache (2 key blocks).
    FlashCase('gqa1_prefill_offsets', T=20, S=150, H=2, K=2, kv_len=(20, 140), offsets=(0, 120)),
]


@pytest.mark.parametrize('case', CASES, ids=lambda c: c.name)
def test_tpu_flash_values_and_grads_match_reference(case):
  check_flash_case(case, TPU, D=128, bounds=[[40, 100], [5, 70]])  # Three segments a row.


def test_tpu_kernels_are_the_ones_traced():
  q, k, v = _qkv(0, 1, 20, 20, 2, 1, 128)
  q_pos, kv_len = jnp.arange(20)[None], jnp.asarray([20])
  flash = str(jax.make_jaxpr(lambda q: ops.flash_attention(q, k, v, q_pos, kv_len,
                                                           settings=TPU))(q))
  assert 'flash_attention_forward_tpu' in flash


def test_tpu_flash_bfloat16_forward_matches_reference():
  q, k, v = _qkv(1, 1, 150, 150, 4, 2, 128, jnp.bfloat16)
  q_pos = jnp.arange(150)[None]
  kv_len = jnp.asarray([150])
  got = jax.jit(lambda q, k, v: ops.flash_attention(q, k, v, q_pos, kv_len,
                                                    settings=TPU))(q, k, v)
  assert got.dtype == jnp.bfloat16
  want = reference.attention(q.astype(jnp.float32), k.astype(jnp.float32),
                             v.astype(jnp.float32), q_pos, kv_len)
  _assert_close(got, want, 3e-2, 'bf16 output')


def test_tpu_decode_ragged_lengths_match_reference():
  # GQA 4; 50 slots in blocks of 16 (the final block runs past the cache: its undefined rows
  # must be masked) over 3 splits; lengths 1, maximum and two in between.
  B, S, H, K, D = 4, 50, 8, 2, 128
  q, k, v = _qkv(2, B, 1, S, H, K, D)
  kv_len = jnp.asarray([1, 50, 23, 37])
  q_pos = jnp.asarray([0, 49, 22, 30])
  settings = dataclasses.replace(TPU, decode_block_k=16, decode_splits=3)
  attend = lambda q, k, v: ops.attention(q, k, v, q_pos[:, None], kv_len, settings=settings)
  ref = lambda q, k, v: reference.decode_attention(q[:, 0], k, v, q_pos, kv_len)[:, None]
  jaxpr = str(jax.make_jaxpr(attend)(q, k, v))
  assert 'decode_attention_tpu' in jaxpr and 'flash_attention_forward' not in jaxpr
  (got, got_grads), (want, want_grads) = (_output_and_grads(attend, q, k, v),
                                          _output_and_grads(ref, q, k, v))
  _assert_close(got, want, 2e-5, 'decode output')
  for name, g, w in zip(('dq', 'dk', 'dv'), got_grads, want_grads):
    _assert_close(g, w, 2e-4, f'decode {name}')


# ---- the model, the sampler and the trainer with attention_impl='pallas' on TPU kernels ----

XLA_CONFIG = models.get_config('tiny').replace(num_layers=2)
TPU_CONFIG = XLA_CONFIG.replace(attention_impl='pallas', pallas_backend='tpu',
                                pallas_interpret=True)


@pytest.fixture(scope='module')
def params():
  return models.init_params(XLA_CONFIG, jax.random.key(0))


def test_sampler_decodes_with_tpu_kernels_as_with_xla(params):
  """Prefill (flash) and a few decode steps (ragged decode) inside the sampler's while loop."""
  rng = np.random.RandomState(0)
  contexts = [rng.randint(0, XLA_CONFIG.vocab_size, size=n).astype(np.int32) for n in (3, 9)]
  plain = sampling.SamplingSettings(temperature=1.0)
  key = jax.random.key(3)
  want = sampling.generate(XLA_CONFIG, params, contexts, 4, plain, key, stop_ids=())
  got = sampling.generate(TPU_CONFIG, params, contexts, 4, plain, key, stop_ids=())
  np.testing.assert_array_equal(got.tokens_NxT, want.tokens_NxT)
  np.testing.assert_array_equal(got.num_new_N, want.num_new_N)
  np.testing.assert_allclose(got.logprobs_NxT, want.logprobs_NxT, atol=1e-4)
  np.testing.assert_allclose(got.entropies_NxT, want.entropies_NxT, atol=1e-4)


def test_actor_update_with_tpu_kernels_equals_xla(params):
  rng = np.random.default_rng(0)
  B, T = 2, 12
  tokens = jnp.asarray(rng.integers(0, XLA_CONFIG.vocab_size, (B, T)), jnp.int32)
  mask = jnp.zeros((B, T), jnp.float32).at[0, 4:].set(1.0).at[1, 3:9].set(1.0)
  old = updates.sequence_logprobs(XLA_CONFIG, params, tokens, 1.0)
  batch = updates.ActorBatch(tokens, mask, old, mask * jnp.asarray([[1.0], [-0.5]]))
  optim = state_lib.OptimSettings(actor_lr=1e-3)
  results = []
  for config in (XLA_CONFIG, TPU_CONFIG):
    settings = updates.UpdateSettings(model=config, optim=optim)
    state = state_lib.init_state(params, optim)
    results.append(jax.jit(updates.actor_update, static_argnums=0)(settings, state, batch, 0.28))
  (new_x, m_x), (new_p, m_p) = results
  np.testing.assert_allclose(m_p['loss'], m_x['loss'], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(m_p['grad_norm'], m_x['grad_norm'], rtol=1e-4)
  assert float(m_p['skipped']) == 0.0
  for a, b in zip(jax.tree.leaves(new_p.params), jax.tree.leaves(new_x.params)):
    np.testing.assert_allclose(a, b, rtol=0, atol=5e-5)


def test_tiny_model_logits_and_grads_with_tpu_kernels_equal_xla(params):
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 24), 0, XLA_CONFIG.vocab_size)
  lengths = jnp.asarray([24, 11])

  def loss_and_grads(cfg):
    def loss(params):
      logits = qwen3.logits(cfg, params, tokens, lengths)
      return jnp.mean(jax.nn.logsumexp(logits, -1) * (jnp.arange(24) < lengths[:, None])), logits
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  (_, logits_x), grads_x = loss_and_grads(XLA_CONFIG)
  (_, logits_p), grads_p = loss_and_grads(TPU_CONFIG)
  _assert_close(logits_p, logits_x, 1e-4, 'logits')
  for (path, g_x), g_p in zip(jax.tree_util.tree_leaves_with_path(grads_x),
                              jax.tree_util.tree_leaves(grads_p)):
    scale = max(float(jnp.max(jnp.abs(g_x))), 1e-6)
    _assert_close(g_p / scale, g_x / scale, 1e-4, jax.tree_util.keystr(path))
