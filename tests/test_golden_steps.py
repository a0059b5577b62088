"""Golden step metrics: one AC2, one Prefix GRPO and one GRPO run of the tiny setting, step by step,
against numbers recorded from the code before the learner/algorithm restructure (issue 14).

The setting is written out here key by key (`PINNED`), so a change of a default in
`ac2_jax/train/defaults.py` does not move these numbers; the data set and the 3-step warm start are
the shared ones of `train_fixtures.train_base`. The task is `LengthCreditTask` (len(response) mod 8
points), so groups get varied rewards and the actor real gradients. AC2 runs two steps: step 1 is
the cold start (refills, cold-start groups, prefix reads, a critic update); before step 2 every
problem is made ready, so step 2 plans ready chunks and audits, routes chunks to the critic and reads
their end values. Prefix GRPO runs two steps (step 2 replays cut prefixes), GRPO one.

What is compared: every metric of the recorded steps (floats to 1e-5 relative, counts exactly, None
and NaN as such) and the L2 norm of the parameters after the step. Keys a later change adds are
not compared; keys with 'time' in their name never are.

Re-record (only in a commit that says why the numbers moved):
  GOLDEN_RECORD=1 python -m pytest -q tests/test_golden_steps.py
"""

import json
import math
import os

import jax
import numpy as np
import optax
import pytest

from ac2_jax.train import experiment
from train_fixtures import (compile_cache, length_credit_build_task, tiny_config,  # noqa: F401
                            train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fixtures', 'golden_steps.json')
RECORD = os.environ.get('GOLDEN_RECORD') == '1'
RTOL, ATOL = 1e-5, 1e-7

# Every config key a training step reads, at the value it had when the fixture was recorded
# (train_fixtures.SMALL for the sizes, defaults.py for the rest).
PINNED = {
    'seed': 0,
    'model.dtype': 'float32',
    'model.attention_impl': 'xla',
    'model.remat': False,
    'model.logits_chunk': 0,
    'mesh.data': 1,
    'mesh.fsdp': -1,
    'mesh.tensor': 1,
    'task.name': 'builtin',
    'task.rl_problems': 0,
    'controller.bank_from_data': False,
    'task.builtin_steps': 8,
    'task.builtin_modulus': 7,
    'task.builtin_ops': '+-',
    'task.builtin_num_train': 300,
    'task.builtin_num_validation': 16,
    'task.builtin_vocab_size': 512,
    'controller.group_size': 4,
    'controller.audit_fraction': 0.25,
    'controller.n_batch': 4,
    'controller.n_refill': 4,
    'controller.buffer_capacity': 16,
    'controller.response_budget': 80,
    'controller.chunk_size': 16,
    'controller.cut_grid': 16,
    'controller.max_cut_fraction': 0.9,
    'controller.critic_buffer_capacity': 32,
    'controller.critic_pairs_per_update': 8,
    'controller.min_valid_per_target': 2,
    'controller.readiness_window': 5,
    'controller.tau_global': 0.20,
    'controller.tau_local': 0.18,
    'controller.critic_lr_init': 2 * math.sqrt(2) * 1e-4,
    'controller.critic_lr_floor': 1e-4,
    'controller.entropy_target': 0.28,
    'controller.entropy_k_init': 0.06,
    'controller.eps_high_base': 0.28,
    'grpo.problems_per_step': 4,
    'grpo.group_size': 4,
    'grpo.normalize_std': False,
    'sampling.temperature': 0.8,
    'sampling.top_p': 1.0,
    'sampling.top_k': 0,
    'sampling.max_batch': 64,
    'actor.learning_rate': 1e-4,
    'actor.weight_decay': 0.01,
    'actor.grad_clip': 0.3,
    'actor.eps_low': 0.2,
    'actor.dual_clip': 3.0,
    'actor.minibatches': 2,
    'actor.micro_batch': 0,
    'critic.grad_clip': 0.2,
    'critic.max_context': 320,
    'critic.readout': 'greedy',
    'task.builtin_scoring': 'local',
    'task.builtin_critic_prompt': 'long',
}

# (config name, steps run, step before which every problem is made ready or None)
RUNS = {'ac2': (2, 2), 'prefix_grpo': (2, None), 'grpo': (1, None)}


def _make_all_ready(algorithm) -> None:
  readiness = algorithm.controller.readiness
  readiness.ready_P[:] = True


def _jsonable(value):
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  if isinstance(value, (float, np.floating)):
    value = float(value)
    return 'nan' if math.isnan(value) else value
  if value is None:
    return None
  raise TypeError(f'metric of type {type(value).__name__}: {value!r}')


def _run(train_base, tmp_path, monkeypatch, name):
  monkeypatch.setattr(experiment, 'build_task',
                      length_credit_build_task(experiment.build_task))
  dotted = {k.replace('.', '__'): v for k, v in PINNED.items()}
  c = tiny_config(train_base, name, **dotted)
  rt, algorithm, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  num_steps, ready_before = RUNS[name]
  out = {}
  for step in range(1, num_steps + 1):
    if step == ready_before:
      _make_all_ready(algorithm)
    state, metrics = algorithm.step(rt, state, step, experiment.step_key(c.seed, step))
    record = {k: _jsonable(v) for k, v in metrics.items() if 'time' not in k}
    record['params_l2'] = float(optax.tree.norm(jax.device_get(state.params)))
    out[str(step)] = record
  return out


def _close(got, want) -> bool:
  if want is None or got is None:
    return got is None and want is None
  if want == 'nan' or got == 'nan':
    return got == want or (isinstance(got, float) and math.isnan(got))
  if isinstance(want, bool) or isinstance(want, int) and isinstance(got, int):
    return got == want
  return math.isclose(got, want, rel_tol=RTOL, abs_tol=ATOL)


@pytest.mark.parametrize('name', list(RUNS))
def test_golden_step_metrics(train_base, tmp_path, monkeypatch, name):
  got = _run(train_base, tmp_path, monkeypatch, name)
  if RECORD:
    recorded = {}
    if os.path.exists(FIXTURE):
      with open(FIXTURE) as f:
        recorded = json.load(f)
    recorded[name] = got
    with open(FIXTURE, 'w') as f:
      json.dump(recorded, f, indent=1, sort_keys=True)
      f.write('\n')
    pytest.skip(f'recorded {name} into {FIXTURE}')
  with open(FIXTURE) as f:
    want = json.load(f)[name]
  assert sorted(got) == sorted(want)
  problems = []
  for step, metrics in want.items():
    for key, value in metrics.items():
      if key not in got[step]:
        problems.append(f'step {step}: {key} missing (recorded {value!r})')
      elif not _close(got[step][key], value):
        problems.append(f'step {step}: {key} = {got[step][key]!r}, recorded {value!r}')
  assert not problems, '\n'.join(problems)
  _check_by_kind(name, got)


def _check_by_kind(name, got):
  """The per-kind tokens, FLOPs and tied shares (added after the recording) add up to the step's
  totals."""
  if name == 'grpo':  # no request kinds
    return
  kinds = ('refill', 'cold_start', 'unready', 'ready_chunk', 'audit')
  for step, m in got.items():
    assert sum(m[f'tokens/{k}'] for k in kinds) == m['tokens_generated'], step
    assert math.isclose(sum(m[f'flops/{k}'] for k in kinds), m['decoding_flops'], rel_tol=1e-9)
    assert m['tokens/refill'] > 0 and m['flops/refill'] > 0
    # The tied share per replayed kind (added later too): its group-weighted mean is the total.
    counts = {k: m[f'num_{k}'] for k in kinds[1:]}
    shares = {k: m[f'replay/zero_variance_groups/{k}'] for k in kinds[1:]}
    assert all((shares[k] is None) == (counts[k] == 0) for k in counts), (step, shares, counts)
    tied = sum(shares[k] * counts[k] for k in counts if counts[k])
    assert math.isclose(tied / sum(counts.values()), m['replay/zero_variance_groups']), step
  if name == 'ac2':  # step 2 plans ready chunks: at most b new tokens a row
    bound = (got['2']['num_ready_chunk'] * PINNED['controller.group_size']
             * PINNED['controller.chunk_size'])
    assert 0 < got['2']['tokens/ready_chunk'] <= bound


def test_golden_runs_are_not_degenerate():
  """The recorded steps exercise what the restructure touches: real advantages and actor updates,
  the critic routing and reads of AC2's ready chunks, a critic update."""
  with open(FIXTURE) as f:
    want = json.load(f)
  for name in RUNS:
    for step, m in want[name].items():
      assert m['adv/abs_mean'] > 0, (name, step)
      assert m['actor1/update_norm'] > 0 and m['actor2/update_norm'] > 0, (name, step)
  ac2 = want['ac2']
  assert ac2['1']['critic/pairs'] > 0 and ac2['1']['critic/update_norm'] > 0
  assert ac2['2']['num_ready_chunk'] > 0 and ac2['2']['routed_to_critic'] > 0
  assert want['prefix_grpo']['2']['num_unready'] > 0
