"""The separate value-head critic and the algorithms on it (PPO with GAE, PACT), on the tiny model.

One build per algorithm (module fixtures), shared by the tests: PPO at lambda = 1 (the advantage
identity A_t = R - V(s_t) and a whole step); PPO at its default lambda stopped after a step and
resumed from an orbax checkpoint; one PACT step with the critic's attention frozen (its
actor-then-critic order checked by hand from the stored log-probs, and the frozen parameters);
a PPO build whose critic starts from another checkpoint; the paper-scale arguments' validation.
Then one `loop.train` step of every config file and argument, after the steps above so that their
programs come from the compilation cache.
Responses are cut at 16 tokens so that every batch pads to one length bucket and each jitted
program compiles once. The task is `LengthCreditTask`, so rewards vary and the actor has real
gradients.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax import models
from ac2_jax.algorithms import ppo as ppo_lib
from ac2_jax.algorithms import timing
from ac2_jax.learner import updates, value_critic
from ac2_jax.models import value as value_model
from ac2_jax.rl import critic_loss
from ac2_jax.train import bench_setting, checkpointing, compare, experiment, loop
from train_fixtures import (check_one_step, comparable, compile_cache,  # noqa: F401
                            is_finite_number, length_credit_build_task, load_config,
                            read_records, tiny_config, train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')

# 4 problems x 2 responses: one 8-row batch over the 8 test devices, two 4-row minibatches.
ROWS = {'problems_per_step': 4, 'responses_per_problem': 2}
# Responses of at most 16 tokens (cut short: LengthCreditTask still varies their rewards): every
# batch of every step then pads to one length bucket, so each jitted program compiles once.
BUDGET = 16


def _small(name, **extra):
  """The sizes above as tiny_config overrides, plus `extra`."""
  return {**{f'{name}__{k}': v for k, v in ROWS.items()}, 'controller__response_budget': BUDGET,
          **extra}


def _build(train_base, tmp_path_factory, name, arg='', **extra):
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
    c = tiny_config(train_base, name, arg, **_small(name, **extra))
    rt, algorithm, state = experiment.build(c, str(tmp_path_factory.mktemp(name)),
                                            log=lambda *_: None)
  return c, rt, algorithm, state


@pytest.fixture(scope='module')
def ppo_built(train_base, tmp_path_factory):
  return _build(train_base, tmp_path_factory, 'ppo', 'lambda1')


@pytest.fixture(scope='module')
def pact_stepped(train_base, tmp_path_factory):
  """PACT with the critic's attention frozen, and one step of it: (config, runtime, algorithm,
  state before, state after, metrics)."""
  c, rt, algorithm, state = _build(train_base, tmp_path_factory, 'pact', 'frozen')
  assert rt.value_settings.freeze_attention
  new_state, metrics = algorithm.step(rt, _copy(state), 1, experiment.step_key(c.seed, 1))
  return c, rt, algorithm, state, new_state, metrics


def _copy(tree):
  """A private copy: the jitted updates donate (consume) their input state."""
  return jax.tree.map(lambda x: jax.device_put(x, x.sharding, may_alias=False), tree)


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _tokens(row):
  return jnp.asarray(np.concatenate([row.context_P, row.new_N])[None])


# One row at a time, unpadded: independent of the batch layout the algorithms use.
_row_value_logits = jax.jit(value_model.value_logits, static_argnums=0)
_row_logprobs = jax.jit(updates.sequence_logprobs, static_argnums=(0, 3))


def test_clipped_value_loss_by_hand():
  # Token 1 inside the clip; token 2 moved past +0.2 with its target beyond (clipped term
  # larger); token 3 moved past -0.2 toward its target (unclipped term larger).
  v, v_old, g = [0.5, 0.9, 0.1], [0.4, 0.5, 0.5], [0.6, 1.0, 0.0]
  loss_sum, count = critic_loss.clipped_value_loss(jnp.array([v]), jnp.array([v_old]),
                                                   jnp.array([g]), jnp.ones((1, 3)), clip=0.2)
  by_hand = [max((0.5 - 0.6) ** 2, (0.5 - 0.6) ** 2),   # 0.01
             max((0.9 - 1.0) ** 2, (0.7 - 1.0) ** 2),   # 0.09 (clipped V = 0.7)
             max((0.1 - 0.0) ** 2, (0.3 - 0.0) ** 2)]   # 0.09 (clipped V = 0.3)
  assert by_hand == pytest.approx([0.01, 0.09, 0.09])
  assert float(count) == 3.0
  assert float(loss_sum) / 3 == pytest.approx(sum(by_hand) / 3, rel=1e-6)


def test_ppo_lambda1_advantages_are_reward_minus_value_and_a_step_trains(ppo_built):
  c, rt, algorithm, state = ppo_built
  assert algorithm.settings.lam == 1.0 and algorithm.settings.gamma == 1.0
  state = _copy(state)
  key = experiment.step_key(c.seed, 1)
  data, returns = algorithm.rollouts(rt, state, 1, key, timing.PhaseTimer())
  assert len(set(data.rewards_R.tolist())) > 1  # varied rewards: nonzero advantages
  for row, values, reward, ret in zip(data.rows, data.values, data.rewards_R, returns):
    n = len(row.new_N)
    assert row.advantages_N.shape == values.shape == (n,)
    np.testing.assert_allclose(row.advantages_N, reward - values, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ret, np.full(n, reward), rtol=0, atol=1e-6)
    # V(s_t) of token t is the head at position t - 1: the first generated token is valued by
    # the last context token.
    z = np.asarray(_row_value_logits(rt.model_config, state.value_params, _tokens(row)))
    c0 = len(row.context_P)
    np.testing.assert_allclose(values, z[0, c0 - 1:c0 - 1 + n], rtol=1e-5, atol=1e-6)

  before = _host({'policy': state.params, 'value': state.value_params})
  new_state, metrics = algorithm.step(rt, state, 1, key)
  after = _host({'policy': new_state.params, 'value': new_state.value_params})
  for part in ('policy', 'value'):
    moved = jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), before[part], after[part])
    assert max(jax.tree.leaves(moved)) > 0, part
  for key_ in ('actor1/grad_norm', 'actor2/grad_norm', 'critic/update_norm'):
    assert metrics[key_] > 0, key_
  for key_ in ('critic/loss', 'critic_error', 'critic/explained_variance', 'critic/abs_error',
               'adv/abs_mean', 'time/value_reads', 'time/critic_updates'):
    assert is_finite_number(metrics[key_]), key_
  assert metrics['critic/skipped'] == 0.0 and metrics['actor1/skipped'] == 0.0
  assert int(new_state.step) == 2  # two actor minibatches


def test_frozen_attention_leaves_attention_bitwise_unchanged(pact_stepped):
  _, rt, _, state, new_state, metrics = pact_stepped
  assert metrics['critic/update_norm'] > 0 and metrics['critic/skipped'] == 0.0
  before = jax.tree_util.tree_leaves_with_path(_host(state.value_params))
  after = jax.tree.leaves(_host(new_state.value_params))
  frozen_names, trained_changed = [], []
  for (path, x), y in zip(before, after):
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    if value_critic.is_frozen(path):
      frozen_names.append(name)
      assert x.tobytes() == y.tobytes(), f'{name} moved'
    elif not np.array_equal(x, y):
      trained_changed.append(name)
  assert any('self_attn/q_proj' in n for n in frozen_names)
  assert 'embed_tokens/embedding' in frozen_names
  assert 'value_head/kernel' in trained_changed
  assert any('/mlp/' in n for n in trained_changed)
  # Frozen parameters hold no Adam moments.
  unfrozen = dataclasses.replace(rt.value_settings, freeze_attention=False)
  moments = lambda settings: len(jax.tree.leaves(jax.eval_shape(
      value_critic.value_optimizer(settings).init, state.value_params)))
  assert moments(rt.value_settings) < moments(unfrozen)


def test_pact_critic_learns_from_the_updated_policy(pact_stepped):
  c, rt, algorithm, before, new_state, metrics = pact_stepped
  # The same rows again (generation is a pure function of params and key).
  data = algorithm.rollouts(rt, before, 1, experiment.step_key(c.seed, 1), timing.PhaseTimer())
  for row, v, reward in zip(data.rows, data.values, data.rewards_R):
    np.testing.assert_allclose(row.advantages_N, reward - v, atol=1e-6)
    assert np.all((v > 0) & (v < 1))  # a sigmoid critic

  def by_hand(params):
    rho, keep, targets = [], [], []
    for row, reward in zip(data.rows, data.rewards_R):
      logp = np.asarray(_row_logprobs(rt.model_config, params, _tokens(row),
                                      rt.update_settings.temperature))[0]
      c0 = len(row.context_P)
      r = np.exp(logp[c0:c0 + len(row.new_N)] - row.logprobs_N)
      k = (r >= 0) & (r <= algorithm.settings.max_ratio)
      rho.append(r), keep.append(k), targets.append(np.where(k, r * reward, 0.0))
    return rho, keep, targets

  rho, keep, targets = by_hand(new_state.params)
  got = algorithm.critic_targets(rt, new_state.params, data)
  for i in range(len(data.rows)):
    np.testing.assert_allclose(got.rho[i], rho[i], rtol=1e-4)
    np.testing.assert_array_equal(got.masks[i] > 0, keep[i])
    np.testing.assert_allclose(got.targets[i], targets[i], rtol=1e-4, atol=1e-7)
  all_rho, all_keep = np.concatenate(rho), np.concatenate(keep)
  assert metrics['pact/rho_mean'] == pytest.approx(float(all_rho.mean()), rel=1e-5)
  assert metrics['pact/kept_fraction'] == pytest.approx(float(all_keep.mean()))
  # The step read rho from the policy after its actor steps, not the one that sampled.
  rho_before = np.concatenate(by_hand(before.params)[0])
  assert abs(float(rho_before.mean()) - metrics['pact/rho_mean']) > 1e-4
  assert metrics['critic/update_norm'] > 0 and metrics['actor1/update_norm'] > 0
  assert is_finite_number(metrics['critic/loss']) and is_finite_number(metrics['critic_error'])


def test_ppo_resume_from_a_checkpoint_equals_uninterrupted(ppo_built, tmp_path):
  """Steps 1-2 straight, against step 1, an orbax checkpoint of the state and the host state
  (what loop.train saves), a fresh PPO restored from it, and step 2. The default GAE lambda."""
  c, rt, built, state = ppo_built
  settings = dataclasses.replace(built.settings, lam=0.95)
  make = lambda: ppo_lib.PPO(rt, settings, experiment.validate(c).controller, c.seed)
  keys = {step: experiment.step_key(c.seed, step) for step in (1, 2)}
  straight, records = make(), {}
  state_a = _copy(state)
  for step in (1, 2):
    state_a, records[step] = straight.step(rt, state_a, step, keys[step])

  first = make()
  state_b, record_1 = first.step(rt, _copy(state), 1, keys[1])
  ckpt = checkpointing.Checkpointer(str(tmp_path / 'checkpoints'))
  ckpt.save(1, state_b, {'algorithm': first.state_dict()})
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        state_b)
  del state_b, first  # the run stops: nothing of it but the checkpoint survives
  step, restored, host = ckpt.restore(target)
  ckpt.close()
  assert step == 1 and isinstance(restored, value_critic.ActorCriticState)
  resumed = make()
  resumed.load_state_dict(host['algorithm'])
  state_b, record_2 = resumed.step(rt, restored, 2, keys[2])

  for step, record in ((1, record_1), (2, record_2)):
    assert comparable(record) == comparable(records[step]), f'step {step} differs'
    for key in ('critic/loss', 'critic_error', 'actor1/grad_norm', 'critic/update_norm'):
      assert is_finite_number(record[key]) and record[key] != 0, (step, key)
  a, b = _host(state_a), _host(state_b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)
  # The critic's body (it started as the policy) trained, so equal critic parameters mean
  # something; so did the policy.
  start = _host(state)
  for part in ('value_params', 'params'):
    moved = jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))),
                         getattr(a, part), getattr(start, part))
    assert max(jax.tree.leaves(moved)) > 0, part


def test_ppo_critic_warmup_trains_the_critic_only_k_times_per_minibatch(ppo_built):
  c, rt, built, state = ppo_built
  settings = dataclasses.replace(built.settings, critic_warmup_steps=1, critic_updates=2)
  warm = ppo_lib.PPO(rt, settings, experiment.validate(c).controller, c.seed)
  before = _host(state)
  new_state, metrics = warm.step(rt, _copy(state), 1, experiment.step_key(c.seed, 1))
  after = _host(new_state)
  for x, y in zip(jax.tree.leaves(before.params), jax.tree.leaves(after.params)):
    assert x.tobytes() == y.tobytes()
  assert int(new_state.step) == 0 and metrics['critic_warmup'] == 1.0
  assert not [k for k in metrics if k.startswith('actor')]
  assert metrics['critic/updates'] == 2 * rt.actor_minibatches and metrics['critic/skipped'] == 0
  assert not np.array_equal(before.value_params['value_head']['kernel'],
                            after.value_params['value_head']['kernel'])


def test_compare_and_config_arguments_reach_ppo_and_pact():
  m = compare.parse_method('ppo:lambda1+frozen')
  c = load_config(m.config_name, m.config_arg('bench'))
  assert (c.algorithm, c.ppo.lam, c.value_critic.freeze_attention) == ('ppo', 1.0, True)
  assert c.num_steps == bench_setting.apply_bench(load_config('grpo')).num_steps
  c = load_config(compare.parse_method('pact').config_name, 'qwen3_4b')
  assert (c.algorithm, c.actor.learning_rate, c.value_critic.learning_rate) == ('pact', 1e-6, 5e-6)
  assert c.pact.problems_per_step * c.pact.responses_per_problem == 256 * 16
  with pytest.raises(ValueError, match='unknown PPO config arguments'):
    load_config('ppo', 'no_audit')


def test_critic_body_starts_from_a_given_checkpoint(train_base, tmp_path_factory):
  """value_critic.init_checkpoint: the critic's body is that checkpoint's (of the policy's
  architecture, other weights), the policy keeps its own, and the head starts fresh."""
  _, sft_dir = train_base
  config, _ = models.load_hf_checkpoint(sft_dir)
  other = models.init_params(config, jax.random.key(7))
  path = str(tmp_path_factory.mktemp('critic_checkpoint'))
  models.save_hf_checkpoint(config, other, path)
  c, _, _, state = _build(train_base, tmp_path_factory, 'ppo', value_critic__init_checkpoint=path)
  assert c.value_critic.init_checkpoint == path
  got, policy, want = _host(state.value_params), _host(state.params), _host(other)
  assert sorted(got) == sorted([k for k in want if k != 'lm_head'] + [value_model.HEAD])
  body = {k: v for k, v in got.items() if k != value_model.HEAD}
  for (path_, x), y, p in zip(jax.tree_util.tree_leaves_with_path(body),
                              jax.tree.leaves({k: want[k] for k in body}),
                              jax.tree.leaves({k: policy[k] for k in body})):
    np.testing.assert_array_equal(x, y, err_msg=str(path_))
    if x.ndim > 1:  # matrices: random, unlike the warm start's (norm scales start at 1)
      assert not np.array_equal(x, p), path_
  assert np.abs(got[value_model.HEAD]['kernel']).max() > 0
  assert float(got[value_model.HEAD]['bias']) == 0.0


def test_critic_checkpoint_of_another_architecture_or_no_checkpoint_is_a_config_error(
    train_base, tmp_path):
  _, sft_dir = train_base  # a 2-layer `tiny`
  policy = models.load_hf_checkpoint(sft_dir)[0]
  wider = tmp_path / 'wider'
  wider.mkdir()
  (wider / 'config.json').write_text(json.dumps(policy.replace(hidden_size=64).to_hf_dict()))
  cases = [
      ({'value_critic__init_checkpoint': str(tmp_path / 'none')},
       f"config.value_critic.init_checkpoint='{tmp_path / 'none'}' has no config.json"),
      ({'value_critic__init_checkpoint': str(wider)},
       f"config.value_critic.init_checkpoint='{wider}' is not of the policy's architecture: "
       'hidden_size 64 (policy 128)'),
      # The SFT warm start of the 4-layer preset as the policy.
      ({'value_critic__init_checkpoint': sft_dir, 'model__init_checkpoint': ''},
       'is not of the policy\'s architecture: num_layers 2 (policy 4)'),
  ]
  for extra, message in cases:
    for name in ('ppo', 'pact'):
      with pytest.raises(experiment.ConfigError) as e:
        experiment.validate(tiny_config(train_base, name, **_small(name, **extra)))
      assert message in str(e.value) and '\n' not in str(e.value), str(e.value)
  # AC2 has no value critic: the key is not read.
  experiment.validate(tiny_config(train_base, 'ac2', value_critic__init_checkpoint=str(wider)))


def test_paper_scale_arguments_validate(tmp_path):
  """configs/{ppo,pact}.py:qwen3_4b[,ARG] with the files the proof task needs (config.json only:
  validation reads no weights). Their dry runs take ~40 s each on this CPU, so they are not run
  here (test_dry_run.py runs the documented AC2 ones)."""
  dirs = {name: tmp_path / name for name in ('qwen3_4b', 'qwen3_0_6b', 'train', 'validation')}
  for name, d in dirs.items():
    d.mkdir()
    if name.startswith('qwen3'):
      (d / 'config.json').write_text(json.dumps(models.get_config(name).to_hf_dict()))

  def config(name, arg, **critic):
    c = load_config(name, arg)
    c.model.init_checkpoint = str(dirs['qwen3_4b'])
    c.task.proofs_train_dir, c.task.proofs_validation_dir = (str(dirs['train']),
                                                             str(dirs['validation']))
    c.judge.base_url, c.judge.model = 'http://localhost:8000/v1', 'judge'
    c.value_critic.update(critic)
    return c

  for name, arg in (('ppo', 'qwen3_4b'), ('ppo', 'qwen3_4b,lambda1'), ('ppo', 'qwen3_4b,frozen'),
                    ('pact', 'qwen3_4b'), ('pact', 'qwen3_4b,frozen')):
    s = experiment.validate(config(name, arg), num_devices=8)
    assert s.value.learning_rate == 5e-6 and s.value.freeze_attention == ('frozen' in arg)
    assert s.sft is None and s.judges is not None
    if name == 'ppo':
      assert s.ppo.lam == (1.0 if 'lambda1' in arg else 0.95)
  # The critic from another checkpoint of the policy's architecture, or not.
  experiment.validate(config('ppo', 'qwen3_4b', init_checkpoint=str(dirs['qwen3_4b'])), 8)
  with pytest.raises(experiment.ConfigError, match=r'hidden_size 1024 \(policy 2560\)'):
    experiment.validate(config('pact', 'qwen3_4b', init_checkpoint=str(dirs['qwen3_0_6b'])), 8)


# One `loop.train` step of every value-critic config file and argument (the step's own logic is
# tested above): the config file, metrics.jsonl, evaluation, checkpoint, TensorBoard, plots.
SMOKE = (('ppo', ''), ('ppo', 'lambda1'), ('ppo', 'frozen'), ('pact', ''), ('pact', 'frozen'))


@pytest.mark.parametrize('name, arg', SMOKE)
def test_one_step_of_each_config_through_loop_train(train_base, tmp_path, monkeypatch, name,
                                                    arg):
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  # Evaluation samples as the rollouts do, so it reuses their compiled decoder.
  c = tiny_config(train_base, name, arg, **_small(name, eval__temperature=0.8, eval__top_p=1.0,
                                                   eval__top_k=0))
  summary = loop.train(c, str(tmp_path), log=lambda *_: None)
  records = read_records(str(tmp_path))
  assert sorted(records) == [0, 1]
  record = records[1]
  check_one_step(str(tmp_path), summary, record)
  with open(tmp_path / 'config.json') as f:
    written = json.load(f)
  assert written['algorithm'] == name
  assert written['value_critic']['freeze_attention'] == (arg == 'frozen')
  assert record['rows_trained'] == ROWS['problems_per_step'] * ROWS['responses_per_problem']
  assert record['critic/updates'] == 2 and record['critic/skipped'] == 0.0  # K=1 x 2 minibatches
  assert record['critic/update_norm'] > 0
  for key in ('critic/loss', 'critic_error', 'critic/abs_error', 'critic/value_mean'):
    assert is_finite_number(record[key]), key
  if name == 'ppo':
    assert written['ppo']['lam'] == (1.0 if arg == 'lambda1' else 0.95)
    assert is_finite_number(record['eps_high']) and record['eps_high'] > 0
  else:  # DIS: no PPO clip
    assert 'eps_high' not in record
    assert 0.0 < record['pact/kept_fraction'] <= 1.0
