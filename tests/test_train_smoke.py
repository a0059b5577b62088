"""One training step of every config file and every AC2 variant with the tiny model, end to end:
config file -> loop.train -> metrics.jsonl, TensorBoard events, orbax checkpoint, plots, summary."""

import json
import os
import subprocess
import sys

import pytest

from ac2_jax.train import checkpointing, experiment, loop
from ac2_jax.train import sft as sft_lib
from train_fixtures import (AC2_VARIANTS, REPO, as_flags, compile_cache,  # noqa: F401
                            is_finite_number, load_config, overrides, read_records, tiny_config,
                            train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')

RUNS = ([('ac2', '')] + [('ac2', v) for v in AC2_VARIANTS] + [('prefix_grpo', ''), ('grpo', '')])

# The config switch each AC2 variant argument must set (as written to WORKDIR/config.json).
VARIANT_SWITCH = {
    'no_audit': ('no_audit', True),
    'group1': ('group_size_one', True),
    'stale_buffer': ('stale_buffer', True),
    'correct_only': ('correct_only', True),
    'chunk_small': ('chunk_size', load_config('ac2').controller.chunk_size // 5),
    'no_local_readiness': ('no_local_readiness', True),
    'no_reference': ('no_reference', True),
}


def _check_common(workdir, summary, record):
  assert summary.last_step == 1
  for score in (summary.start_score, summary.final_score):
    assert is_finite_number(score) and 0.0 <= score <= 1.0
  assert is_finite_number(record['decoding_flops']) and record['decoding_flops'] > 0
  assert record['decoding_flops_cum'] == record['decoding_flops']
  assert record['tokens_generated'] > 0 and record['rows_trained'] > 0
  assert is_finite_number(record['entropy']) and record['entropy'] > 0
  assert is_finite_number(record['eps_high']) and record['eps_high'] > 0
  assert record['step_time'] > 0
  assert record['val/mean_score'] == summary.final_score  # evaluated at the last step
  assert record['judge_failures'] == 0
  for minibatch in ('actor1', 'actor2'):
    assert record[f'{minibatch}/skipped'] == 0.0
    assert record[f'{minibatch}/tokens'] > 0
    assert is_finite_number(record[f'{minibatch}/loss'])
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'))
  assert ckpt.latest_step() == 1
  ckpt.close()
  assert os.listdir(os.path.join(workdir, 'tb'))
  assert summary.plots and all(os.path.getsize(p) > 0 for p in summary.plots)
  with open(os.path.join(workdir, 'summary.json')) as f:
    assert json.load(f)['last_step'] == 1


@pytest.mark.parametrize('name,arg', RUNS, ids=[f'{n}:{a}' if a else n for n, a in RUNS])
def test_one_step(train_base, tmp_path, name, arg):
  c = tiny_config(train_base, name, arg)
  summary = loop.train(c, str(tmp_path), log=lambda *_: None)
  records = read_records(str(tmp_path))
  assert sorted(records) == [0, 1]
  assert records[0]['val/mean_score'] == summary.start_score
  record = records[1]
  _check_common(str(tmp_path), summary, record)
  with open(tmp_path / 'config.json') as f:
    written = json.load(f)
  assert written['algorithm'] == name
  if name == 'ac2':
    assert record['critic_lr'] > 0
    assert record['critic/pairs'] > 0 and record['critic/skipped'] == 0.0
    assert is_finite_number(record['critic/loss'])
    assert is_finite_number(record['critic_error'])
  else:  # no critic: nothing read from it, trained or scheduled
    assert not [k for k in record if k.startswith(('critic/', 'critic_lr', 'critic_error'))]
    assert record.get('routed_to_critic', 0) == 0 and record.get('critic_reads_invalid', 0) == 0
  if name == 'grpo':
    assert record['rows_trained'] == c.grpo.problems_per_step * c.grpo.group_size
  if arg:
    key, value = VARIANT_SWITCH[arg]
    assert written['controller'][key] == value
  # What a first step shows of the variants (the others act once problems become ready).
  n_refill = c.controller.n_refill
  if name == 'ac2' and arg == 'stale_buffer':  # the whole buffer collected at once
    assert record['num_refills'] == record['buffer_size'] == n_refill * c.controller.stale_factor
  elif name == 'ac2' and arg == 'correct_only':  # a 3-step warm start passes nothing
    assert record['num_refills'] == n_refill and record['buffer_size'] == 0
  elif name in ('ac2', 'prefix_grpo'):
    assert record['num_refills'] == record['buffer_size'] == n_refill


def test_warm_start_runs_once_and_is_reused(train_base, tmp_path):
  """No init_checkpoint: the run starts from an SFT warm start cached in WORKDIR/sft."""
  # Step 1 on correct solutions, step 2 on solutions with mistakes, step 3 on critic prompts.
  c = tiny_config(train_base, 'ac2', model__init_checkpoint='', sft__steps=3, sft__clean_steps=1,
                  sft__critic_every=2, sft__critic_batch_size=4)
  task, tok = experiment.build_task(c, str(tmp_path), None)
  messages = []
  first = experiment.initial_checkpoint(c, str(tmp_path), task, tok, log=messages.append)
  assert first == os.path.join(str(tmp_path), 'sft')
  assert os.path.isfile(os.path.join(first, 'config.json'))
  with open(os.path.join(first, sft_lib.DONE_FILE)) as f:
    done = json.load(f)
  assert done['steps'] == 3 and is_finite_number(done['final_loss'])
  critic_loss = float(messages[-1].split('critic loss ')[1].split()[0])
  assert 0 < critic_loss < 20, messages
  assert not any('reusing' in m for m in messages)
  again = experiment.initial_checkpoint(c, str(tmp_path), task, tok, log=messages.append)
  assert again == first and any('reusing' in m for m in messages)
  # Other settings (here only the data: the compiled step is the same) train again.
  c.sft.mistake_rate = 0.5
  c.sft.critic_every = 0
  messages.clear()
  experiment.initial_checkpoint(c, str(tmp_path), task, tok, log=messages.append)
  assert not any('reusing' in m for m in messages)


@pytest.mark.slow
def test_launcher_runs_a_config_with_overrides(train_base, compile_cache, tmp_path):
  """The README's command, `--config.key=value` overrides included, in a fresh process."""
  env = {**os.environ, 'JAX_COMPILATION_CACHE_DIR': compile_cache,
         'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0.5'}
  out = subprocess.run([sys.executable, os.path.join(REPO, 'launch', 'tpu_run.py'),
                        '--config=' + os.path.join(REPO, 'configs', 'grpo.py') + ':std',
                        f'--workdir={tmp_path}', *as_flags(overrides(train_base)),
                        '--config.seed=3'], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'validation score: start' in out.stdout and 'plots:' in out.stdout
  with open(tmp_path / 'config.json') as f:
    written = json.load(f)
  assert written['seed'] == 3 and written['grpo']['normalize_std'] is True
  assert written['task']['builtin_num_train'] == 300
  assert sorted(read_records(str(tmp_path))) == [0, 1]
