"""`bench.py sampler`: its work accounting, and its worker processes on a tiny exported model."""

import importlib.util

import jax
import numpy as np
import pytest

from ac2_jax import models
from ac2_jax.bench import decode_profile, roofline, spawn
from ac2_jax.rl import flops as flops_lib

HAVE_TRANSFORMERS = all(importlib.util.find_spec(m) for m in ('torch', 'transformers'))


@pytest.mark.parametrize('preset', ['tiny', 'small'])
def test_num_params_counts_the_model(preset):
  config = models.get_config(preset)
  shapes = jax.eval_shape(lambda: models.init_params(config, jax.random.key(0)))
  assert roofline.num_params(config) == sum(x.size for x in jax.tree.leaves(shapes))


def test_generate_cost_is_a_prefill_plus_the_decoding_forwards():
  config = models.get_config('tiny')
  a, b = flops_lib.coefficients(config)
  head = 2 * config.hidden_size * config.vocab_size
  p, g, batch = 32, 9, 4
  flops_1, bytes_1 = roofline.generate_cost(config, batch, p, 1)
  # The prefill: the body at every prompt position, the head at the last, causal attention.
  assert flops_1 == batch * ((a - head) * p + head + b * p * (p + 1) // 2)
  kv = roofline.kv_bytes_per_position(config)
  assert bytes_1 == roofline.weight_bytes(config) + batch * p * kv
  flops_g, bytes_g = roofline.generate_cost(config, batch, p, g)
  assert flops_g - flops_1 == batch * flops_lib.decoding_flops(config, p, g)
  # Each decoding forward reads the weights and the filled cache, and writes one position.
  assert bytes_g - bytes_1 == sum(roofline.weight_bytes(config) + batch * (p + j) * kv
                                  for j in range(1, g))
  # An untied input embedding is only gathered from, never read whole.
  assert roofline.weight_bytes(config) == 4 * (roofline.num_params(config)
                                               - config.vocab_size * config.hidden_size)


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """A tiny random checkpoint in Hugging Face layout, its in-process logits and 3 prompts."""
  root = tmp_path_factory.mktemp('bench_sampler')
  config = models.get_config('tiny', num_layers=2)
  params = models.init_params(config, jax.random.key(0))
  models.save_hf_checkpoint(config, params, str(root / 'checkpoint'))
  prompts_NxP = np.random.RandomState(0).randint(0, config.vocab_size, (3, 12))
  np.save(root / 'prompts.npy', prompts_NxP)
  expected_NxV = np.asarray(models.logits(config, params, prompts_NxP)[:, -1])
  job = {'checkpoint': str(root / 'checkpoint'), 'prompts': str(root / 'prompts.npy'),
         'new_tokens': 4}
  return root, job, expected_NxV


def test_our_worker_computes_the_logits_and_times_generate(exported):
  root, job, expected_NxV = exported
  spawn.run('ac2_jax.bench.sampler_jax', {**job, 'task': 'logits', 'out': str(root / 'ours.npy')})
  np.testing.assert_allclose(np.load(root / 'ours.npy'), expected_NxV, atol=1e-5)
  result = spawn.run('ac2_jax.bench.sampler_jax', {
      **job, 'task': 'throughput', 'batches': [1, 3], 'temperature': 0.8, 'repeats': 2,
      'chunk': 2})
  for batch in ('1', '3'):
    run = result['runs'][batch]
    assert len(run['seconds']) == 2 and run['median'] > 0 and run['warmup'] > 0
  assert 'chunk' in result['runs']['3'] and 'chunk' not in result['runs']['1']


def test_transformers_worker_runs_the_same_model(exported):
  assert HAVE_TRANSFORMERS, ('the reference engine needs torch and transformers: '
                             'pip install -e ".[bench]"')
  root, job, expected_NxV = exported
  env = {'OMP_WAIT_POLICY': 'PASSIVE'}
  spawn.run('ac2_jax.bench.sampler_hf', {**job, 'task': 'logits', 'out': str(root / 'hf.npy')},
            env=env)
  np.testing.assert_allclose(np.load(root / 'hf.npy'), expected_NxV, atol=1e-4)
  result = spawn.run('ac2_jax.bench.sampler_hf', {
      **job, 'task': 'throughput', 'batches': [3], 'temperature': 0.8, 'repeats': 1,
      'threads': [1, 2]}, env=env)
  run = result['runs']['3']
  assert run['threads'] in (1, 2) and set(run['warmups']) == {'1', '2'} and run['median'] > 0


def test_a_failing_worker_reports_its_error():
  with pytest.raises(spawn.WorkerFailed, match='unknown task'):
    spawn.run('ac2_jax.bench.sampler_jax', {'task': 'nonsense'})


def test_decode_profile_attributes_the_loop_to_model_and_sampling():
  assert decode_profile.group_of('Decoder/layers_0/mlp/up_proj/dot_general') == 'matmuls'
  assert decode_profile.group_of('Decoder/layers_1/self_attn/bkmd,bkds->bkms/dot_general') == (
      'attention')
  assert decode_profile.group_of('Decoder/layers_1/self_attn/vmap(vmap())/scatter') == (
      'cache writes')
  assert decode_profile.group_of('Decoder/layers_0/self_attn/q_norm/reduce_sum') == 'model, other'
  assert decode_profile.group_of('vmap(jit(_gumbel))/jit(_uniform)/vmap()/while') == 'sampling'
  config = models.get_config('tiny', num_layers=1)
  result = decode_profile.profile(config, batch=2, prompt_len=8, new_tokens=5)
  assert result['steps'] == 4 and result['prefill'] > 0
  assert {'matmuls', 'attention', 'sampling'} <= set(result['loop'])
  assert all(seconds > 0 for seconds in result['loop'].values())
