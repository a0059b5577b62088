"""`bench.py train`: the batch shapes it measures, and its batches."""

import numpy as np

from ac2_jax import models
from ac2_jax.bench import roofline
from ac2_jax.bench import train as bench
from ac2_jax.rl import flops as flops_lib
from train_fixtures import load_config


def test_default_shapes_are_a_default_runs_update_batches():
  c = load_config('ac2')
  shapes = bench.default_shapes(c)
  ctl = c.controller
  # Half of the 16 x 8 trained rows, each a 49-token prompt plus the 80-token budget (training
  # bucket 144).
  assert shapes.prompt_tokens == 49
  assert shapes.actor == (ctl.n_batch * ctl.group_size // c.actor.minibatches, 144)
  rows, length = shapes.critic
  assert rows == ctl.critic_pairs_per_update
  # A critic context holds the prompt, the prefix, a reference and the value tokens.
  assert shapes.prompt_tokens + int(ctl.max_cut_fraction * ctl.response_budget) < length
  assert length <= c.critic.max_context + 64


def test_batches_train_on_the_response_and_the_value_tokens():
  actor = bench.actor_batch(4, 32, 10, vocab=50)
  mask = np.asarray(actor.loss_mask_BxT)
  assert mask[:, :10].sum() == 0 and mask[:, 10:].min() == 1
  assert set(np.unique(np.asarray(actor.advantages_BxT)[:, 10:])) <= {-1.0, 1.0}
  critic = bench.critic_batch(4, 32, vocab=50)
  assert np.asarray(critic.target_mask_BxT).sum(axis=1).tolist() == [4] * 4


def test_update_flops_is_three_forwards_of_every_position():
  config = models.get_config('tiny')
  a, b = flops_lib.coefficients(config)
  assert roofline.update_flops(config, 2, 10) == 3 * 2 * (a * 10 + b * 55)


def test_update_groups_name_the_part_of_the_step():
  group = bench.update_group
  assert group('jit(actor_update)/jvp(Decoder)/layers_0/mlp/up_proj/dot_general') == 'matmuls'
  assert group('jit(actor_update)/transpose(jvp(Decoder))/layers_1/mlp/jit(silu)') == (
      'MLP elementwise')
  assert group('jit(actor_update)/jvp(Decoder)/layers_0/self_attn/btkgd,bskd->bkgts/'
               'dot_general') == 'attention block'
  assert group('jit(actor_update)/transpose(jvp(Decoder))/lm_head/dot_general') == 'matmuls'
  assert group('jit(actor_update)/transpose(jvp())/pad') == 'loss'
  assert group('jit(actor_update)/mul') == 'optimizer'


def test_steps_medians_leave_out_step_1_and_ratios_are_to_the_first_method():
  from ac2_jax.bench import steps
  def record(step_time, generate, actor, tokens):
    return {'step_time': step_time, 'time/generate': generate, 'time/actor': actor,
            'tokens_generated': tokens, 'decoding_flops': 10.0 * tokens}
  records = {'ac2': [record(50.0, 40.0, 9.0, 1), record(3.0, 1.0, 2.0, 10),
                     record(5.0, 2.0, 3.0, 30), record(4.0, 1.5, 2.5, 20)],
             # a phase only AC2 has (the critic update) is still a row
             'grpo': [record(30.0, 25.0, 5.0, 1), record(2.0, 1.0, 1.0, 40),
                      record(2.0, 1.0, 1.0, 40)]}
  medians = steps.phase_medians(records['ac2'])
  assert medians == {'step_time': 4.0, 'time/actor': 2.5, 'time/generate': 1.5,
                     'tokens_generated': 20.0, 'decoding_flops': 200.0}
  for i, r in enumerate(records['ac2']):
    r['time/critic_update'] = float(i)
  lines = steps.table(records, 'grpo').splitlines()
  assert lines[0].split()[-3:] == ['/', 'grpo:', 'ac2']
  row = {line[:26].strip(): line[26:].split() for line in lines[1:]}
  assert row['step (median of 2..N)'] == ['4.00', '2.00', '2.00x']
  assert row['actor'] == ['2.50', '1.00', '2.50x']
  assert row['critic_update'] == ['2.00', '0.00', '-']
  assert row['step 1 (compiles)'] == ['50.00', '30.00']
  assert row['tokens_generated / step'] == ['20', '40']


def test_steps_methods_must_share_the_warm_start():
  import pytest
  from ac2_jax.bench import steps
  from ac2_jax.train import compare
  ac2 = steps.method_config('ac2:no_audit', '', 3, ['sampling.temperature=1.0'])
  assert ac2.seed == 3 and ac2.sampling.temperature == 1.0 and ac2.controller.no_audit
  grpo = steps.method_config('grpo', '', 3, ['sampling.temperature=1.0'])
  compare.check_shared_warm_start({'ac2': ac2, 'grpo': grpo})
  other = steps.method_config('grpo', '', 3, ['sft.steps=7'])
  with pytest.raises(ValueError, match=r"grpo differs from ac2 in \['sft.steps'\]"):
    compare.check_shared_warm_start({'ac2': ac2, 'grpo': other})


def test_compile_clock_counts_a_compilation_and_not_a_cached_call():
  import jax
  import jax.numpy as jnp
  from ac2_jax.algorithms import timing
  with timing.CompileClock() as clock:
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.5)  # a new function: traced and compiled here
    f(jnp.ones(5)).block_until_ready()
    assert clock.lap() > 0
    f(jnp.ones(5)).block_until_ready()
    assert clock.lap() == 0.0
  # Out of its block the clock hears nothing more.
  jax.jit(lambda x: jnp.cos(x) - 2.0)(jnp.ones(5)).block_until_ready()
  assert clock.lap() == 0.0
