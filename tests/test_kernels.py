"""Pallas attention kernels (interpret mode on CPU) against the pure-jnp references.

Each case compiles the kernels once through the Pallas interpreter, so shapes stay small and
cases are few; together they cover T not a multiple of the block, GQA ratios 1, 4 and 8,
padded rows (including a row with no valid slot), lengths 1 and maximum, packed segments,
prefill at per-row offsets into a longer cache, and ragged decode with split caches.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax.models import get_config
from ac2_jax.models import qwen3
from kernels import ops
from kernels import reference

SMALL_BLOCKS = ops.Settings(block_q=16, block_k=16, block_q_bwd=16, block_k_bwd=16,
                            decode_block_k=16, interpret=True)


def _qkv(seed, B, T, S, H, K, D, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(B, T, H, D)), dtype)
  k = jnp.asarray(rng.normal(size=(B, S, K, D)), dtype)
  v = jnp.asarray(rng.normal(size=(B, S, K, D)), dtype)
  return q, k, v


def _output_and_grads(attend, q, k, v):
  """Output and (dq, dk, dv) of a loss that weighs every output element differently."""
  weights = jnp.cos(jnp.arange(q.size, dtype=jnp.float32).reshape(q.shape))

  def loss(q, k, v):
    out = attend(q, k, v)
    return jnp.sum(out.astype(jnp.float32) * weights), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


def _assert_close(got, want, atol, what):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  err = np.max(np.abs(got - want))
  assert err <= atol, f'{what}: max abs error {err} > {atol}'


@dataclasses.dataclass(frozen=True)
class FlashCase:
  name: str
  T: int
  S: int
  H: int
  K: int
  kv_len: tuple
  offsets: tuple = (0, 0)
  segments: bool = False


FLASH_CASES = [
    # GQA 1; T = 40 spans 2.5 blocks; row 0 at the maximum length, row 1 sees one slot.
    FlashCase('gqa1_len_max_and_1', T=40, S=40, H=2, K=2, kv_len=(40, 1)),
    # GQA 4; row 0 is entirely padding (no valid slot: zero output, zero gradient).
    FlashCase('gqa4_padded_rows', T=24, S=24, H=4, K=1, kv_len=(0, 17)),
    # GQA 8 over packed sequences (segment ids), one row shorter than T.
    FlashCase('gqa8_segments', T=33, S=33, H=8, K=1, kv_len=(33, 20), segments=True),
    # Prefill of T new tokens at per-row offsets into a longer cache (q_pos = offset + t).
    FlashCase('gqa2_prefill_offsets', T=20, S=50, H=4, K=2, kv_len=(20, 33), offsets=(0, 13)),
]


def check_flash_case(case: FlashCase, settings: ops.Settings, D: int, bounds) -> None:
  """Flash output and gradients equal the reference's; `bounds` cut each row into segments."""
  B = 2
  q, k, v = _qkv(0, B, case.T, case.S, case.H, case.K, D)
  q_pos = jnp.asarray(case.offsets)[:, None] + jnp.arange(case.T)[None, :]
  kv_len = jnp.asarray(case.kv_len)
  seg = None
  if case.segments:
    seg = jnp.asarray((np.arange(case.T)[None, :, None] >= np.asarray(bounds)[:, None, :]).sum(-1))
  kernel = lambda q, k, v: ops.flash_attention(q, k, v, q_pos, kv_len, segment_ids_BxT=seg,
                                               settings=settings)
  ref = lambda q, k, v: reference.attention(q, k, v, q_pos, kv_len, seg)
  (got, got_grads), (want, want_grads) = (_output_and_grads(kernel, q, k, v),
                                          _output_and_grads(ref, q, k, v))
  _assert_close(got, want, 2e-5, 'output')
  for name, g, w in zip(('dq', 'dk', 'dv'), got_grads, want_grads):
    _assert_close(g, w, 2e-4, name)
  if 0 in case.kv_len:
    row = case.kv_len.index(0)
    assert not np.any(np.asarray(got)[row]), 'padding row must give zeros'
    assert not np.any(np.asarray(got_grads[0])[row]), 'padding row must give zero dq'


@pytest.mark.parametrize('case', FLASH_CASES, ids=lambda c: c.name)
def test_flash_values_and_grads_match_reference(case):
  check_flash_case(case, SMALL_BLOCKS, D=32, bounds=[[7, 19], [5, 26]])  # Three segments a row.


def test_flash_bfloat16_forward_matches_reference():
  q, k, v = _qkv(1, 2, 40, 40, 4, 2, 32, jnp.bfloat16)
  q_pos = jnp.tile(jnp.arange(40)[None], (2, 1))
  kv_len = jnp.asarray([40, 29])
  got = jax.jit(lambda q, k, v: ops.flash_attention(q, k, v, q_pos, kv_len,
                                                    settings=SMALL_BLOCKS))(q, k, v)
  assert got.dtype == jnp.bfloat16
  want = reference.attention(q.astype(jnp.float32), k.astype(jnp.float32),
                             v.astype(jnp.float32), q_pos, kv_len)
  _assert_close(got, want, 3e-2, 'bf16 output')


def test_decode_ragged_lengths_match_reference():
  # GQA 4; cache of 50 slots (not a multiple of the 16-slot block) split over 3 programs;
  # lengths 1, maximum and two in between, queries at the last valid slot or earlier.
  B, S, H, K, D = 4, 50, 8, 2, 32
  q, k, v = _qkv(2, B, 1, S, H, K, D)
  kv_len = jnp.asarray([1, 50, 23, 37])
  q_pos = jnp.asarray([0, 49, 22, 30])
  settings = dataclasses.replace(SMALL_BLOCKS, decode_splits=3)
  # The model's entry point routes T == 1 to the decode kernel; its gradients reuse flash's.
  attend = lambda q, k, v: ops.attention(q, k, v, q_pos[:, None], kv_len, settings=settings)
  ref = lambda q, k, v: reference.decode_attention(q[:, 0], k, v, q_pos, kv_len)[:, None]
  jaxpr = str(jax.make_jaxpr(attend)(q, k, v))
  assert 'decode_attention' in jaxpr and 'flash_attention_forward' not in jaxpr
  (got, got_grads), (want, want_grads) = (_output_and_grads(attend, q, k, v),
                                          _output_and_grads(ref, q, k, v))
  _assert_close(got, want, 2e-5, 'decode output')
  for name, g, w in zip(('dq', 'dk', 'dv'), got_grads, want_grads):
    _assert_close(g, w, 2e-4, f'decode {name}')


def test_tiny_model_pallas_forward_and_backward_equal_xla():
  config = get_config('tiny')
  pallas = config.replace(attention_impl='pallas', pallas_interpret=True)
  params = qwen3.init_params(config, jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 24), 0, config.vocab_size)
  lengths = jnp.asarray([24, 11])

  def loss_and_grads(cfg):
    def loss(params):
      logits = qwen3.logits(cfg, params, tokens, lengths)
      logp = jax.nn.log_softmax(logits)
      mask = jnp.arange(23)[None, :] < lengths[:, None] - 1
      nll = -jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
      return jnp.sum(nll * mask) / jnp.sum(mask), logits
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  assert 'flash_attention_forward' in str(
      jax.make_jaxpr(lambda p: qwen3.logits(pallas, p, tokens, lengths))(params))
  (loss_x, logits_x), grads_x = loss_and_grads(config)
  (loss_p, logits_p), grads_p = loss_and_grads(pallas)
  _assert_close(logits_p, logits_x, 1e-4, 'logits')
  _assert_close(loss_p, loss_x, 1e-5, 'loss')
  flat_x = jax.tree_util.tree_leaves_with_path(grads_x)
  flat_p = jax.tree_util.tree_leaves(grads_p)
  for (path, g_x), g_p in zip(flat_x, flat_p):
    scale = max(float(jnp.max(jnp.abs(g_x))), 1e-6)
    _assert_close(g_p / scale, g_x / scale, 1e-4, jax.tree_util.keystr(path))


def test_bad_inputs_raise_clear_errors():
  q, k, v = _qkv(3, 1, 4, 4, 3, 2, 16)
  q_pos, kv_len = jnp.arange(4)[None], jnp.asarray([4])
  with pytest.raises(ValueError, match='multiple of KV heads'):
    ops.flash_attention(q, k, v, q_pos, kv_len, interpret=True)
  q, k, v = _qkv(3, 1, 4, 4, 2, 2, 16)
  with pytest.raises(ValueError, match='q_pos shape'):
    ops.flash_attention(q, k, v, q_pos[:, :2], kv_len, interpret=True)
  with pytest.raises(ValueError, match='needs S == T'):
    ops.flash_attention(q, k[:, :3], v[:, :3], q_pos, kv_len, interpret=True,
                        segment_ids_BxT=jnp.zeros((1, 4), jnp.int32))
  with pytest.raises(ValueError, match='interpret=True'):
    ops.flash_attention(q, k, v, q_pos, kv_len)  # CPU without the interpreter.
  with pytest.raises(ValueError, match='power of two'):
    ops.Settings(block_q=24)


def test_gpu_decode_block_fits_shared_memory():
  # A 256-slot block at D = 128 in bf16 asked an H200 for 268 KiB of its 227 KiB shared memory.
  settings = ops.Settings()
  assert settings.decode_block_k == 256
  assert ops.gpu_decode_block_k(settings, S=4096, D=128, itemsize=2) == 128
  assert ops.gpu_decode_block_k(settings, S=4096, D=128, itemsize=4) == 64
  assert ops.gpu_decode_block_k(settings, S=4096, D=64, itemsize=2) == 256
  assert ops.gpu_decode_block_k(settings, S=100, D=32, itemsize=4) == 64  # The cache bounds it.
  small = ops.Settings(decode_block_k=16)
  assert ops.gpu_decode_block_k(small, S=4096, D=128, itemsize=2) == 16
