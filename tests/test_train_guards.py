"""Fail early, fail clear, lose nothing: config validation before any work, the resume guard, the
keyed SFT cache, checkpoint fallback on damage, and preemption (SIGTERM) with exit status 75.

The launcher rows run `launch/tpu_run.py` in a subprocess: each asserts the exit status, one line
naming the problem (no traceback) and that nothing was lost. Validation failures exit before the
data build and the warm start, so each takes only the launcher's imports; a bad data file, a
damaged checkpoint or one with too few vocabulary rows exit after reading it, still in seconds."""

import filecmp
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers

from ac2_jax import models, tokenization
from ac2_jax.train import checkpointing, cli, experiment, loop, run_record
from ac2_jax.train import sft as sft_lib
from train_fixtures import (REPO, SMALL, apply, as_flags, comparable, compile_cache,  # noqa: F401
                            load_config, overrides, read_records, tiny_config, train_base)

STEPS = 3


def _config(name='ac2', **extra):
  """A tiny config that needs no files (validation only)."""
  return apply(load_config(name), {**SMALL, **{k.replace('__', '.'): v for k, v in extra.items()}})


@pytest.mark.parametrize('name, extra, message', [
    ('ac2', {'algorithm': 'foo'},
     "config.algorithm must be one of ('ac2', 'prefix_grpo', 'grpo', 'ppo', 'pact', 'lisao', "
     "'li2sao')"),
    ('ac2', {'model.preset': 'nope'}, 'config.model.preset must be one of'),
    ('ac2', {'controller.tau_global': -1.0}, 'tau_global must lie in (0, 1], got -1.0'),
    ('ac2', {'controller.chunk_size': -16}, 'chunk_size must be an integer >= 1, got -16'),
    ('ac2', {'eval.every': 0}, 'config.eval.every must be an integer >= 1, got 0'),
    ('ac2', {'log_every': 0}, 'config.log_every must be an integer >= 1, got 0'),
    ('ac2', {'checkpoint_every': 0}, 'config.checkpoint_every must be an integer >= 1, got 0'),
    ('ac2', {'checkpoints_kept': 0}, 'config.checkpoints_kept must be an integer >= 1, got 0'),
    ('ac2', {'num_steps': 0}, 'config.num_steps must be an integer >= 1, got 0'),
    ('ac2', {'mesh.data': 3}, 'config.mesh: MeshConfig (3, -1, 1)'),
    ('ac2', {'critic.readout': 'mode'}, "config.critic.readout must be one of ('greedy', "),
    ('ac2', {'task.builtin_modulus': 8}, 'modulus must be a prime >= 5'),
    ('ac2', {'sampling.top_p': 0.0}, 'config.sampling: SamplingSettings.top_p must be in (0, 1]'),
    ('ac2', {'sft.steps': 0}, 'config.sft.steps must be >= 1, got 0'),
    ('ac2', {'sft.critic_value_mistake_rate': 1.5},
     'config.sft.critic_value_mistake_rate must lie in [0, 1]'),
    ('ac2', {'sft.blind_fraction': 1.5}, 'config.sft.blind_fraction must lie in [0, 1]'),
    ('ac2', {'sft.blind_fraction': 0.3, 'sft.mistake_rate': 0.2},
     'config.sft.blind_fraction goes with config.sft.step_mistake_rate in the chain'),
    ('ac2', {'sft.clean_loss_target': 0.01, 'sft.clean_steps_max': 100},
     'config.sft.clean_loss_target > 0 needs 0 < sft.clean_steps <= sft.clean_steps_max'),
    ('ac2', {'sft.noisy_tail_steps': -1}, 'config.sft.noisy_tail_steps must be >= 0, got -1'),
    ('ac2', {'sft.noisy_tail_steps': 10, 'sft.noisy_tail_learning_rate': 0.0},
     'config.sft.noisy_tail_learning_rate must be > 0 when sft.noisy_tail_steps > 0'),
    ('ac2', {'controller.n_batch': 0}, 'config.controller.n_batch must be >= 1 for ac2'),
    ('ac2', {'controller.group_size': 1, 'controller.min_valid_per_target': 1},
     'config.controller.group_size must be >= 2 for ac2'),
    ('ac2', {'actor.learning_rate': 0.0}, 'config.actor.learning_rate must be > 0'),
    ('grpo', {'grpo.group_size': 1}, 'config.grpo.group_size must be >= 2, got 1'),
    ('ppo', {'ppo.lam': 1.5}, 'config.ppo: lam must lie in [0, 1], got 1.5'),
    ('ppo', {'value_critic.updates': 0}, 'config.ppo: critic_updates must be >= 1, got 0'),
    ('ppo', {'value_critic.learning_rate': 0.0},
     'config.value_critic: learning_rate must be > 0, got 0.0'),
    ('pact', {'pact.dis_low': 1.2}, 'config.pact: the DIS band must satisfy 0 <= dis_low < 1'),
    ('ppo', {'value_critic.init_checkpoint': '/no/such/dir'},
     "config.value_critic.init_checkpoint='/no/such/dir' has no config.json"),
    ('ac2', {'task.name': 'proofs'}, 'the proof task needs config.model.init_checkpoint'),
    ('ppo', {'task.rl_problems': 8}, 'config.task.rl_problems=8 is fewer than the 16 distinct'),
    ('ac2', {'task.rl_problems': 3}, 'config.task.rl_problems=3 is fewer than the 4 distinct'),
    ('grpo', {'task.rl_problems': -1}, 'config.task.rl_problems must be an integer >= 0'),
])
def test_validate_names_the_key(name, extra, message):
  with pytest.raises(experiment.ConfigError) as e:
    experiment.validate(_config(name, **extra), num_devices=1)
  assert message in str(e.value) and '\n' not in str(e.value), str(e.value)


def test_validate_accepts_every_config_file():
  for name in ('ac2', 'grpo', 'prefix_grpo', 'ppo', 'pact'):
    s = experiment.validate(_config(name), num_devices=1)
    assert s.sft is not None and s.builtin is not None and s.mesh_shape == (1, 1, 1)
    assert (s.grpo is not None) == (name == 'grpo')
    assert (s.ppo is not None, s.pact is not None) == (name == 'ppo', name == 'pact')
    assert (s.value is not None) == (name in ('ppo', 'pact'))


def test_resume_guard_lists_the_differing_keys(tmp_path):
  old = _config('ac2').to_dict()
  new = _config('grpo', num_steps=9, eval__every=3).to_dict()
  assert run_record.differences(old, new) == ["algorithm ('ac2' -> 'grpo')"]
  cached = _config('ac2', compilation_cache_dir='/tmp/cache').to_dict()
  assert run_record.differences(old, cached) == []  # where programs are kept, not what they do
  del cached['compilation_cache_dir']  # a run stored before the key existed
  assert run_record.differences(cached, old) == []
  # A run stored before a key existed resumes when the key keeps the old behaviour, not otherwise.
  stored = _config('ac2').to_dict()
  del stored['task']['rl_problems'], stored['controller']['bank_from_data'], stored['ppo']
  now = _config('ac2', task__rl_problems=0, controller__bank_from_data=False).to_dict()
  assert run_record.differences(stored, now) == []
  now['task']['rl_problems'] = 256
  assert run_record.differences(stored, now) == ["task.rl_problems (0 -> 256)"]
  # A run stored before the critic adapter existed had the paper's shared-weight critic.
  del stored['critic']['adapter_rank']
  now = _config('ac2', task__rl_problems=0, controller__bank_from_data=False).to_dict()
  assert run_record.differences(stored, now) == []
  now['critic']['adapter_rank'] = 16
  assert run_record.differences(stored, now) == ["critic.adapter_rank (0 -> 16)"]
  # A key added to a section (value_critic) after runs with that section were stored.
  stored = _config('ppo').to_dict()
  del stored['value_critic']['init_checkpoint']
  now = _config('ppo').to_dict()
  assert run_record.differences(stored, now) == []
  now['value_critic']['init_checkpoint'] = '/critic'
  assert run_record.differences(stored, now) == ["value_critic.init_checkpoint ('' -> '/critic')"]
  workdir = str(tmp_path)
  run_record.write_config(workdir, json.dumps(old))
  run_record.check_resume(workdir, json.dumps(new))  # no checkpoints: nothing to resume
  os.makedirs(os.path.join(workdir, 'checkpoints', '2'))
  with pytest.raises(run_record.ResumeRefused, match=r"algorithm \('ac2' -> 'grpo'\)"):
    run_record.check_resume(workdir, json.dumps(new))
  messages = []
  run_record.check_resume(workdir, json.dumps(new), allow_change=True, log=messages.append)
  assert 'algorithm' in messages[0]
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f) == old  # the guard writes nothing


def test_sft_cache_is_keyed_and_never_overwritten(tmp_path):
  default = tmp_path / 'sft'
  default.mkdir()
  (default / sft_lib.DONE_FILE).write_text(json.dumps({'key': 'aaaa'}))
  assert experiment.sft_directory(str(tmp_path), 'aaaa') == str(default)
  assert experiment.sft_directory(str(tmp_path), 'bbbb') == str(tmp_path / 'sft_bbbb')
  assert experiment.sft_directory(str(tmp_path / 'fresh'), 'bbbb') == str(tmp_path / 'fresh/sft')
  with pytest.raises(ValueError, match='holds a finished SFT warm start of other settings'):
    sft_lib.run_sft(experiment.models.get_config('tiny'), sft_lib.SFTSettings(steps=1),
                    iter(()), str(default))
  assert json.loads((default / sft_lib.DONE_FILE).read_text()) == {'key': 'aaaa'}


def test_sft_critic_batches_start_after_clean_steps_or_critic_from():
  steps = lambda **kw: [i for i in range(1, 11)
                        if sft_lib.is_critic_step(sft_lib.SFTSettings(critic_every=2, **kw), i)]
  assert steps(clean_steps=4) == [6, 8, 10]
  assert steps(clean_steps=4, critic_from=0) == [2, 4, 6, 8, 10]
  assert steps(clean_steps=4, critic_from=7) == [9]
  assert sft_lib.is_critic_step(sft_lib.SFTSettings(critic_every=0), 6) is False
  # A field added later is left out of the cache key at its default, so warm starts made before
  # it existed are reused; set, it makes a new one.
  model = experiment.models.get_config('tiny')
  key = lambda **kw: sft_lib.settings_key(model, sft_lib.SFTSettings(**kw), 'data')
  assert key(critic_from=-1) == key() != key(critic_from=0)


# Ways of damaging the newest checkpoint after it was written.
def _truncate(step_dir):
  path = _largest_file(os.path.join(step_dir, 'state'))
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


def _bit_flip(step_dir):
  path = _largest_file(os.path.join(step_dir, 'state'))
  data = bytearray(open(path, 'rb').read())
  data[len(data) // 2] ^= 0x10
  open(path, 'wb').write(bytes(data))


def _delete(step_dir):
  os.remove(_largest_file(os.path.join(step_dir, 'state')))


def _cut_host_json(step_dir):
  path = os.path.join(step_dir, 'host', 'metadata')
  text = open(path).read()
  open(path, 'w').write(text[:len(text) // 2])


CORRUPTIONS = {'truncated': _truncate, 'bit_flip': _bit_flip, 'deleted': _delete,
               'cut_host_json': _cut_host_json}


def _largest_file(directory):
  files = [os.path.join(r, n) for r, _, names in os.walk(directory) for n in names]
  return max(files, key=os.path.getsize)


@pytest.mark.parametrize('how', sorted(CORRUPTIONS))
def test_checkpointer_falls_back_to_the_newest_intact(tmp_path, how):
  ckpt = checkpointing.Checkpointer(str(tmp_path / 'checkpoints'), keep=3)
  state = {'w': jnp.arange(4096, dtype=jnp.float32)}
  for step in (1, 2):
    ckpt.save(step, {'w': state['w'] + step}, {'step': step, 'data': 'x' * 200})
  CORRUPTIONS[how](ckpt.step_dir(2))
  lines = []
  step, restored, host = ckpt.restore_newest_intact(state, log=lines.append)
  assert step == 1 and host['step'] == 1
  np.testing.assert_array_equal(np.asarray(restored['w']), np.arange(4096) + 1.0)
  assert lines[0].startswith(f'checkpoint {ckpt.step_dir(2)} does not restore (')
  assert 'falling back to the newest intact checkpoint, step 1' in lines[1]
  assert ckpt.latest_step() == 1 and os.path.isdir(str(tmp_path / 'checkpoints_corrupt' / '2'))
  ckpt.save(2, state, {'step': 2})  # the step saves again
  assert ckpt.restore(state)[0] == 2
  ckpt.close()


def test_checkpoints_kept_at_least_one(tmp_path):
  with pytest.raises(ValueError, match='checkpoints_kept must be an integer >= 1, got 0'):
    checkpointing.Checkpointer(str(tmp_path), keep=0)


# ---- Runs: a reference run, the launcher rows against it, fault injection, preemption. ----

@pytest.fixture(scope='module')
def reference(train_base, compile_cache, tmp_path_factory):
  """(config, workdir): an uninterrupted 3-step AC2 run, a checkpoint after every step, and a
  copy of the warm start in WORKDIR/sft (what a launcher row must leave intact)."""
  workdir = str(tmp_path_factory.mktemp('reference'))
  c = tiny_config(train_base, 'ac2', num_steps=STEPS, checkpoint_every=1, checkpoints_kept=3)
  shutil.copytree(train_base[1], os.path.join(workdir, 'sft'))
  summary = loop.train(c, workdir, log=lambda *_: None)
  assert summary.finished and summary.last_step == STEPS
  with open(os.path.join(workdir, 'summary.json')) as f:
    assert json.load(f)['finished'] is True
  return c, workdir


def _tree_digest(path):
  digest = hashlib.sha256()
  for root, dirs, names in sorted(os.walk(path)):
    dirs.sort()
    for name in sorted(names):
      full = os.path.join(root, name)
      digest.update(full[len(path):].encode() + open(full, 'rb').read())
  return digest.hexdigest()


def _env():
  """The launcher imports this checkout (not another one an editable install points to)."""
  return {**os.environ, 'PYTHONPATH': os.pathsep.join(
      [REPO] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])}


def _launch(config, workdir, flags, compile_cache=None, timeout=120):
  env = _env()
  if compile_cache:
    env.update(JAX_COMPILATION_CACHE_DIR=compile_cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0.5')
  workdir_flag = [f'--workdir={workdir}'] if workdir else []
  return subprocess.run([sys.executable, os.path.join(REPO, 'launch', 'tpu_run.py'),
                         f'--config={config}', *workdir_flag, *flags], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _assert_one_line_error(out, message):
  assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
  assert 'Traceback' not in out.stderr, out.stderr[-3000:]
  fatal = [line for line in out.stderr.splitlines() if line.startswith('FATAL')]
  assert len(fatal) == 1 and message in fatal[0], out.stderr[-2000:]


AC2 = os.path.join('configs', 'ac2.py')
GRPO = os.path.join('configs', 'grpo.py')


@pytest.mark.slow
@pytest.mark.parametrize('config, flags, message', [
    (AC2, ['--config.num_steps=abc'], 'flag --config.num_steps=abc: invalid literal for int()'),
    (AC2, ['--config.num_steps=2.5'], "invalid literal for int() with base 10: '2.5'"),
    (AC2, ['NO_WORKDIR'], 'Flag --workdir must have a value other than None'),
    (AC2 + ':bogus', [], "unknown AC2 variant 'bogus'; known: no_audit"),
    ('configs/missing.py', [], "no such file 'configs/missing.py'"),
    (AC2, ['--config.controller.chunk_size=-16'], 'chunk_size must be an integer >= 1, got -16'),
    (AC2, ['--config.eval.every=0'], 'config.eval.every must be an integer >= 1, got 0'),
    (AC2, ['--config.checkpoints_kept=0'], 'config.checkpoints_kept must be an integer >= 1'),
    (GRPO, ['--config.grpo.group_size=1'], 'config.grpo.group_size must be >= 2, got 1'),
])
def test_launcher_rejects_before_any_work(tmp_path, config, flags, message):
  workdir = tmp_path / 'run'
  no_workdir = flags == ['NO_WORKDIR']
  out = _launch(config, None if no_workdir else workdir, [] if no_workdir else flags)
  _assert_one_line_error(out, message)
  assert not workdir.exists()  # nothing written: no data build, no warm start, no config.json


@pytest.mark.slow
@pytest.mark.parametrize('config, flags, message', [
    (GRPO, [], "algorithm ('ac2' -> 'grpo')"),
    (AC2, ['--config.model.preset=small'], "model.preset ('tiny' -> 'small')"),
    (AC2, ['--config.controller.tau_global=-1'], 'tau_global must lie in (0, 1], got -1.0'),
])
def test_launcher_keeps_an_existing_run(reference, train_base, tmp_path, config, flags, message):
  """Another algorithm, another model, a bad value on a workdir that holds a run: refused, and
  config.json, the checkpoints, metrics and sft/ are as they were."""
  c, ref = reference
  workdir = str(tmp_path / 'run')
  shutil.copytree(ref, workdir)
  before = {name: _tree_digest(os.path.join(workdir, name)) for name in ('checkpoints', 'sft')}
  values = {**overrides(train_base), 'num_steps': STEPS, 'checkpoint_every': 1,
            'checkpoints_kept': 3}
  out = _launch(config, workdir, as_flags(values) + flags)
  _assert_one_line_error(out, message)
  assert filecmp.cmp(os.path.join(ref, 'config.json'), os.path.join(workdir, 'config.json'),
                     shallow=False)
  assert filecmp.cmp(os.path.join(ref, 'metrics.jsonl'), os.path.join(workdir, 'metrics.jsonl'),
                     shallow=False)
  assert before == {name: _tree_digest(os.path.join(workdir, name))
                    for name in ('checkpoints', 'sft')}


@pytest.fixture(scope='module')
def bad_checkpoints(train_base, tmp_path_factory):
  """{name: (checkpoint dir, the path its error must name)}: the warm start with its safetensors
  cut in half, and a model with 8 vocabulary rows fewer than the tokenizer has ids."""
  root = tmp_path_factory.mktemp('bad_checkpoints')
  truncated = str(root / 'truncated')
  shutil.copytree(train_base[1], truncated)
  weights = os.path.join(truncated, 'model.safetensors')
  with open(weights, 'r+b') as f:
    f.truncate(os.path.getsize(weights) // 2)
  with open(os.path.join(train_base[1], 'config.json')) as f:
    ids = json.load(f)['vocab_size']  # the warm start has a row for every tokenizer id
  small = str(root / 'small_vocabulary')
  config = models.get_config('tiny', vocab_size=ids - 8, num_layers=2)
  models.save_hf_checkpoint(config, models.init_params(config, jax.random.key(0)), small)
  return {'truncated': (truncated, weights), 'small_vocabulary': (small, small)}


@pytest.mark.slow
@pytest.mark.parametrize('name, existing, message', [
    ('truncated', False, 'not a readable safetensors file'),
    ('small_vocabulary', False, 'vocabulary rows but the tokenizer has'),
    # Resuming a run with another checkpoint (allowed explicitly) that then fails to load: the
    # run's config.json stays the one its checkpoints were written with.
    ('truncated', True, 'not a readable safetensors file'),
])
def test_launcher_rejects_a_checkpoint_that_does_not_fit(request, train_base, bad_checkpoints,
                                                         tmp_path, name, existing, message):
  checkpoint, path = bad_checkpoints[name]
  workdir = tmp_path / 'run'
  values = {**overrides(train_base), 'model.init_checkpoint': checkpoint}
  if existing:
    ref = request.getfixturevalue('reference')[1]  # built only for this case
    shutil.copytree(ref, workdir)
    before = {n: _tree_digest(str(workdir / n)) for n in ('checkpoints', 'sft')}
    values.update({'num_steps': STEPS, 'checkpoint_every': 1, 'checkpoints_kept': 3})
  out = _launch(AC2, workdir, as_flags(values) + ['--allow_config_change'] * existing)
  _assert_one_line_error(out, message)
  fatal = next(line for line in out.stderr.splitlines() if line.startswith('FATAL'))
  assert f'{path}: ' in fatal, fatal
  if not existing:
    assert not workdir.exists()  # no config.json of a run that never started
    return
  assert filecmp.cmp(os.path.join(ref, 'config.json'), workdir / 'config.json', shallow=False)
  assert before == {n: _tree_digest(str(workdir / n)) for n in ('checkpoints', 'sft')}


@pytest.mark.slow
def test_launcher_names_a_bad_data_file(tmp_path):
  """The proof task with an empty training file fails in the data build, before any model or
  judge is touched: exit 1, one line naming the file (every kind of bad file and its message:
  tests/test_proofs_data.py)."""
  checkpoint = tmp_path / 'checkpoint'  # of a checkpoint, the data build reads the tokenizer
  checkpoint.mkdir()
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.train_from_iterator(['Prove that two is even.'] * 10, trainer=tokenizers.trainers.BpeTrainer(
      vocab_size=300, show_progress=False,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  tok.add_special_tokens([tokenization.END_OF_TEXT, tokenization.IM_START, tokenization.IM_END])
  tok.add_tokens([tokenization.THINK_OPEN, tokenization.THINK_CLOSE])
  tok.save(str(checkpoint / 'tokenizer.json'))
  (checkpoint / 'config.json').write_text('{}')
  train = tmp_path / 'train'
  train.mkdir()
  (train / 'train.jsonl').write_bytes(b'')
  values = {'task.name': 'proofs', 'task.proofs_train_dir': train,
            'task.proofs_validation_dir': os.path.join(REPO, 'tests', 'fixtures', 'proofs',
                                                       'imo_proofbench_csv'),
            'task.data_dir': tmp_path / 'data', 'model.init_checkpoint': checkpoint,
            'judge.base_url': 'http://127.0.0.1:9/v1', 'judge.model': 'judge'}
  out = _launch(AC2, tmp_path / 'run', as_flags(values))
  _assert_one_line_error(out, f'{train / "train.jsonl"}: empty file: no rows')
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
@pytest.mark.parametrize('how', sorted(CORRUPTIONS))
def test_damaged_newest_checkpoint_resumes_from_the_previous(reference, tmp_path, how):
  c, ref = reference
  workdir = str(tmp_path / 'run')
  shutil.copytree(ref, workdir)
  CORRUPTIONS[how](os.path.join(workdir, 'checkpoints', str(STEPS)))
  lines = []
  summary = loop.train(c, workdir, log=lines.append)
  assert summary.finished and summary.last_step == STEPS
  damaged = os.path.join(workdir, 'checkpoints', str(STEPS))
  assert any(m.startswith(f'checkpoint {damaged} does not restore (') for m in lines), lines
  assert any('falling back to the newest intact checkpoint, step 2' in m for m in lines), lines
  assert any(m.startswith(f'resumed from step {STEPS - 1}') for m in lines), lines
  a, b = read_records(ref), read_records(workdir)
  assert sorted(a) == sorted(b) == list(range(STEPS + 1))
  for step in a:
    assert comparable(a[step]) == comparable(b[step]), f'step {step} differs'


@pytest.mark.slow
def test_sigterm_exits_75_and_the_rerun_finishes_like_the_uninterrupted_run(
    reference, train_base, compile_cache, tmp_path):
  c, ref = reference
  workdir = str(tmp_path / 'run')
  values = {**overrides(train_base), 'num_steps': STEPS, 'checkpoint_every': 100}
  env = {**_env(), 'JAX_COMPILATION_CACHE_DIR': compile_cache,
         'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0.5'}
  proc = subprocess.Popen([sys.executable, os.path.join(REPO, 'launch', 'tpu_run.py'),
                           f'--config={AC2}', f'--workdir={workdir}', *as_flags(values)],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  seen = []
  for line in proc.stdout:  # the progress line of step 1: preempt in the middle of the run
    seen.append(line)
    if line.startswith('step=1 '):
      proc.send_signal(signal.SIGTERM)
      break
  rest, err = proc.communicate(timeout=300)
  stdout = ''.join(seen) + rest
  assert proc.returncode == cli.EXIT_PREEMPTED == 75, (proc.returncode, err[-3000:])
  assert f'of {STEPS} (checkpoint saved)' in stdout and 'stopped at step ' in stdout, stdout
  assert 'validation score: start' not in stdout and 'Traceback' not in err
  with open(os.path.join(workdir, 'summary.json')) as f:
    summary = json.load(f)
  assert summary['finished'] is False and summary['last_step'] < STEPS
  # The same run again (in-process here, with the cadence keys a resume may change).
  final = loop.train(c, workdir, log=lambda *_: None)
  assert final.finished and final.last_step == STEPS
  with open(os.path.join(workdir, 'summary.json')) as f:
    assert json.load(f)['finished'] is True
  a, b = read_records(ref), read_records(workdir)
  assert sorted(a) == sorted(b) == list(range(STEPS + 1))
  for step in a:
    assert comparable(a[step]) == comparable(b[step]), f'step {step} differs'
  assert final.final_score == a[STEPS]['val/mean_score']
