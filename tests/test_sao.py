"""LiSAO and Li2SAO (synchronous): the switch gate under scripted statistics, the advantages and
critic targets by hand, and runs of the config files through `loop.train` on the tiny model.

Host-only tests first (the gate, GAE with the per-trajectory lambda, the bootstrap's targets and
statistics on hand-made rows). Then two runs share the compiled programs (module compilation
cache): LiSAO for two steps (a critic-only warm-up step, then actor and critic), and Li2SAO for one
step with T_max = 1, so the gate opens after it, resumed from its checkpoint for a second step
that must sample single responses with the same number of trajectories, and keep the gate's state.
Sizes as in test_value_critic.py: 8 trajectories per step, responses cut at 16 tokens (one length
bucket), LengthCreditTask for varied rewards.
"""

import dataclasses
import json

import numpy as np
import pytest

from ac2_jax import models
from ac2_jax.algorithms import li2sao as li2sao_lib
from ac2_jax.algorithms import lisao as lisao_lib
from ac2_jax.algorithms import value_steps
from ac2_jax.controller.switch_gate import GateSettings, SwitchGate
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import value_rows
from ac2_jax.train import bench_setting, compare, experiment, loop, run_record
from train_fixtures import (compile_cache, is_finite_number, length_credit_build_task,  # noqa: F401
                            load_config, read_records, tiny_config, train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')

BUDGET = 16
# 8 trajectories per step: Li2SAO 4 problems x 2 (then 8 x 1), LiSAO 8 x 1.
SIZES = {'lisao': {'lisao__problems_per_step': 8},
         'li2sao': {'li2sao__problems_per_step': 4, 'li2sao__group_size': 2}}


def _small(name, **extra):
  # Evaluation samples as the rollouts do, so it reuses their compiled decoder.
  return {**SIZES[name], 'controller__response_budget': BUDGET, 'eval__temperature': 0.8,
          'eval__top_p': 1.0, 'eval__top_k': 0, **extra}


# --- The gate (host only) ---------------------------------------------------------------------


def _run_gate(settings, stats):
  """Feeds (e, a) per step from step 1; returns the gate and the step whose call opened it."""
  gate, opened = SwitchGate(settings), []
  for step, (e, a) in enumerate(stats, start=1):
    if gate.observe(step, e, a):
      opened.append(step)
  return gate, opened


def test_gate_opens_exactly_when_the_statistics_say_and_never_closes():
  # beta = 0: the EMAs are the step's own statistics, so readiness can be scripted step by step.
  s = GateSettings(ema_beta=0.0, min_explained_variance=0.2, min_ranking_accuracy=0.65,
                   ready_steps=3, min_steps=4, max_steps=100)
  good, low_e, low_a = (0.5, 0.9), (0.2, 0.9), (0.5, 0.65)  # thresholds are strict
  # Steps 1-3 ready but before T_min; 4, 5 count; 6 resets (a at the threshold); 7 counts; 8 has
  # no mixed group (None: the EMAs stand, still ready, so it counts); 9 is the third in a row.
  stats = [good] * 5 + [low_a, good, (None, None), good, low_e, low_e]
  counters = []
  gate = SwitchGate(s)
  for step, (e, a) in enumerate(stats, start=1):
    opened = gate.observe(step, e, a)
    counters.append(gate.counter)
    assert opened == (step == 9), step
    assert gate.switched == (step >= 9), step
  assert counters == [0, 0, 0, 1, 2, 0, 1, 2, 3, 3, 3]  # after step 9 nothing changes
  assert gate.switch_step == 9
  gate, opened = _run_gate(s, [good, good, good, low_e] + [good] * 2)
  assert opened == [] and not gate.switched and gate.counter == 2
  # T_max: never ready, the gate opens at T_max exactly, and stays open.
  gate, opened = _run_gate(dataclasses.replace(s, max_steps=7), [low_e] * 12)
  assert opened == [7] and gate.switch_step == 7
  # A round trip through the checkpoint's JSON keeps everything, the switch included.
  restored = SwitchGate(s)
  restored.load_state_dict(json.loads(json.dumps(gate.state_dict())))
  assert restored.state_dict() == gate.state_dict() and restored.switched
  assert not restored.observe(20, 0.0, 0.0) and restored.switch_step == 7


def test_gate_ema_starts_at_zero():
  gate = SwitchGate(GateSettings(ema_beta=0.9, min_steps=1, ready_steps=1))
  gate.observe(1, 1.0, 1.0)
  assert gate.ema_explained_variance == pytest.approx(0.1)
  gate.observe(2, 0.5, 1.0)
  assert gate.ema_explained_variance == pytest.approx(0.9 * 0.1 + 0.1 * 0.5)
  assert gate.ema_ranking_accuracy == pytest.approx(0.19)
  assert not gate.switched  # 0.14 < eta_e


# --- Advantages and targets on hand-made rows (host only) ---------------------------------------


def _rollouts(new_tokens, values, rewards):
  rows = [rows_lib.Row(problem_index=i, context_P=np.array([1, 2], np.int32), prefix_len=0,
                       new_N=np.array(t, np.int32), logprobs_N=np.zeros(len(t), np.float32),
                       entropies_N=np.zeros(len(t), np.float32), stop_reason='eos', weight=1.0)
          for i, t in enumerate(new_tokens)]
  return value_steps.Rollouts(rows, np.array(rewards, np.float32), 0, 0.0,
                              [np.array(v, np.float32) for v in values])


def test_skip_observation_gae_with_the_per_trajectory_lambda_by_hand():
  data = _rollouts([[5, 6], [5, 7, 8]], [[0.2, 0.6], [0.5, 0.3, 0.1]], [1.0, 0.0])
  advantages, returns = lisao_lib.sao_advantages(data, gamma=1.0, lambda_alpha=1.5)
  # L = 2: lambda = 1 - 1/3 = 2/3. Deltas (V(s_{t+1}) - V(s_t), then R - V): .4, .4.
  # A_1 = .4, A_0 = .4 + 2/3 x .4.
  np.testing.assert_allclose(advantages[0], [0.4 + 2 / 3 * 0.4, 0.4], atol=1e-6)
  # L = 3: lambda = 1 - 1/4.5 = 7/9. Deltas -.2, -.2, -.1.
  a2 = -0.1
  a1 = -0.2 + 7 / 9 * a2
  np.testing.assert_allclose(advantages[1], [-0.2 + 7 / 9 * a1, a1, a2], atol=1e-6)
  # The critic's targets are the lambda = 1 returns: R on every token (gamma = 1).
  np.testing.assert_allclose(returns[0], [1.0, 1.0], atol=1e-6)
  np.testing.assert_allclose(returns[1], [0.0, 0.0, 0.0], atol=1e-6)


def test_bootstrap_targets_masks_and_statistics_by_hand():
  # Two groups of two. Group 0: R = 1, 0, responses diverge at position 1. Group 1: equal rewards
  # (dropped from the critic, zero advantage). V(s_T) is the read at each last token.
  data = _rollouts([[5, 6, 7], [5, 8], [4, 4], [4, 3, 2]],
                   [[0.0, 0.1, 0.4], [0.0, -0.2], [0.3, 0.3], [0.1, 0.2, 0.9]],
                   [1.0, 0.0, 0.5, 0.5])
  boot = li2sao_lib.bootstrap(data, group_size=2, eps=0.0)
  # (R - mu) / sigma with the n - 1 standard deviation: +-0.5 / sqrt(0.5).
  for row, a in zip(data.rows, [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5), 0.0, 0.0]):
    np.testing.assert_allclose(row.advantages_N, np.full(len(row.new_N), a), atol=1e-6)
  for target, z in zip(boot.targets, [0.5, -0.5, 0.0, 0.0]):
    np.testing.assert_allclose(target, z)
  for mask, want in zip(boot.masks, [[0, 1, 1], [0, 1], [0, 0], [0, 0, 0]]):
    np.testing.assert_array_equal(mask, want)
  # Kept rows: Z = [.5, -.5], V(s_T) = [.4, -.2]; Z - V = [.1, -.3]: 1 - Var .04 / Var .25.
  assert boot.explained_variance == pytest.approx(1 - 0.04 / 0.25, rel=1e-5)
  assert boot.ranking_accuracy == 1.0 and boot.mixed_fraction == 0.5
  # The ranking term's pairs: one, inside group 0.
  assert value_rows.count_pairs([0, 0, 1, 1], data.rewards_R) == 1
  same = li2sao_lib.bootstrap(_rollouts([[5], [6]], [[0.1], [0.2]], [1.0, 1.0]), 2, 1e-6)
  assert same.explained_variance is None and same.ranking_accuracy is None


# --- Configs, compare, resume of stored runs (no build) -----------------------------------------


def test_configs_compare_and_stored_runs(tmp_path):
  for name, warmup in (('lisao', 10), ('li2sao', 0)):
    c = load_config(name)
    assert c.algorithm == name and c.value_critic.freeze_attention
    assert (c.value_critic.updates, c.value_critic.warmup_steps) == (2, warmup)
    s = experiment.validate(c, num_devices=8)
    assert s.value.freeze_attention and s.value.loss == 'clipped_mse'
    b = load_config(compare.parse_method(name).config_name, 'bench')
    assert b.num_steps == bench_setting.apply_bench(load_config('grpo')).num_steps
    with pytest.raises(ValueError, match='unknown'):
      load_config(name, 'lambda1')
  s = experiment.validate(load_config('li2sao'), num_devices=8)
  assert s.li2sao.trajectories == 128 and s.value.rank_coef == 0.1
  assert (s.li2sao.gate.min_steps, s.li2sao.gate.max_steps, s.li2sao.gate.ready_steps) == (20, 40,
                                                                                           10)
  assert experiment.validate(load_config('lisao'), num_devices=8).lisao.problems_per_step == 128
  # Paper scale validates with the files the proof task needs (config.json only: no weights read).
  for d in ('qwen3_4b', 'train', 'validation'):
    (tmp_path / d).mkdir()
  (tmp_path / 'qwen3_4b' / 'config.json').write_text(
      json.dumps(models.get_config('qwen3_4b').to_hf_dict()))
  for name in ('lisao', 'li2sao'):
    c = load_config(name, 'qwen3_4b')
    c.model.init_checkpoint = str(tmp_path / 'qwen3_4b')
    c.task.proofs_train_dir = str(tmp_path / 'train')
    c.task.proofs_validation_dir = str(tmp_path / 'validation')
    c.judge.base_url, c.judge.model = 'http://localhost:8000/v1', 'judge'
    s = experiment.validate(c, num_devices=8)
    assert s.value.learning_rate == 5e-6 and s.value.freeze_attention and s.judges is not None
    if name == 'li2sao':
      assert (s.li2sao.gate.min_steps, s.li2sao.gate.max_steps, s.li2sao.trajectories) == (
          60, 150, 128)
      assert c.actor.micro_batch % s.li2sao.responses_per_problem == 0
    else:
      assert s.lisao.problems_per_step == 128
  # A group must not straddle a minibatch or micro-batch.
  c = load_config('li2sao')
  c.li2sao.problems_per_step = 15
  with pytest.raises(experiment.ConfigError, match='li2sao.problems_per_step=15'):
    experiment.validate(c, num_devices=8)
  c = load_config('li2sao')
  c.actor.micro_batch = 12
  with pytest.raises(experiment.ConfigError, match='micro_batch=12 must be a multiple'):
    experiment.validate(c, num_devices=8)
  c = load_config('li2sao')
  c.li2sao.group_size = 1
  with pytest.raises(experiment.ConfigError, match='config.li2sao: .*responses_per_problem'):
    experiment.validate(c, num_devices=8)
  # A run stored before these sections existed resumes.
  stored = load_config('ppo').to_dict()
  del stored['lisao'], stored['li2sao']
  assert run_record.differences(stored, load_config('ppo').to_dict()) == []


# --- Runs through loop.train --------------------------------------------------------------------


def _train(train_base, workdir, monkeypatch, name, **extra):
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, name, **_small(name, **extra))
  return c, loop.train(c, str(workdir), log=lambda *_: None)


def _check_step(record, rows):
  assert record['rows_trained'] == rows and record['judge_failures'] == 0
  assert record['tokens_generated'] > 0 and record['decoding_flops'] > 0
  assert record['critic/updates'] == 4 and record['critic/skipped'] == 0.0  # K = 2 x 2 minibatches
  assert record['critic/update_norm'] > 0
  for key in ('critic/loss', 'critic_error', 'critic/abs_error', 'entropy', 'adv/mean'):
    assert is_finite_number(record[key]), key
  assert 'eps_high' not in record  # DIS: no PPO clip


def _check_actor(record):
  assert record['adv/abs_mean'] > 0
  for minibatch in ('actor1', 'actor2'):
    assert record[f'{minibatch}/skipped'] == 0.0 and record[f'{minibatch}/tokens'] > 0
    assert record[f'{minibatch}/grad_norm'] > 0 and record[f'{minibatch}/update_norm'] > 0
    assert 0.0 <= record[f'{minibatch}/masked_frac'] < 1.0


def test_lisao_warmup_step_then_a_step_through_loop_train(train_base, tmp_path, monkeypatch):
  _, summary = _train(train_base, tmp_path, monkeypatch, 'lisao', num_steps=2,
                      value_critic__warmup_steps=1)
  assert summary.finished and summary.last_step == 2
  assert is_finite_number(summary.start_score) and is_finite_number(summary.final_score)
  assert summary.plots
  records = read_records(str(tmp_path))
  assert sorted(records) == [0, 1, 2]
  for step in (1, 2):
    _check_step(records[step], rows=8)
    assert records[step]['critic_warmup'] == float(step == 1)
    assert 0.9 < records[step]['sao/lambda_mean'] < 1.0  # 1 - 1/(1.5 L), L <= 16
  assert not [k for k in records[1] if k.startswith('actor')]  # the warm-up trains the critic
  _check_actor(records[2])
  assert 'critic/pairs' not in records[2]  # no ranking term
  assert records[2]['val/mean_score'] == summary.final_score


def test_li2sao_bootstrap_step_switch_and_resume_through_loop_train(train_base, tmp_path,
                                                                   monkeypatch):
  """Step 1 bootstraps (groups of 2) and, at T_max = 1, opens the gate; the run ends there with a
  checkpoint. Resumed to 2 steps, step 2 samples one response for each of 8 problems: the switch
  came back from the checkpoint (a fresh gate would sample groups again)."""
  gate = {'li2sao__max_steps': 1, 'li2sao__min_steps': 1}
  _, summary = _train(train_base, tmp_path, monkeypatch, 'li2sao', num_steps=1, **gate)
  assert summary.finished and summary.last_step == 1 and summary.plots
  first = read_records(str(tmp_path))[1]
  _check_step(first, rows=8)
  _check_actor(first)
  assert (first['li2sao/group_size'], first['li2sao/problems']) == (2, 4)
  assert first['li2sao/switched'] == 1.0 and first['li2sao/switch_step'] == 1
  assert 0.0 < first['li2sao/critic_token_fraction'] <= 1.0
  assert first['li2sao/mixed_groups'] > 0  # LengthCreditTask: some groups of 2 differ
  assert is_finite_number(first['li2sao/explained_variance'])
  assert 0.0 <= first['li2sao/ranking_accuracy'] <= 1.0
  assert first['critic/pairs'] > 0 and is_finite_number(first['critic/rank_hinge'])
  # The pair scale makes the token-mean loss exactly L_res + alpha x (mean hinge over pairs).
  assert first['critic/loss'] == pytest.approx(
      first['critic/residual_loss'] + 0.1 * first['critic/rank_hinge'], rel=1e-5)
  # The EMAs start at 0 (beta = 0.9).
  for key in ('explained_variance', 'ranking_accuracy'):
    assert first[f'li2sao/ema_{key}'] == pytest.approx(0.1 * first[f'li2sao/{key}'], abs=1e-7)

  _, summary = _train(train_base, tmp_path, monkeypatch, 'li2sao', num_steps=2, **gate)
  assert summary.finished and summary.last_step == 2
  records = read_records(str(tmp_path))
  assert sorted(records) == [0, 1, 2] and records[1] == first
  second = records[2]
  _check_step(second, rows=8)  # the same trajectories per update
  _check_actor(second)
  assert (second['li2sao/group_size'], second['li2sao/problems']) == (1, 8)
  assert second['li2sao/switched'] == 1.0 and second['li2sao/switch_step'] == 1
  for key in ('ema_explained_variance', 'ema_ranking_accuracy', 'ready_counter'):
    assert second[f'li2sao/{key}'] == first[f'li2sao/{key}'], key  # restored, then frozen
  assert second['li2sao/explained_variance'] is None and second['li2sao/mixed_groups'] is None
  # Singletons: no ranking pairs, every model token a critic token (absolute targets).
  assert second['critic/pairs'] == 0.0 and second['li2sao/critic_token_fraction'] == 1.0
