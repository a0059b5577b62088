"""The critic probe (ac2_jax/bench/critic.py): its figures by hand, and a run on a tiny checkpoint."""

import dataclasses

import jax
import numpy as np
import pytest

from ac2_jax import critic
from ac2_jax.learner import rows as rollouts
from ac2_jax.bench import critic as probe
from ac2_jax.tasks import builtin, builtin_sft
from ac2_jax.train import experiment
from train_fixtures import compile_cache, tiny_config, train_base  # noqa: F401

PROBLEM = builtin.ChainProblem(start=11, ops='-++**++-', operands=(5, 3, 2, 4, 12, 1, 12, 3),
                               modulus=13)


def _prefix(label, rewards, scored, lines=(0, 0), position='early'):
  return probe.ProbePrefix(problem_index=0, prefix_P=np.zeros(0, np.int32), position=position,
                           label=label, rewards_G=np.asarray(rewards, np.float32),
                           chunk_ends=[None] * len(rewards), chunk_scored=np.asarray(scored),
                           lines=lines, chunk_lines=[lines] * len(rewards))


def test_figures_by_hand():
  held = [_prefix(0.2, [0.0, 0.4], [True, False]),
          _prefix(0.6, [0.6, 0.6], [True, True], position='late')]
  # Reads 0.3 and unparseable (error 1); the constant 0.4 errs 0.2 on both.
  chunk_values = [np.array([0.5, np.nan]), np.array([0.7, 0.5])]
  out = probe.figures([0.3, None], chunk_values, held, constant=0.4, tau_local=0.18)
  assert out['mae'] == pytest.approx((0.1 + 1.0) / 2)
  assert out['mae_constant'] == pytest.approx(0.2)
  assert out['under_tau_local'] == 0.5 and out['under_tau_local_constant'] == 0.0
  assert out['mae/early'] == pytest.approx(0.1) and out['mae/late'] == pytest.approx(1.0)
  assert out['invalid'] == 1
  # Endpoint values: group 1 = (critic 0.5, judge 0.4) -> advantages (0.05, -0.05); group 2 =
  # (0.7, 0.5) -> (0.1, -0.1). Monte Carlo advantages: (-0.2, 0.2) and (0, 0).
  critic_adv = np.array([0.05, -0.05, 0.1, -0.1])
  mc_adv = np.array([-0.2, 0.2, 0.0, 0.0])
  assert out['chunk_adv_corr_routed'] == pytest.approx(np.corrcoef(critic_adv, mc_adv)[0, 1])
  # Only group 2 had every chunk valued by the critic; its Monte Carlo advantages are all 0.
  assert out['chunk_adv_corr'] == 0.0
  held[1].rewards_G[:] = [0.8, 0.2]
  out = probe.figures([0.3, None], chunk_values, held, constant=0.4, tau_local=0.18)
  assert out['chunk_adv_corr'] == pytest.approx(1.0)
  assert out['chunks_scored'] == 0.75


def test_lookup_and_line_counts():
  train = [_prefix(0.2, [0.2], [False], (2, 1)), _prefix(0.4, [0.4], [False], (2, 1)),
           _prefix(0.9, [0.9], [False], (3, 3))]
  lookup = probe.Lookup(train)
  assert lookup((2, 1)) == pytest.approx(0.3) and lookup((3, 3)) == pytest.approx(0.9)
  assert lookup((5, 5)) == pytest.approx(0.5)  # unseen counts: the mean label
  task = builtin.BuiltinTask.generate(builtin.ChainSettings(num_train=50, num_validation=8))
  record = builtin.to_record(PROBLEM, 'train')
  # Two complete lines (the second wrong), a third without its line break yet.
  assert builtin_sft.lookup_key(task, record, '11-5=6\n6+3=8\n8+2=1') == (2, 1)
  leading = builtin.BuiltinTask.generate(builtin.ChainSettings(num_train=50, num_validation=8,
                                                               scoring='leading'))
  assert builtin_sft.lookup_key(leading, record, '11-5=7\n7+3=10\n') == (2, 0)
  assert builtin_sft.lookup_key(task, record, '11-5=7\n7+3=10\n') == (2, 1)


def test_probe_on_a_tiny_checkpoint(train_base, compile_cache, tmp_path):
  # The probe is readout-agnostic (it calls `read`); both readouts are read below, and the curve
  # is trained with the default one (a second curve cost 35 s of the suite for no other code).
  readout = 'expectation'
  c = tiny_config(train_base, 'ac2', **{'critic.readout': readout})
  rt, _, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  ctl_settings = experiment.controller_settings(c)
  settings = probe.ProbeSettings(num_problems=6, held_out_problems=2, group_size=3, pairs=16,
                                 pairs_per_update=8, eval_every=8)
  prefixes = probe.build_prefixes(rt, state.params, ctl_settings, settings, jax.random.key(0),
                                  rollouts.generate_rows)
  assert len({p.problem_index for p in prefixes}) == 6
  for p in prefixes:
    # The label is the grid-rounded mean of the continuations' rewards (the RL target).
    assert p.label == critic.round_to_grid(float(np.mean(p.rewards_G)))
    assert len(p.rewards_G) == len(p.chunk_ends) == 3
    assert len(p.prefix_P) % ctl_settings.cut_grid == 0 or len(p.prefix_P) == 0
    for end, scored in zip(p.chunk_ends, p.chunk_scored):
      assert len(end) <= len(p.prefix_P) + ctl_settings.chunk_size
      assert not scored or len(end) == len(p.prefix_P) + ctl_settings.chunk_size
  train, held = probe.split(prefixes, settings.held_out_problems, settings.seed)
  assert {p.problem_index for p in train}.isdisjoint({p.problem_index for p in held})
  assert len({p.problem_index for p in held}) == 2
  for any_readout in ('greedy', 'expectation'):
    values = rollouts.critic_reader(any_readout)(
        rt, state.params, [rt.train_prompts[0]] * 2, [np.zeros(0, np.int32), held[0].prefix_P],
        [None] * 2)
    assert len(values) == 2 and all(v is None or 0.0 <= v <= 1.0 for v in values)
  # The critic updates donate the state: it is not read after this.
  curve = probe.train_and_evaluate(
      rt, state, train, held, settings, learning_rate=1e-3, tau_local=0.18,
      read=rollouts.critic_reader(readout), records_batch=rollouts.critic_records_batch,
      log=lambda *_: None)
  assert [e['pairs'] for e in curve] == [0, 8, 16]
  for entry in curve:
    assert 0.0 <= entry['critic']['mae'] <= 1.0
    assert 0.0 <= entry['fit']['mae'] <= 1.0
    assert entry['lookup']['invalid'] == 0
