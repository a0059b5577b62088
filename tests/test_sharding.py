"""Mesh, partition rules, batch sharding, multi-host start; sharded forward + AdamW step."""

import os
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from ac2_jax import sharding
from ac2_jax.models import get_config, init_params, logits


def _mesh(data=2, fsdp=2, tensor=2):
  return sharding.make_mesh(sharding.MeshConfig(data=data, fsdp=fsdp, tensor=tensor))


def test_mesh_config_resolution():
  assert sharding.MeshConfig().resolve(8) == (1, 8, 1)
  assert sharding.MeshConfig(data=2, fsdp=-1, tensor=2).resolve(8) == (2, 2, 2)
  assert sharding.MeshConfig(data=-1, fsdp=1, tensor=4).resolve(8) == (2, 1, 4)
  with pytest.raises(ValueError, match='at most one axis'):
    sharding.MeshConfig(data=-1, fsdp=-1).resolve(8)
  with pytest.raises(ValueError, match='not divisible'):
    sharding.MeshConfig(tensor=3).resolve(8)
  with pytest.raises(ValueError, match='product 4 != number of devices 8'):
    sharding.MeshConfig(data=2, fsdp=2, tensor=1).resolve(8)
  with pytest.raises(ValueError, match='MeshConfig.tensor=0'):
    sharding.MeshConfig(tensor=0).resolve(8)


def test_make_mesh_axes_and_devices():
  assert jax.device_count() == 8
  mesh = _mesh(2, 2, 2)
  assert mesh.axis_names == ('data', 'fsdp', 'tensor')
  assert dict(mesh.shape) == {'data': 2, 'fsdp': 2, 'tensor': 2}
  assert sorted(d.id for d in mesh.devices.flat) == list(range(8))
  small = sharding.make_mesh(sharding.MeshConfig(fsdp=-1, tensor=2), devices=jax.devices()[:4])
  assert dict(small.shape) == {'data': 1, 'fsdp': 2, 'tensor': 2}


def test_specs_for_every_parameter_of_a_full_size_model():
  config = get_config('qwen3_4b')
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  specs = sharding.param_partition_specs(shapes, _mesh(1, 4, 2))
  layer = specs['layers_35']
  assert specs['embed_tokens']['embedding'] == P('tensor', 'fsdp')
  assert layer['self_attn']['q_proj']['kernel'] == P('fsdp', 'tensor', None)
  assert layer['self_attn']['k_proj']['kernel'] == P('fsdp', 'tensor', None)
  assert layer['self_attn']['o_proj']['kernel'] == P('tensor', None, 'fsdp')
  assert layer['mlp']['up_proj']['kernel'] == P('fsdp', 'tensor')
  assert layer['mlp']['down_proj']['kernel'] == P('tensor', 'fsdp')
  assert layer['self_attn']['q_norm']['scale'] == P(None)
  assert specs['norm']['scale'] == P(None)
  # An untied model's lm_head follows its rule; a tied model simply has none.
  untied = jax.eval_shape(lambda: init_params(get_config('tiny'), jax.random.key(0)))
  assert sharding.param_partition_specs(untied)['lm_head']['kernel'] == P('fsdp', 'tensor')


def test_indivisible_dimensions_fall_back_to_replication():
  # 2 KV heads on a tensor axis of 4: the head dimension of k/v is replicated, q (4 heads) is split.
  shapes = jax.eval_shape(lambda: init_params(get_config('tiny'), jax.random.key(0)))
  specs = sharding.param_partition_specs(shapes, _mesh(1, 2, 4))
  attn = specs['layers_0']['self_attn']
  assert attn['k_proj']['kernel'] == P('fsdp', None, None)
  assert attn['q_proj']['kernel'] == P('fsdp', 'tensor', None)
  odd = jax.eval_shape(lambda: init_params(
      get_config('tiny', hidden_size=36, vocab_size=30), jax.random.key(0)))
  specs = sharding.param_partition_specs(odd, _mesh(1, 8, 1))
  assert specs['embed_tokens']['embedding'] == P('tensor', None)
  # Without a mesh the rules are returned as written.
  assert sharding.param_partition_specs(odd)['embed_tokens']['embedding'] == P('tensor', 'fsdp')


def test_rule_errors_name_the_parameter_or_rule():
  params = {'mlp': {'up_proj': {'kernel': np.zeros((4, 8))}}, 'adapter': {'w': np.zeros((4, 4))}}
  rules = (sharding.Rule(r'mlp/up_proj/kernel', ('fsdp', 'tensor')),)
  with pytest.raises(ValueError, match=r'no partition rule matches parameter adapter/w'):
    sharding.param_partition_specs(params, rules=rules)
  del params['adapter']
  with pytest.raises(ValueError, match=r"rules match no parameter: \['embed_tokens/embedding'"):
    sharding.param_partition_specs(params)
  bad = (sharding.Rule(r'mlp/up_proj/kernel', ('fsdp',)),)
  with pytest.raises(ValueError, match=r'has 1 entries but mlp/up_proj/kernel has shape \(4, 8\)'):
    sharding.param_partition_specs(params, rules=bad)


def test_optimizer_state_gets_the_parameter_specs():
  params = init_params(get_config('tiny'), jax.random.key(0))
  opt_state = jax.eval_shape(optax.adamw(1e-3).init, params)
  specs = sharding.param_partition_specs(opt_state, _mesh())
  adam = specs[0]
  assert adam.count == P()
  assert adam.mu['layers_2']['mlp']['down_proj']['kernel'] == P('tensor', 'fsdp')
  assert adam.nu['lm_head']['kernel'] == P('fsdp', 'tensor')


def test_put_batch_splits_rows_over_data_and_fsdp():
  mesh = _mesh(2, 2, 2)
  assert sharding.batch_devices(mesh) == 4
  batch = {'tokens_BxT': np.arange(8 * 3).reshape(8, 3), 'step': np.int32(7)}
  out = sharding.put_batch(batch, mesh)
  tokens = out['tokens_BxT']
  assert tokens.sharding == sharding.batch_sharding(mesh)
  # 4 batch shards of 2 rows, each held by the 2 devices of the tensor axis.
  assert {s.data.shape for s in tokens.addressable_shards} == {(2, 3)}
  np.testing.assert_array_equal(tokens, batch['tokens_BxT'])
  assert out['step'].sharding.spec == P() and int(out['step']) == 7
  with pytest.raises(ValueError, match=r'batch leaf tokens_BxT: batch size 6'):
    sharding.put_batch({'tokens_BxT': np.zeros((6, 3))}, mesh)


def _batch(config, B=8, T=12, seed=0):
  rng = np.random.default_rng(seed)
  tokens_BxT = rng.integers(0, config.vocab_size, (B, T)).astype(np.int32)
  lengths_B = rng.integers(T // 2, T + 1, (B,)).astype(np.int32)
  return {'tokens_BxT': tokens_BxT, 'lengths_B': lengths_B}


def _loss(config, params, batch):
  """Mean next-token cross-entropy over each row's valid positions."""
  tokens_BxT, lengths_B = batch['tokens_BxT'], batch['lengths_B']
  logits_BxTxV = logits(config, params, tokens_BxT, lengths_B)[:, :-1]
  targets_BxT = tokens_BxT[:, 1:]
  mask_BxT = jnp.arange(targets_BxT.shape[1])[None, :] < (lengths_B[:, None] - 1)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, targets_BxT)
  return jnp.sum(nll * mask_BxT) / jnp.sum(mask_BxT)


def test_sharded_forward_and_adamw_step_equal_single_device():
  config = get_config('tiny')
  params = init_params(config, jax.random.key(1))
  batch = _batch(config)
  # Adam's first update is lr * g / (|g| + eps): with the default eps=1e-8 a gradient of ~1e-8
  # (rare embedding rows) turns summation-order noise into a visible difference, so eps is raised.
  optimizer = optax.adamw(1e-3, eps=1e-5, weight_decay=0.1)

  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(lambda p: _loss(config, p, batch))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  single_device = jax.devices()[0]
  on_one = jax.device_put((params, optimizer.init(params), batch), single_device)
  want_logits = jax.jit(lambda p, b: logits(config, p, b['tokens_BxT'], b['lengths_B']))(
      on_one[0], on_one[2])
  want_params, want_opt, want_loss = jax.jit(step)(*on_one)

  mesh = _mesh(2, 2, 2)
  param_sh = sharding.param_shardings(params, mesh)
  opt_sh = sharding.param_shardings(jax.eval_shape(optimizer.init, params), mesh)
  batch_sh = jax.tree_util.tree_map(lambda _: sharding.batch_sharding(mesh), batch)
  s_params = sharding.shard_params(params, mesh)
  s_opt = jax.jit(optimizer.init, out_shardings=opt_sh)(s_params)
  s_batch = sharding.put_batch(batch, mesh)

  got_logits = jax.jit(lambda p, b: logits(config, p, b['tokens_BxT'], b['lengths_B']),
                       in_shardings=(param_sh, batch_sh))(s_params, s_batch)
  np.testing.assert_allclose(got_logits, want_logits, atol=2e-5, rtol=0)

  sharded_step = jax.jit(step, in_shardings=(param_sh, opt_sh, batch_sh),
                         out_shardings=(param_sh, opt_sh, NamedSharding(mesh, P())),
                         donate_argnums=(0, 1))
  got_params, got_opt, got_loss = sharded_step(s_params, s_opt, s_batch)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
  assert got_params['layers_0']['mlp']['gate_proj']['kernel'].sharding.spec == P('fsdp', 'tensor')
  # Adam's first step moves each weight by about lr = 1e-3; agree to 1% of that.
  jax.tree_util.tree_map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5, rtol=0),
                         got_params, want_params)
  jax.tree_util.tree_map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-7, rtol=1e-4),
                         got_opt[0].mu, want_opt[0].mu)
  moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), got_params, params)
  assert min(jax.tree_util.tree_leaves(moved)) > 1e-4


def test_initialize_multihost_arguments():
  with pytest.raises(ValueError, match='give all of coordinator, num_processes and process_id'):
    sharding.initialize_multihost(coordinator='localhost:1234')
  with pytest.raises(ValueError, match=r'process_id=2 not in \[0, 2\)'):
    sharding.initialize_multihost('localhost:1234', num_processes=2, process_id=2)


def test_initialize_multihost_starts_a_one_process_cluster():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  code = textwrap.dedent(f"""
      import jax
      from ac2_jax import sharding
      sharding.initialize_multihost('localhost:{port}', num_processes=1, process_id=0)
      assert jax.distributed.is_initialized()
      mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=-1))
      print('OK', jax.process_count(), dict(mesh.shape))
  """)
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu',
         'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                          timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "OK 1 {'data': 1, 'fsdp': 2, 'tensor': 1}" in result.stdout


def test_shard_params_never_aliases_the_callers_arrays():
  params = {'norm': {'scale': jnp.ones((128,))}, 'embed_tokens': {'embedding': np.ones((8, 4))}}
  rules = sharding.DEFAULT_RULES[0], sharding.DEFAULT_RULES[-1]
  out = sharding.shard_params(params, _mesh(), rules)
  assert out['embed_tokens']['embedding'].sharding.spec == P('tensor', 'fsdp')
  jax.jit(lambda p: p, donate_argnums=0)(out)  # deletes `out`'s buffers
  assert not params['norm']['scale'].is_deleted()
  np.testing.assert_array_equal(params['norm']['scale'], 1.0)
