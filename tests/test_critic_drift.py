"""`bench.py critic_drift`: its figures by hand and the weight combinations it reads (the run-level
check is in test_train_smoke's adapter test, on a trained run's checkpoint)."""

import jax
import numpy as np

from ac2_jax import models
from ac2_jax.bench import critic_drift
from ac2_jax.learner import critic_adapter
from ac2_jax.learner import state as state_lib

CONFIG = models.get_config('tiny').replace(num_layers=1)


def test_figures_by_hand():
  f = critic_drift.figures([0.2, None, 0.6], [0.0, 0.9, 1.0])
  assert f['invalid'] == 1 and f['records'] == 3
  np.testing.assert_allclose([f['read_mean'], f['target_mean'], f['mae'], f['corr']],
                             [0.4, 1.9 / 3, 0.3, 1.0])  # the target mean over every record
  flat = critic_drift.figures([0.5, 0.5], [0.0, 1.0])
  assert np.isnan(flat['corr']) and flat['mae'] == 0.5


def test_weight_variants_pair_the_adapter_with_each_base():
  warm = models.init_params(CONFIG, jax.random.key(0))
  moved = jax.tree.map(lambda w: w + 1.0, warm)
  adapter = critic_adapter.init_adapter(warm, 2, jax.random.key(1))
  adapter = jax.tree.map(lambda x: x + 0.5, adapter)  # B != 0
  optim = state_lib.OptimSettings()
  variants = critic_drift.weight_variants(critic_adapter.init_state(warm, adapter, optim),
                                          critic_adapter.init_state(moved, adapter, optim))
  kernel = lambda p: np.asarray(p['layers_0']['mlp']['up_proj']['kernel'])
  delta = kernel(critic_adapter.merge(warm, adapter)) - kernel(warm)
  assert np.abs(delta).max() > 0
  np.testing.assert_allclose(kernel(variants['run critic W_t + A_t B_t']), kernel(moved) + delta,
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(kernel(variants['W_0 + A_t B_t']), kernel(warm) + delta, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_array_equal(kernel(variants['warm start W_0']), kernel(warm))
  np.testing.assert_array_equal(kernel(variants['policy W_t']), kernel(moved))
  # Without an adapter the run's critic is the policy itself.
  shared = critic_drift.weight_variants(state_lib.init_state(warm, optim),
                                        state_lib.init_state(moved, optim))
  assert list(shared) == ['run critic W_t', 'warm start W_0']
  np.testing.assert_array_equal(kernel(shared['run critic W_t']), kernel(moved))
