"""Faults that must not stop a run: a non-finite loss skips its update and is logged, a judge outage
becomes invalid grades counted in the metrics, critic pairs over the context limit are skipped and
counted; and a misspelt --config key stops the launcher early."""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax.algorithms import ac2 as ac2_lib
from ac2_jax.judges import grading
from ac2_jax.learner import rows as rows_lib
from ac2_jax.tasks import base as task_base
from ac2_jax.tasks import builtin
from ac2_jax.train import experiment, loop
from ac2_jax.train import metrics as metrics_lib
from train_fixtures import (REPO, as_flags, compile_cache, is_finite_number,  # noqa: F401
                            overrides, read_records, tiny_config, train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')


@pytest.fixture(scope='module')
def built(train_base, tmp_path_factory):
  c = tiny_config(train_base, 'ac2')
  rt, _, state = experiment.build(c, str(tmp_path_factory.mktemp('faults')), log=lambda *_: None)
  return c, rt, state


def _copy(state):
  """A private copy of the train state: the jitted updates donate (consume) their input state."""
  return jax.tree.map(lambda x: jax.device_put(x, x.sharding, may_alias=False), state)


def _host(tree):
  return jax.tree.map(np.asarray, tree)


def _rows(rt, advantage):
  rows = []
  for i in range(4):
    new = rt.train_prompts[i + 1][-6:]  # any in-vocabulary tokens serve as a "response"
    rows.append(rows_lib.Row(problem_index=i, context_P=rt.train_prompts[i], prefix_len=0,
                            new_N=new, logprobs_N=np.full(len(new), -6.0, np.float32),
                            entropies_N=np.full(len(new), 6.0, np.float32), stop_reason='eos',
                            advantage=advantage, weight=1.0))
  return rows


def test_nan_loss_skips_the_actor_update(built):
  _, rt, state = built
  eps_high = jnp.float32(0.28)
  before = _host(_copy(state))
  skipped, metrics = rt.actor_step(_copy(state), rows_lib.actor_batch(rt, _rows(rt, np.nan)),
                                   eps_high)
  assert float(metrics['skipped']) == 1.0
  assert not np.isfinite(float(metrics['loss']))
  assert float(metrics['update_norm']) == 0.0
  for name in ('params', 'actor_opt_state', 'critic_opt_state'):
    for x, y in zip(jax.tree.leaves(getattr(before, name)),
                    jax.tree.leaves(getattr(skipped, name))):
      np.testing.assert_array_equal(x, np.asarray(y))
  # The same batch with a finite advantage does move the weights.
  moved, metrics = rt.actor_step(_copy(state), rows_lib.actor_batch(rt, _rows(rt, 1.0)), eps_high)
  assert float(metrics['skipped']) == 0.0 and np.isfinite(float(metrics['loss']))
  changed = [not np.array_equal(x, np.asarray(y))
             for x, y in zip(jax.tree.leaves(before.params), jax.tree.leaves(moved.params))]
  assert any(changed)


def test_nan_loss_in_a_training_step_is_logged(built, tmp_path):
  """A NaN advantage in the first actor minibatch of a real AC2 step: that update is skipped, the
  step carries on (critic update, second minibatch) and its record says so."""
  c, rt, state = built
  real_step = rt.actor_step
  calls = []

  def first_minibatch_poisoned(state, batch, eps_high):
    calls.append(eps_high)
    if len(calls) == 1:
      batch = batch.replace(advantages_BxT=batch.advantages_BxT * jnp.nan)
    return real_step(state, batch, eps_high)

  poisoned = dataclasses.replace(rt, actor_step=first_minibatch_poisoned)
  algorithm = ac2_lib.AC2(poisoned, experiment.controller_settings(c), c.seed)
  _, record = algorithm.step(poisoned, _copy(state), 1, experiment.step_key(c.seed, 1))
  assert len(calls) == 2
  assert record['actor1/skipped'] == 1.0 and record['actor1/update_norm'] == 0.0
  assert record['actor2/skipped'] == 0.0 and record['actor2/update_norm'] > 0
  assert record['critic/skipped'] == 0.0 and record['critic/update_norm'] > 0
  logger = metrics_lib.MetricsLogger(str(tmp_path))
  logger.write(1, record)
  logger.close()
  logged = read_records(str(tmp_path))[1]
  assert logged['actor1/skipped'] == 1.0
  assert logged['actor1/loss'] is None  # non-finite values are written as JSON null
  assert is_finite_number(logged['actor2/loss'])


class OutageTask(builtin.BuiltinTask):
  """The built-in task behind a judge that fails on every third response it is asked about."""

  def __init__(self, inner: builtin.BuiltinTask):
    super().__init__(inner.settings, {s: inner.records(s) for s in task_base.SPLITS})
    self.calls = 0
    self.failures = []  # invalid grades returned, per score_batch call

  def score_batch(self, records, responses):
    grades = super().score_batch(records, responses)
    failed = 0
    for i in range(len(grades)):
      if (self.calls + i) % 3 == 0:
        grades[i] = grading.invalid_grade(grading.STATUS_HTTP_ERROR, 'HTTP 503 (judge outage)')
        failed += 1
    self.calls += len(grades)
    self.failures.append(failed)
    return grades


def test_judge_outage_and_long_critic_pairs_do_not_stop_the_run(train_base, tmp_path, monkeypatch):
  tasks = []
  real_build_task = experiment.build_task

  def build_task(*args, **kwargs):
    task, tok = real_build_task(*args, **kwargs)
    tasks.append(OutageTask(task))
    return tasks[-1], tok

  monkeypatch.setattr(experiment, 'build_task', build_task)
  # critic.max_context=0: the context limit is the prompt plus the response budget, shorter than
  # any critic prompt (which adds the critic's instruction to the response).
  # The long instruction: the short one would fit.
  c = tiny_config(train_base, 'ac2', num_steps=2, critic__max_context=0,
                  task__builtin_critic_prompt='long')
  summary = loop.train(c, str(tmp_path), log=lambda *_: None)
  assert summary.last_step == 2 and len(tasks) == 1
  records = read_records(str(tmp_path))
  # score_batch calls in order: evaluation at step 0, then per step one training call, and
  # evaluation after the last step.
  failures = tasks[0].failures
  assert len(failures) == 4
  assert records[0]['val/judge_failures'] == failures[0] > 0
  assert records[1]['judge_failures'] == failures[1] > 0
  assert records[2]['judge_failures'] == failures[2] > 0
  assert records[2]['val/judge_failures'] == failures[3] > 0
  for step in (1, 2):
    assert records[step]['actor1/skipped'] == 0.0 and records[step]['actor2/skipped'] == 0.0
    assert is_finite_number(records[step]['reward/judged_mean'])
    assert records[step]['critic/pairs'] == 0 and records[step]['critic/skipped_context'] > 0
  # Critic reads of too-long contexts (values at prefixes) come back invalid, not as errors.
  assert sum(records[step]['critic_reads_invalid'] for step in (1, 2)) > 0
  assert is_finite_number(summary.final_score)


@pytest.mark.slow
@pytest.mark.parametrize('override, message', [
    ('--config.nonexistent=1', "unknown config key 'nonexistent' in --config.nonexistent=1"),
    ('--config.sft.stepz=1', "unknown config key 'sft.stepz' in --config.sft.stepz=1 "
                             '(Did you mean "steps" instead of "stepz"?)'),
])
def test_unknown_config_key_is_an_error(train_base, tmp_path, override, message):
  workdir = tmp_path / 'run'
  flags = as_flags(overrides(train_base)) + [override]
  out = subprocess.run([sys.executable, os.path.join(REPO, 'launch', 'tpu_run.py'),
                        '--config=' + os.path.join(REPO, 'configs', 'ac2.py'),
                        f'--workdir={workdir}', *flags], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode != 0
  # One line naming the key, not a traceback out of the flag parser.
  assert message in out.stderr and 'Traceback' not in out.stderr, out.stderr
  assert not workdir.exists()  # rejected before anything ran
