"""Dry runs: every launch command in docs/tpu.md and docs/gpu.md, run with --config.dry_run=True
on this CPU (full-size Qwen3-4B shapes through jax.eval_shape), must succeed, write nothing, and
print the memory table the document quotes; the estimator agrees with real arrays on a real mesh.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest

from ac2_jax import models, sampling, sharding
from ac2_jax.learner import critic_adapter
from ac2_jax.learner import state as state_lib
from ac2_jax.train import dry_run, experiment, loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ('docs/tpu.md', 'docs/gpu.md')
MULTI_PROCESS_FLAGS = ('--coordinator=', '--num_processes=', '--process_id=')


def _load_config(name: str, arg: str = ''):
  spec = importlib.util.spec_from_file_location(f'configs_{name}',
                                                os.path.join(REPO, 'configs', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def _blocks(text: str) -> list[tuple[str, str]]:
  """(language, body) of every fenced code block."""
  return re.findall(r'^```(\w*)\n(.*?)^```', text, flags=re.S | re.M)


def documented_commands(doc: str) -> list[list[str]]:
  """The launcher's argument lists in a document's shell blocks (line continuations joined)."""
  with open(os.path.join(REPO, doc)) as f:
    text = f.read()
  commands = []
  for lang, body in _blocks(text):
    if lang != 'sh':
      continue
    joined = re.sub(r'\\\n', ' ', body)
    for line in joined.splitlines():
      start = line.find('python launch/tpu_run.py')
      if start >= 0:
        commands.append(shlex.split(line[start:])[1:])
  return commands


def documented_memory_lines(doc: str) -> list[str]:
  with open(os.path.join(REPO, doc)) as f:
    text = f.read()
  return [line for lang, body in _blocks(text) if lang == 'text'
          and body.startswith('memory per device') for line in body.splitlines()]


def test_documents_hold_the_commands():
  for doc in DOCS:
    commands = documented_commands(doc)
    assert len(commands) >= 2, doc
    for args in commands:
      assert args[0] == 'launch/tpu_run.py' and '--config=configs/ac2.py:qwen3_4b' in args
    assert any('--config.dry_run=True' in args for args in commands), doc
    assert len(documented_memory_lines(doc)) > 10, doc


@pytest.fixture(scope='module')
def dry_runs():
  """Output of each distinct documented command's dry run, run side by side in subprocesses."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=1')
  runs = {}
  for doc in DOCS:
    for args in documented_commands(doc):
      args = [a for a in args if a != '--config.dry_run=True'] + ['--config.dry_run=True']
      # The multi-process flags do not change a dry run (they must still parse): one run per
      # distinct remainder, with the flags where a document gives them.
      key = tuple(a for a in args if not a.startswith(MULTI_PROCESS_FLAGS))
      if key not in runs or len(args) > len(runs[key][1]):
        runs[key] = (doc, args)
  procs = {key: (doc, args, subprocess.Popen([sys.executable, *args], cwd=REPO, env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True))
           for key, (doc, args) in runs.items()}
  results = []
  for doc, args, proc in procs.values():
    out, _ = proc.communicate(timeout=600)
    results.append((doc, args, proc.returncode, out))
  return results


@pytest.mark.slow
def test_documented_dry_runs_pass_and_match_the_documents(dry_runs):
  assert {doc for doc, *_ in dry_runs} == set(DOCS)
  assert any('--num_processes=4' in args for _, args, *_ in dry_runs)
  for doc, args, returncode, out in dry_runs:
    assert returncode == 0, f'{doc}: {" ".join(args)}\n{out[-3000:]}'
    assert 'Qwen3 decoder' in out and '4.022 B parameters' in out
    printed = out.splitlines()
    for line in documented_memory_lines(doc):
      assert line in printed, f'{doc} quotes a line the dry run no longer prints:\n{line}\n{out}'
    workdir = next(a for a in args if a.startswith('--workdir=')).split('=', 1)[1]
    assert not os.path.exists(workdir), f'the dry run created {workdir}'


def test_a_dry_run_mesh_leaves_the_rollout_devices_out():
  c = _load_config('li2sao')
  c.rollout.mode, c.rollout.devices = 'async', 2
  assert experiment.dry_run_plan(c, num_devices=8).mesh_shape == (1, 6, 1)
  c.rollout.devices = 8
  with pytest.raises(experiment.ConfigError, match='leaves no training devices of 8'):
    experiment.dry_run_plan(c, num_devices=8)


def test_builtin_configs_dry_run_in_process():
  for name in ('ac2', 'grpo', 'prefix_grpo', 'ppo', 'pact', 'lisao', 'li2sao'):
    c = _load_config(name)
    c.dry_run = True
    report = dry_run.run(experiment.dry_run_plan(c, num_devices=8))
    assert report.plan.mesh_shape == (1, 8, 1)
    assert report.num_params == sum(
        np.prod(x.shape) for x in jax.tree.leaves(jax.eval_shape(
            lambda: models.init_params(report.plan.model, jax.random.key(0)))))
    assert report.peak_bytes > report.total('state') > 0
    assert 'memory per device (GiB):' in report.text()
    state = report.memory['state']
    if name in experiment.VALUE_ALGORITHMS:  # the second parameter tree and its AdamW moments
      assert 'critic optimizer (Adam mu, nu)' not in state
      assert 0 < state['value critic parameters'] <= state['parameters']
      moments = state['value critic optimizer (AdamW mu, nu)']
      if c.value_critic.freeze_attention:  # LiSAO, Li2SAO: no moments for the frozen attention
        assert 0 < moments < 2 * state['value critic parameters']
      else:
        counts = moments - 2 * state['value critic parameters']
        assert 0 <= counts <= 16  # beside mu and nu: Adam's step counts
    else:
      assert not [k for k in state if k.startswith('value critic')]


def test_state_memory_equals_the_shards_of_a_real_mesh():
  c = _load_config('ac2')
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 4, 2
  report = dry_run.run(experiment.dry_run_plan(c))
  mesh = sharding.make_mesh(sharding.MeshConfig(1, 4, 2))
  params = sharding.shard_params(models.init_params(report.plan.model, jax.random.key(0)), mesh)
  state = state_lib.init_state(params, state_lib.OptimSettings())
  device = mesh.devices.flat[0]

  def on_device(tree):
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
               if s.device == device)

  # float32 state: no dtype change in the update, so the estimate is the initial state exactly.
  assert not any('changes dtypes' in n for n in report.notes)
  state_memory = report.memory['state']
  assert state_memory['parameters'] == on_device(state.params)
  assert state_memory['actor optimizer (AdamW mu, nu)'] == on_device(state.actor_opt_state)
  assert state_memory['critic optimizer (Adam mu, nu)'] == on_device(state.critic_opt_state)


def test_sampler_shape_is_what_the_sampler_pads_to():
  c = _load_config('ac2')
  plan = experiment.dry_run_plan(c, num_devices=8)
  B, P, C = dry_run.sampler_shape(plan, batch_devices=8)
  # A fresh rollout at the longest assumed prompt and a critic read at the longest context.
  fresh = sampling.requests.pack(
      [np.ones(plan.sizes.prompt_tokens, np.int32)] * min(plan.sizes.max_sample_batch, plan.sizes.rows_per_step),
      plan.sizes.response_budget, None, vocab_size=plan.model.vocab_size,
      max_total_len=plan.sizes.max_total_len, batch_multiple=8)
  assert B == fresh.contexts_BxP.shape[0]
  assert P + C >= fresh.contexts_BxP.shape[1] + fresh.max_new


def test_bad_mesh_and_training_with_dry_run_are_errors(tmp_path):
  c = _load_config('ac2')
  c.mesh.fsdp, c.mesh.tensor = -1, 4
  with pytest.raises(ValueError, match='not divisible'):
    dry_run.run(experiment.dry_run_plan(c, num_devices=6))
  c = _load_config('ac2')
  c.dry_run = True
  with pytest.raises(ValueError, match='dry_run'):
    loop.train(c, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')


def test_the_critic_adapter_is_counted():
  """With critic.adapter_rank the state holds the adapter and its Adam moments (not the shared
  weights' moments) and the merged critic weights, all equal to the real tree's bytes."""
  c = _load_config('ac2')
  plain = dry_run.run(experiment.dry_run_plan(c, num_devices=1)).memory['state']
  c.critic.adapter_rank = 4
  report = dry_run.run(experiment.dry_run_plan(c, num_devices=1))
  state = report.memory['state']
  params = models.init_params(report.plan.model, jax.random.key(0))
  adapter = critic_adapter.init_adapter(params, 4, jax.random.key(1))
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  assert state['critic adapter (A, B)'] == nbytes(adapter)
  assert state['merged critic weights (W + A B), one per step'] == state['parameters']
  assert state['parameters'] == plain['parameters']
  # Adam's mu and nu over the adapter (and a step count), far fewer bytes than over the weights.
  assert 2 * nbytes(adapter) <= state['critic optimizer (Adam mu, nu)'] <= 2 * nbytes(adapter) + 16
  assert state['critic optimizer (Adam mu, nu)'] < plain['critic optimizer (Adam mu, nu)']
