"""Resume: a run stopped (after a step, and by SIGTERM) and restarted from its workdir writes the
same metrics and ends with exactly the same state as a run that was never interrupted.

The runs score with `LengthCreditTask`, so the actor updates follow real (nonzero) advantages."""

import os
import signal

import jax
import numpy as np
import pytest

from ac2_jax import models
from ac2_jax.train import checkpointing, experiment, loop
from ac2_jax.train import metrics as metrics_lib
from ac2_jax.learner import state as state_lib
from train_fixtures import (comparable, compile_cache, length_credit_build_task, read_records,  # noqa: F401
                            tiny_config, train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')

STEPS = 4


def _restore(workdir, sft_dir):
  """(step, state, host) of the latest checkpoint, restored onto one device."""
  _, params = models.load_hf_checkpoint(sft_dir)
  target = state_lib.init_state(params, state_lib.OptimSettings())
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'))
  try:
    return ckpt.restore(target)
  finally:
    ckpt.close()


def _sigterm_at(step):
  """A log callback that sends this process SIGTERM when the progress line of `step` is printed,
  as a preemption would in the middle of a run."""
  lines = []

  def log(message):
    lines.append(message)
    if message.startswith(f'step={step} '):
      signal.raise_signal(signal.SIGTERM)
  return log, lines


def test_stop_and_resume_equals_uninterrupted(train_base, tmp_path, monkeypatch):
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, 'ac2', num_steps=STEPS)
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  assert loop.train(c, straight, log=lambda *_: None).last_step == STEPS

  assert loop.train(c, resumed, stop_after=2, log=lambda *_: None).last_step == 2
  assert sorted(read_records(resumed)) == [0, 1, 2]
  handler = signal.getsignal(signal.SIGTERM)
  log, lines = _sigterm_at(3)
  summary = loop.train(c, resumed, log=log)
  assert summary.last_step == 3, lines
  assert any(m.startswith('resumed from step 2') for m in lines)
  assert any(m.startswith('stopping after step 3') for m in lines)
  assert signal.getsignal(signal.SIGTERM) == handler  # the run put the old handler back
  assert _restore(resumed, train_base[1])[0] == 3
  final = loop.train(c, resumed, log=lambda *_: None)
  assert final.last_step == STEPS

  a, b = read_records(straight), read_records(resumed)
  assert sorted(a) == sorted(b) == list(range(STEPS + 1))
  for step in range(STEPS + 1):
    assert comparable(a[step]) == comparable(b[step]), f'step {step} differs after resuming'
  assert 'val/mean_score' in b[STEPS]
  # AC2's audits.jsonl is truncated on resume as metrics.jsonl is: each step once.
  audits_a, audits_b = (metrics_lib.read_metrics(os.path.join(w, metrics_lib.AUDITS_FILE))
                        for w in (straight, resumed))
  assert audits_a == audits_b and [r['step'] for r in audits_b] == list(range(1, STEPS + 1))
  assert all(a[step]['actor1/grad_norm'] > 0 for step in range(1, STEPS + 1))
  assert final.start_score == a[0]['val/mean_score']
  assert final.final_score == a[STEPS]['val/mean_score']

  step_a, state_a, host_a = _restore(straight, train_base[1])
  step_b, state_b, host_b = _restore(resumed, train_base[1])
  assert step_a == step_b == STEPS
  assert host_a == host_b  # controller, schedules, RNG counters, cumulative FLOPs
  leaves_a, tree_a = jax.tree.flatten(state_a)
  leaves_b, tree_b = jax.tree.flatten(state_b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  # The updates really moved the weights (so equal parameters mean something).
  _, sft_params = models.load_hf_checkpoint(train_base[1])
  moved = jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))),
                       state_a.params, sft_params)
  assert max(jax.tree.leaves(moved)) > 0


def test_bench_steps_from_a_run_continue_it(train_base, tmp_path, monkeypatch):
  """`bench.py steps --from_runs`: a run restored from its checkpoint (its own config, its
  controller's state) takes the steps the run would have taken next."""
  from ac2_jax.bench import steps
  from ac2_jax.train import checkpoint_eval
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, 'ac2', num_steps=STEPS)
  straight, stopped = str(tmp_path / 'straight'), str(tmp_path / 'stopped')
  loop.train(c, straight, log=lambda *_: None)
  assert loop.train(c, stopped, stop_after=2, log=lambda *_: None).last_step == 2
  source, config = checkpoint_eval.load_run(stopped)
  label = steps.run_label(stopped)
  records = steps.run_steps([label], [config], str(tmp_path / 'bench'), 2, log=lambda *_: None,
                            sources=[source])[label]
  expected = read_records(straight)
  for k, step in enumerate((3, 4)):
    for key in ('tokens_generated', 'decoding_flops', 'ready_fraction', 'reward/judged_mean'):
      assert records[k][key] == pytest.approx(expected[step][key], rel=1e-5), (step, key)
  assert steps.run_label(os.path.join(stopped, 'checkpoints', '2')) == 'stopped@2'
