"""The critic's low-rank adapter: W + A B read by the critic, trained by its update alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax import models, sharding
from ac2_jax.learner import critic_adapter, runtime, updates
from ac2_jax.learner import state as state_lib

CONFIG = models.get_config('tiny').replace(num_layers=2)
RANK = 4


def _adapted(seed=1):
  params = models.init_params(CONFIG, jax.random.key(seed))
  return params, critic_adapter.init_adapter(params, RANK, jax.random.key(seed + 1))


def _critic_batch(B=4, T=12, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CONFIG.vocab_size, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  mask[:, -3:-1] = 1.0
  return updates.CriticBatch(jnp.asarray(tokens), jnp.asarray(mask),
                             jnp.asarray([1.0, 0.5, 0.5, 1.0], jnp.float32))


def test_adapter_covers_every_decoder_matrix_and_starts_as_the_policy():
  params, adapter = _adapted()
  names = {sharding.path_str(p)[:-len('/lora_a')]
           for p, _ in jax.tree_util.tree_flatten_with_path(adapter)[0]
           if sharding.path_str(p).endswith('lora_a')}
  per_layer = ['self_attn/q_proj', 'self_attn/k_proj', 'self_attn/v_proj', 'self_attn/o_proj',
               'mlp/gate_proj', 'mlp/up_proj', 'mlp/down_proj']
  assert names == ({f'layers_{i}/{m}/kernel' for i in range(2) for m in per_layer}
                   | {'lm_head/kernel'})
  merged = critic_adapter.merge(params, adapter)
  for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)  # B = 0


def test_merge_adds_the_low_rank_map_on_each_kernels_contraction():
  """o_proj [H, D, E] contracts (H, D): its delta maps the flattened heads through A B; q_proj
  [E, H, D] contracts E. Checked on the projections' own einsums."""
  params, adapter = _adapted()
  rng = np.random.default_rng(0)
  adapter = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), adapter)
  merged = critic_adapter.merge(params, adapter)
  H, D, E = params['layers_0']['self_attn']['o_proj']['kernel'].shape
  heads = jnp.asarray(rng.normal(size=(3, H, D)), jnp.float32)
  o = adapter['layers_0']['self_attn']['o_proj']['kernel']
  expected = (jnp.einsum('bhd,hde->be', heads, params['layers_0']['self_attn']['o_proj']['kernel'])
              + heads.reshape(3, H * D) @ o['lora_a'] @ o['lora_b'])
  got = jnp.einsum('bhd,hde->be', heads, merged['layers_0']['self_attn']['o_proj']['kernel'])
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
  x = jnp.asarray(rng.normal(size=(3, E)), jnp.float32)
  q = adapter['layers_1']['self_attn']['q_proj']['kernel']
  q_kernel = params['layers_1']['self_attn']['q_proj']['kernel']
  expected = (jnp.einsum('be,ehd->bhd', x, q_kernel)
              + (x @ q['lora_a'] @ q['lora_b']).reshape(3, *q_kernel.shape[1:]))
  got = jnp.einsum('be,ehd->bhd', x, merged['layers_1']['self_attn']['q_proj']['kernel'])
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
  # Norms and the embedding are the policy's.
  np.testing.assert_array_equal(merged['embed_tokens']['embedding'],
                                params['embed_tokens']['embedding'])


def test_critic_update_trains_the_adapter_and_leaves_the_policy_alone():
  params, adapter = _adapted()
  optim = state_lib.OptimSettings()
  settings = updates.UpdateSettings(model=CONFIG, optim=optim)
  state = critic_adapter.init_state(params, adapter, optim)
  batch = _critic_batch()
  step = jax.jit(updates.critic_update, static_argnums=0)
  new, metrics = step(settings, state, batch, jnp.float32(3e-3))
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(new.actor_opt_state), jax.tree.leaves(state.actor_opt_state)):
    np.testing.assert_array_equal(a, b)
  assert float(metrics['update_norm']) > 0 and float(metrics['skipped']) == 0.0
  moved = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(new.critic_adapter),
                                                        jax.tree.leaves(adapter))]
  assert max(moved) > 0
  # The critic's own reading of its value tokens improves; the policy's does not change.
  def loss(p):
    logp = updates.sequence_logprobs(CONFIG, p, batch.tokens_BxT, 1.0)
    return float(-(logp * batch.target_mask_BxT).sum())
  assert loss(critic_adapter.critic_params(new)) < loss(critic_adapter.critic_params(state))
  assert loss(new.params) == loss(params)


def test_split_critic_step_with_an_adapter_equals_one_batch():
  """The runtime's critic step (grads summed over length groups, one apply) on an AdapterState:
  the shardings follow the trained field, and splitting changes nothing."""
  params, adapter = _adapted()
  optim = state_lib.OptimSettings(critic_eps=1.0)  # a step linear in the gradient (see
  settings = updates.UpdateSettings(model=CONFIG, optim=optim)  # test_train_updates)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  fresh = lambda: critic_adapter.init_state(jax.tree.map(jnp.copy, params),
                                            jax.tree.map(jnp.copy, adapter), optim)
  state_shardings = jax.tree.map(lambda _: replicated, fresh())
  step = runtime.make_critic_step(settings, state_shardings, replicated, replicated)
  batch = _critic_batch()
  halves = (jax.tree.map(lambda x: x[:2], batch), jax.tree.map(lambda x: x[2:], batch))
  whole, m_whole = step(fresh(), batch, jnp.float32(1.0))
  split, m_split = step(fresh(), halves, jnp.float32(1.0))
  np.testing.assert_allclose(m_split['loss'], m_whole['loss'], rtol=1e-6)
  for a, b, p in zip(jax.tree.leaves(split.critic_adapter), jax.tree.leaves(whole.critic_adapter),
                     jax.tree.leaves(adapter)):
    du_split, du_whole = np.asarray(a - p, np.float64), np.asarray(b - p, np.float64)
    np.testing.assert_allclose(du_split, du_whole, rtol=0,
                               atol=1e-3 * max(np.abs(du_whole).max(), 1e-12))


def test_adapter_state_has_partition_rules():
  params, adapter = _adapted()
  state = critic_adapter.init_state(params, adapter, state_lib.OptimSettings())
  specs = sharding.param_partition_specs(state)
  assert specs.critic_adapter['lm_head']['kernel']['lora_b'] == jax.sharding.PartitionSpec(None,
                                                                                          None)


def test_rank_must_be_positive():
  params = models.init_params(CONFIG, jax.random.key(0))
  with pytest.raises(ValueError, match='rank must be > 0'):
    critic_adapter.init_adapter(params, 0, jax.random.key(0))
