"""Shared pieces of the trainer tests: tiny configs from the real config files, one data set and one
SFT warm start per test session, a compilation cache for the repeated builds, and a task variant
with varied rewards.

Pytest caches a session fixture per module that imports it, so `train_base` keeps its work in a
fixed directory under the session's base temp dir: the tfds build and the SFT run are cached there
(SFT by its settings key), and a second test file reuses them instead of training again.

The warm start is a 2-layer `tiny` model (the SFT code of the trainer, 3 steps): every run of these
tests compiles the actor and critic updates afresh, and XLA compile time grows with depth.

A 3-step warm start earns 0 points on the built-in task, so every advantage is 0 and the actor
loss too. Tests that need real actor gradients use `LengthCreditTask` (the built-in task with
another verifier) through `length_credit_build_task`; run as a script, this file trains a tiny
config with it in a fresh process (for runs on another number of devices):

  python tests/train_fixtures.py OVERRIDES_JSON WORKDIR
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys

import jax
import pytest

from ac2_jax import models
from ac2_jax.judges import grading
from ac2_jax.tasks import base as task_base
from ac2_jax.tasks import builtin, builtin_sft
from ac2_jax.train import checkpointing, experiment, loop
from ac2_jax.train import sft as sft_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, 'configs')
AC2_VARIANTS = ('no_audit', 'group1', 'stale_buffer', 'correct_only', 'chunk_small',
                'no_local_readiness', 'no_reference')
NUM_LAYERS = 2

# Dotted config keys -> values of a test run (the algorithm and variant switches stay as loaded).
SMALL = {
    'num_steps': 1,
    'checkpoint_every': 100,
    'sft.steps': 3,
    'sft.batch_size': 8,
    'task.builtin_num_train': 300,
    'task.builtin_num_validation': 16,
    'controller.group_size': 4,
    'controller.n_batch': 4,
    'controller.n_refill': 4,
    'controller.buffer_capacity': 16,
    'controller.min_valid_per_target': 2,
    'controller.critic_pairs_per_update': 8,
    'controller.critic_buffer_capacity': 32,
    'grpo.problems_per_step': 4,
    'grpo.group_size': 4,
    'sampling.max_batch': 64,
    'eval.every': 100,  # evaluation at step 0 and at the last step only
    'eval.num_problems': 4,
    'eval.num_responses': 2,
}


def load_config(name: str, arg: str = ''):
  """`configs/<name>.py:get_config(arg)`, imported by path (configs/ is not a package)."""
  path = os.path.join(CONFIGS, f'{name}.py')
  spec = importlib.util.spec_from_file_location(f'configs_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def overrides(train_base, **extra) -> dict:
  """SMALL plus the shared data and warm start plus `extra` (dotted keys spelled with '__')."""
  data_dir, sft_dir = train_base
  out = {**SMALL, 'task.data_dir': data_dir, 'model.init_checkpoint': sft_dir}
  out.update({k.replace('__', '.'): v for k, v in extra.items()})
  return out


def apply(c, values: dict):
  for dotted, value in values.items():
    *parents, leaf = dotted.split('.')
    node = c
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def as_flags(values: dict) -> list[str]:
  """The same overrides as `--config.key=value` flags of launch/tpu_run.py."""
  return [f'--config.{k}={v}' for k, v in values.items()]


def tiny_config(train_base, name: str, arg: str = '', **extra):
  return apply(load_config(name, arg), overrides(train_base, **extra))


@pytest.fixture(scope='session')
def train_base(tmp_path_factory):
  """(data_dir, sft_dir): the built-in data set and a 3-step SFT warm start, built once."""
  root = os.path.join(str(tmp_path_factory.getbasetemp()), 'train_base')
  c = apply(load_config('ac2'), {**SMALL, 'task.data_dir': os.path.join(root, 'data')})
  task, tok = experiment.build_task(c, root, None)
  model_config = models.get_config(c.model.preset, vocab_size=tok.vocab_size,
                                   num_layers=NUM_LAYERS)
  settings = sft_lib.SFTSettings(steps=c.sft.steps, batch_size=c.sft.batch_size,
                                 seq_len=c.sft.seq_len, seed=c.seed)
  examples = builtin_sft.sft_examples(task, tok, mistake_rate=settings.mistake_rate, seed=c.seed,
                                      epochs=None)
  sft_dir = sft_lib.run_sft(model_config, settings, examples, os.path.join(root, 'sft'),
                            data_key='train_fixtures', log=lambda *_: None)
  return c.task.data_dir, sft_dir


@pytest.fixture(scope='module')
def compile_cache():
  """The suite's persistent compilation cache directory (tests/conftest.py turns the cache on for
  every test process and, through the environment, the subprocesses they start): the modules that
  rebuild trainers name it, and pass it on explicitly to the launchers they run."""
  return os.environ['JAX_COMPILATION_CACHE_DIR']


def xla_flags(devices: int) -> str:
  """This process's XLA flags (conftest.py's cheap compile passes) for a child process that fakes
  `devices` CPU devices."""
  flags = re.sub(r'--xla_force_host_platform_device_count=\d+', '', os.environ.get('XLA_FLAGS', ''))
  return f'--xla_force_host_platform_device_count={devices} {flags.strip()}'.strip()


def read_records(workdir: str) -> dict[int, dict]:
  """metrics.jsonl of a run as {step: record}; a step logged twice is an error."""
  records = {}
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    for line in f:
      record = json.loads(line)
      assert record['step'] not in records, f'step {record["step"]} logged twice'
      records[record['step']] = record
  return records


def check_one_step(workdir: str, summary, record: dict) -> None:
  """What every algorithm's one-step `loop.train` run on LengthCreditTask writes: the step-1
  metrics `record` with real actor updates on both minibatches, evaluations at steps 0 and 1, an
  orbax checkpoint, TensorBoard events, plots and the summary. (`eps_high` is the caller's: PACT's
  DIS actor loss has no PPO clip.)"""
  assert summary.last_step == 1
  for score in (summary.start_score, summary.final_score):
    assert is_finite_number(score) and 0.0 <= score <= 1.0
  assert is_finite_number(record['decoding_flops']) and record['decoding_flops'] > 0
  assert record['decoding_flops_cum'] == record['decoding_flops']
  assert record['tokens_generated'] > 0 and record['rows_trained'] > 0
  assert is_finite_number(record['entropy']) and record['entropy'] > 0
  assert record['step_time'] > 0
  assert 0 <= record['time/compile'] < record['step_time']  # inside the step's phases
  assert record['val/mean_score'] == summary.final_score  # evaluated at the last step
  assert record['judge_failures'] == 0
  # LengthCreditTask: varied rewards, so real advantages and real actor updates.
  assert record['adv/abs_mean'] > 0
  for minibatch in ('actor1', 'actor2'):
    assert record[f'{minibatch}/skipped'] == 0.0
    assert record[f'{minibatch}/tokens'] > 0
    assert is_finite_number(record[f'{minibatch}/loss'])
    assert record[f'{minibatch}/grad_norm'] > 0 and record[f'{minibatch}/update_norm'] > 0
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'))
  assert ckpt.latest_step() == 1
  ckpt.close()
  assert os.listdir(os.path.join(workdir, 'tb'))
  assert summary.plots and all(os.path.getsize(p) > 0 for p in summary.plots)
  with open(os.path.join(workdir, 'summary.json')) as f:
    assert json.load(f)['last_step'] == 1


def comparable(record: dict) -> dict:
  """A metrics record without its wall-clock timings (step_time, time/*), which never repeat."""
  return {k: v for k, v in record.items() if k != 'step_time' and not k.startswith('time/')}


def is_finite_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class LengthCreditTask(builtin.BuiltinTask):
  """The built-in task with a verifier that gives len(response) mod 8 points: responses of an
  untrained model vary in length, so groups get varied rewards and the actor real gradients."""

  def __init__(self, inner: builtin.BuiltinTask):
    super().__init__(inner.settings, {s: inner.records(s) for s in task_base.SPLITS})

  def score(self, record, response_text):
    return grading.Grade(points=len(response_text) % (grading.MAX_POINTS + 1))


def length_credit_build_task(real_build_task):
  """A stand-in for `experiment.build_task` that returns the LengthCreditTask variant."""

  def build_task(*args, **kwargs):
    task, tok = real_build_task(*args, **kwargs)
    return LengthCreditTask(task), tok
  return build_task


if __name__ == '__main__':
  values, workdir = json.loads(sys.argv[1]), sys.argv[2]
  experiment.build_task = length_credit_build_task(experiment.build_task)
  summary = loop.train(apply(load_config('ac2'), values), workdir, log=lambda *_: None)
  print(f'trained to step {summary.last_step} on {jax.device_count()} devices')
