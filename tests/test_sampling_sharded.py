"""Sampler on 8 fake CPU devices: mesh data=2, fsdp=2, tensor=2 gives the single-device tokens."""

import jax
import numpy as np
import pytest

from ac2_jax import models
from ac2_jax import sampling
from ac2_jax import sharding

CONFIG = models.get_config('tiny')
SETTINGS = sampling.SamplingSettings(temperature=0.8)


@pytest.fixture(scope='module')
def setup():
  assert len(jax.devices()) == 8, 'tests/conftest.py fakes 8 CPU devices'
  params = models.init_params(CONFIG, jax.random.key(2))
  params = {**params, 'lm_head': {'kernel': params['lm_head']['kernel'] * 10.0}}
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  return params, mesh, sharding.shard_params(params, mesh)


def contexts(lengths, seed=0):
  rng = np.random.RandomState(seed)
  return [rng.randint(0, CONFIG.vocab_size, size=n).astype(np.int32) for n in lengths]


def test_sharded_tokens_equal_single_device(setup):
  params, mesh, sharded = setup
  # Heads really are split over 'tensor' (not replicated), so the test exercises tensor parallelism.
  q_spec = sharded['layers_0']['self_attn']['q_proj']['kernel'].sharding.spec
  assert q_spec[1] == 'tensor'
  ctx = contexts([5, 9, 3, 14, 7, 2])
  caps = [10, 4, 12, 8, 12, 6]
  single = sampling.generate(CONFIG, params, ctx, caps, SETTINGS, jax.random.key(4), stop_ids=(3,))
  multi = sampling.generate(CONFIG, sharded, ctx, caps, SETTINGS, jax.random.key(4),
                            stop_ids=(3,), mesh=mesh)
  np.testing.assert_array_equal(multi.tokens_NxT, single.tokens_NxT)
  np.testing.assert_array_equal(multi.num_new_N, single.num_new_N)
  np.testing.assert_array_equal(multi.stop_reason_N, single.stop_reason_N)
  np.testing.assert_allclose(multi.logprobs_NxT, single.logprobs_NxT, atol=1e-4)
  np.testing.assert_allclose(multi.entropies_NxT, single.entropies_NxT, atol=1e-4)


def test_sharded_token_distribution_equals_single_device(setup):
  params, mesh, sharded = setup
  ctx = contexts([5, 9, 3], seed=1)
  single = sampling.token_distribution(CONFIG, params, ctx, [1, 2, 3])
  multi = sampling.token_distribution(CONFIG, sharded, ctx, [1, 2, 3], mesh=mesh)
  np.testing.assert_allclose(multi, single, rtol=1e-4)
