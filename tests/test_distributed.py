"""Multi-process training on one machine: 2 processes x 4 fake CPU devices (gloo collectives)
against 1 process x 8 devices, from the real launcher (launch/tpu_run.py).

Run A: one process, 8 devices, 3 steps. Run B: two processes, 4 devices each, 2 steps, at the same
time as A. Then: B's metrics and parameters after two steps equal A's; both of B's processes
computed the same steps; B's checkpoint (written by two processes) resumes in one process, and its
third step equals A's. Run C: asynchronous Li2SAO on two processes, each with a rollout sub-mesh of
2 of its 4 devices beside a training mesh of the other 4, 3 steps through the switch. A one-layer
model and the built-in task at tiny sizes keep compilation short.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import SingleDeviceSharding

from ac2_jax import models
from ac2_jax.judges import local_server
from ac2_jax.train import checkpointing, experiment
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import value_critic
from ac2_jax.models import value as value_model
from train_fixtures import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, 'launch', 'tpu_run.py')
WORKER = os.path.join(REPO, 'tests', 'distributed_worker.py')
# The smallest decoder the built-in task runs with: compilation dominates these runs.
MICRO = dict(num_layers=1, hidden_size=64, intermediate_size=128, head_dim=16)
TIMEOUT_S = 600
pytestmark = pytest.mark.slow  # subprocesses: two-process runs and the launcher


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _overrides(data_dir: str, checkpoint: str, num_steps: int) -> list[str]:
  values = {
      'num_steps': num_steps, 'checkpoint_every': 2,
      # fsdp spans both processes: parameter shards and batch rows live on different hosts.
      'mesh.data': 1, 'mesh.fsdp': 4, 'mesh.tensor': 2,
      'task.builtin_num_train': 300, 'task.builtin_num_validation': 16, 'task.data_dir': data_dir,
      'model.init_checkpoint': checkpoint,
      'controller.group_size': 4, 'controller.n_batch': 4, 'controller.n_refill': 4,
      'controller.buffer_capacity': 16, 'controller.min_valid_per_target': 2,
      'controller.critic_pairs_per_update': 8, 'controller.critic_buffer_capacity': 32,
      'sampling.max_batch': 64, 'eval.every': 100, 'eval.num_problems': 4,
      'eval.num_responses': 2,
  }
  return [f'--config.{k}={v}' for k, v in values.items()]


def _env(devices: int, cache_dir: str) -> dict:
  env = dict(os.environ)
  env.update(JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags(devices), JAX_COMPILATION_CACHE_DIR=cache_dir,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0.5')
  return env


def _start(args: list[str], env: dict, log_path: str) -> tuple[subprocess.Popen, str]:
  log = open(log_path, 'w')
  proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=log,
                          stderr=subprocess.STDOUT)
  log.close()
  return proc, log_path


def _finish(procs) -> list[str]:
  """Waits for every process; fails with the tail of each failed one's output."""
  outputs, failures = [], []
  for proc, log_path in procs:
    try:
      proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    with open(log_path) as f:
      text = f.read()
    outputs.append(text)
    if proc.returncode != 0:
      failures.append(f'{log_path} (exit {proc.returncode}):\n{text[-3000:]}')
  assert not failures, '\n\n'.join(failures)
  return outputs


def _records(workdir: str) -> dict[int, dict]:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  steps = [r['step'] for r in records]
  assert len(steps) == len(set(steps)), f'a step was logged twice: {steps}'
  return {r['step']: r for r in records}


def _assert_records_close(a: dict, b: dict, step: int) -> set:
  # Wall-clock timings (step_time, time/*) never repeat.
  shared = {k for k in set(a) & set(b) if k != 'step_time' and not k.startswith('time/')}
  for key in sorted(shared):
    x, y = a[key], b[key]
    if isinstance(x, float) or isinstance(y, float):
      assert x is not None and y is not None and math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-6), \
          f'step {step} {key}: {x} != {y}'
    else:
      assert x == y, f'step {step} {key}: {x!r} != {y!r}'
  return shared


def _progress_lines(output: str) -> list[str]:
  """The per-step progress lines a process printed, without the wall-clock fields (step time and
  the ETA derived from it: the two processes may time a step a second apart)."""
  return [re.sub(r' (step_time|eta)=\S+', '', line) for line in output.splitlines()
          if line.startswith('step=')]


def _load_config(name: str = 'ac2', arg: str = ''):
  path = os.path.join(REPO, 'configs', f'{name}.py')
  spec = importlib.util.spec_from_file_location(f'configs_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """(root, data_dir, cache_dir, checkpoint, model_config): the built-in data set and a micro
  model's checkpoint, shared by the runs of this module."""
  root = str(tmp_path_factory.mktemp('distributed'))
  data_dir, cache_dir = os.path.join(root, 'data'), os.path.join(root, 'jax_cache')
  c = _load_config()
  c.task.builtin_num_train, c.task.builtin_num_validation = 300, 16
  c.task.data_dir = data_dir
  _, tok = experiment.build_task(c, root, None)  # the tfds build, once, before the runs share it
  model_config = models.get_config('tiny', vocab_size=tok.vocab_size, **MICRO)
  checkpoint = os.path.join(root, 'init')
  models.save_hf_checkpoint(model_config, models.init_params(model_config, jax.random.key(7)),
                            checkpoint)
  return root, data_dir, cache_dir, checkpoint, model_config


@pytest.fixture(scope='module')
def runs(prepared):
  """A (1 x 8 devices, 3 steps) and B (2 x 4 devices, 2 steps) side by side, then B resumed to
  step 3 in one process. Returns the directories and B's two outputs."""
  root, data_dir, cache_dir, checkpoint, model_config = prepared
  a, b = os.path.join(root, 'a'), os.path.join(root, 'b')
  coordinator = f'127.0.0.1:{_free_port()}'
  procs = [_start([LAUNCHER, '--config=configs/ac2.py', f'--workdir={a}',
                   *_overrides(data_dir, checkpoint, 3)], _env(8, cache_dir), a + '.log')]
  for i in range(2):
    procs.append(_start([LAUNCHER, '--config=configs/ac2.py', f'--workdir={b}',
                         *_overrides(data_dir, checkpoint, 2), f'--coordinator={coordinator}',
                         '--num_processes=2', f'--process_id={i}'],
                        _env(4, cache_dir), f'{b}.{i}.log'))
  outputs = _finish(procs)
  records_b_two_steps = _records(b)
  # No multi-process flags: the launcher finds no cluster and runs one process (A's programs are
  # in the compilation cache).
  resumed = _finish([_start([LAUNCHER, '--config=configs/ac2.py', f'--workdir={b}',
                             *_overrides(data_dir, checkpoint, 3)], _env(8, cache_dir),
                            b + '.resume.log')])[0]
  return dict(a=a, b=b, model_config=model_config, checkpoint=checkpoint, out_a=outputs[0],
              out_b=outputs[1:], resumed=resumed, records_b_two_steps=records_b_two_steps)


def _restore_params(workdir: str, model_config, step: int):
  """Parameters of a run's checkpoint at `step`, onto one device, whatever wrote them."""
  device = SingleDeviceSharding(jax.devices()[0])
  abstract = jax.eval_shape(lambda: state_lib.init_state(
      models.init_params(model_config, jax.random.key(0)), state_lib.OptimSettings()))
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                          abstract)
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'))
  try:
    restored_step, state, host = ckpt.restore(abstract, step=step)
  finally:
    ckpt.close()
  assert restored_step == step
  return state, host


def test_two_processes_log_the_metrics_of_one(runs):
  a, b = _records(runs['a']), runs['records_b_two_steps']
  assert sorted(b) == [0, 1, 2] and sorted(a) == [0, 1, 2, 3]
  for step in (0, 1, 2):
    shared = _assert_records_close(a[step], b[step], step)
    assert len(shared) > (3 if step == 0 else 20), sorted(shared)
  # The comparison covers real work: sampled tokens, a critic update that moved the weights.
  assert b[2]['tokens_generated'] > 0 and b[1]['decoding_flops'] > 0
  assert b[1]['critic/pairs'] > 0 and b[1]['critic/update_norm'] > 0


def test_both_processes_computed_the_same_steps(runs):
  lines = [_progress_lines(out) for out in runs['out_b']]
  assert len(lines[0]) == 2, runs['out_b'][0][-2000:]
  assert lines[0] == lines[1]
  assert 'process 0 of 2: 4 local of 8 devices' in runs['out_b'][0]
  assert 'process 1 of 2: 4 local of 8 devices' in runs['out_b'][1]
  # Metrics, plots and the summary are written once, by process 0.
  assert os.path.exists(os.path.join(runs['b'], 'summary.json'))
  assert 'validation score: start' in runs['out_b'][0]
  assert 'validation score: start' not in runs['out_b'][1]


def test_two_processes_train_the_parameters_of_one(runs):
  state_a, host_a = _restore_params(runs['a'], runs['model_config'], 2)
  state_b, host_b = _restore_params(runs['b'], runs['model_config'], 2)
  _, initial = models.load_hf_checkpoint(runs['checkpoint'])
  moved = []
  for path, x_a in jax.tree_util.tree_leaves_with_path(state_a.params):
    x_b = _leaf(state_b.params, path)
    np.testing.assert_allclose(np.asarray(x_b), np.asarray(x_a), rtol=1e-5, atol=1e-6,
                               err_msg=jax.tree_util.keystr(path))
    moved.append(np.abs(np.asarray(x_a) - np.asarray(_leaf(initial, path))).max())
  # Training moved the weights far beyond the tolerance of the comparison.
  assert max(moved) > 1e-4
  for name in ('actor_opt_state', 'critic_opt_state'):
    for x_a, x_b in zip(jax.tree.leaves(getattr(state_a, name)),
                        jax.tree.leaves(getattr(state_b, name))):
      np.testing.assert_allclose(np.asarray(x_b), np.asarray(x_a), rtol=1e-4, atol=1e-6)
  assert int(state_a.step) == int(state_b.step) > 0
  # The controller's state (host side, saved by process 0) is the same too.
  assert host_a['algorithm'] == host_b['algorithm']


def _leaf(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


def test_two_process_checkpoint_resumes_in_one_process(runs):
  assert 'resumed from step 2' in runs['resumed']
  assert 'single process (no cluster environment detected)' in runs['resumed']
  a, b = _records(runs['a']), _records(runs['b'])
  assert sorted(b) == [0, 1, 2, 3]
  shared = _assert_records_close(a[3], b[3], 3)
  assert {'val/mean_score', 'critic/loss', 'entropy'} <= shared


def test_process_zero_judge_shared_files_stop_flag_and_global_batches(tmp_path):
  """Without a model: the judge is called once per request (by process 0) and every process gets
  its grades; files are prepared by process 0 first; a stop request on one process stops all;
  each device holds its rows of a batch; asynchronous configs need a rollout sub-mesh and a batch
  that splits over the processes."""
  counter = iter(range(1000))

  def reply(request):  # a judge that never answers the same twice
    return local_server.Reply(200, local_server.completion_body(
        f'<points>{next(counter) % 8} out of 7</points>'))

  with local_server.LocalChatServer(reply) as server:
    coordinator = f'127.0.0.1:{_free_port()}'
    procs = [_start([WORKER, coordinator, '2', str(i), str(tmp_path), server.base_url],
                    _env(4, str(tmp_path / 'cache')), str(tmp_path / f'worker{i}.log'))
             for i in range(2)]
    outputs = _finish(procs)
    received = server.requests
  results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
  assert len(received) == 5  # process 1 sent nothing
  assert results[0]['points'] == results[1]['points']
  assert sorted(results[0]['points']) == [0, 1, 2, 3, 4]
  for r in results:
    assert r['prepared'] == 'prepared by process 0'
    assert r['global_shape'] == [16, 3] and not r['fully_addressable'] and r['shards_ok']
    assert r['sum'] == 2.0 * sum(range(48))
    assert r['stop'] is True
    no_split, uneven, split = r['async_configs']
    assert ("config.rollout.mode='async' on 2 processes needs config.rollout.devices >= 1"
            in no_split)
    assert 'config.li2sao.problems_per_step=3 must be a multiple of the 2 processes' in uneven
    assert split == 'training mesh (1, 6, 1)'  # 8 devices less one rollout device per process


def test_partial_multi_process_flags_are_an_error(tmp_path):
  out = subprocess.run([sys.executable, LAUNCHER, '--config=configs/ac2.py',
                        f'--workdir={tmp_path}', '--num_processes=2'], cwd=REPO,
                       env=_env(1, str(tmp_path / 'cache')), capture_output=True, text=True,
                       timeout=120)
  assert out.returncode != 0
  assert 'give all of coordinator, num_processes and process_id' in out.stderr


# --- Asynchronous Li2SAO: a rollout sub-mesh beside the training sub-mesh --------------------------

ASYNC_OVERRIDES = {
    'num_steps': 3, 'checkpoint_every': 1, 'checkpoints_kept': 3,
    # Of each process's 4 devices, 2 generate (rollout.devices) and 2 train: the training mesh
    # (fsdp 2 x tensor 2) spans both processes, each rollout sub-mesh is one process's own.
    'rollout.devices': 2, 'mesh.data': 1, 'mesh.fsdp': 2, 'mesh.tensor': 2,
    'rollout.segment_tokens': 4, 'controller.response_budget': 16,
    'li2sao.problems_per_step': 2, 'li2sao.group_size': 2,  # 1 group of 2 per process
    'li2sao.min_steps': 1, 'li2sao.max_steps': 1,  # the switch after step 1
    'task.builtin_num_train': 300, 'task.builtin_num_validation': 16,
    'sampling.max_batch': 64, 'eval.every': 100, 'eval.num_problems': 4, 'eval.num_responses': 2,
}


@pytest.fixture(scope='module')
def async_run(prepared):
  """Li2SAO with in-flight rollouts on 2 processes x 4 devices, 3 steps."""
  root, data_dir, cache_dir, checkpoint, model_config = prepared
  workdir = os.path.join(root, 'li2sao_async')
  values = {**ASYNC_OVERRIDES, 'task.data_dir': data_dir, 'model.init_checkpoint': checkpoint}
  coordinator = f'127.0.0.1:{_free_port()}'
  outputs = _finish([_start([LAUNCHER, '--config=configs/li2sao.py:async', f'--workdir={workdir}',
                             *[f'--config.{k}={v}' for k, v in values.items()],
                             f'--coordinator={coordinator}', '--num_processes=2',
                             f'--process_id={i}'], _env(4, cache_dir), f'{workdir}.{i}.log')
                     for i in range(2)])
  config = _load_config('li2sao', 'async')
  for key, value in values.items():
    section, name = key.split('.') if '.' in key else (None, key)
    (config[section] if section else config)[name] = value
  return dict(workdir=workdir, outputs=outputs, config=config, model_config=model_config)


def _value_state_abstract(c, model_config):
  """The shapes of an asynchronous Li2SAO run's train state (policy and value critic), on one
  device."""
  settings = experiment.validate(c, num_devices=6)  # 4 training devices beside 2 rollout ones
  optim = experiment.update_settings_of(c, model_config, 0, settings).optim

  def init():
    params = models.init_params(model_config, jax.random.key(0))
    value_params = value_model.init_value_params(model_config, params, jax.random.key(1),
                                                 head_std=settings.value.head_std)
    return value_critic.init_state(params, value_params, optim, settings.value)

  device = SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                      jax.eval_shape(init))


def test_async_li2sao_on_a_rollout_sub_mesh_of_each_process(async_run):
  out0, out1 = async_run['outputs']
  # Both processes trained on the same batches: the same rewards, entropies and critic errors.
  lines = [_progress_lines(out) for out in (out0, out1)]
  assert len(lines[0]) == 3 and lines[0] == lines[1], out0[-2000:]
  assert 'process 1 of 2: 4 local of 8 devices' in out1
  # The meshes: 4 training devices over both processes; 2 rollout devices of each process's own.
  found = re.search(r'training mesh: 4 devices \(ids \[([\d, ]+)\]\); rollout sub-mesh of each '
                    r'process: 2 local devices \(here ids \[([\d, ]+)\]\)', out0)
  assert found, out0[-3000:]
  training, rollout = ([int(x) for x in g.split(',')] for g in found.groups())
  assert len(set(training)) == 4 and len(set(rollout)) == 2 and not set(training) & set(rollout)

  records = _records(async_run['workdir'])
  assert sorted(records) == [0, 1, 2, 3]
  # The switch: step 2 trains the batch prefetched in groups of 2, step 3 singletons.
  assert [(records[s]['li2sao/group_size'], records[s]['rows_trained']) for s in (1, 2, 3)] == [
      (2, 4), (2, 4), (1, 4)]
  assert [records[s]['li2sao/switch_step'] for s in (1, 2, 3)] == [1, 1, 1]
  assert records[1]['rollout/lag/0'] == 1.0  # the first batch: the initial policy's tokens
  for s in (1, 2, 3):
    r = records[s]
    # Per-token versions: every token within the lag bound (k = 1), none dropped.
    assert r['rollout/lag/0'] + r['rollout/lag/1'] == pytest.approx(1.0)
    assert r['rollout/dropped_samples'] == 0 and r['tokens_generated'] > 0
    assert r['decoding_flops'] > 0 and r['actor1/update_norm'] > 0
  # The rollout sub-mesh received the weights of each version: the fingerprint of the worker's
  # copy published after step k is that of the trained state saved at step k.
  abstract = _value_state_abstract(async_run['config'], async_run['model_config'])
  ckpt = checkpointing.Checkpointer(os.path.join(async_run['workdir'], 'checkpoints'))
  try:
    for step in (1, 2, 3):
      params = ckpt.restore(abstract, step=step)[1].params
      expected = sum(float(np.sum(np.square(np.asarray(x, np.float64))))
                     for x in jax.tree.leaves(params))
      assert math.isclose(records[step]['rollout/weights_square_sum'], expected, rel_tol=1e-5)
  finally:
    ckpt.close()
  sums = [records[s]['rollout/weights_square_sum'] for s in (1, 2, 3)]
  assert len(set(sums)) == 3  # each update moved the weights
