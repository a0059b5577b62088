"""In-flight asynchronous rollouts (rollout.mode='async'): the pipeline and the worker under a
scripted generator and scripted policy versions (host only, deterministic), one paused rollout
resumed under new weights on the tiny model, and LiSAO / Li2SAO runs through `loop.train` with
the worker thread.

The scripted generator emits, for every rollout in a call, the next token numbers of its own
counter, so a test knows which call (and so which published version) produced each token.
"""

import jax
import numpy as np
import pytest

from ac2_jax import models, sampling, sharding
from ac2_jax.algorithms import inflight
from ac2_jax.controller.inflight import CONTINUE, InflightPipeline, InflightSettings, Segment
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import value_rows
from ac2_jax.rl import flops
from ac2_jax.train import checkpointing, compare, experiment, loop, run_record
from train_fixtures import (compile_cache, is_finite_number, length_credit_build_task,  # noqa: F401
                            load_config, read_records, tiny_config, train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')

PROMPTS = [np.array([1, 2], np.int32), np.array([3], np.int32), np.array([4, 5, 6], np.int32)]


def _pipeline(group_size=2, capacity=4, max_lag=1, segment=2, budget=6):
  problems = iter(range(100))
  settings = InflightSettings(max_policy_lag=max_lag, segment_tokens=segment,
                              response_budget=budget)
  return InflightPipeline(settings, PROMPTS, lambda: next(problems) % len(PROMPTS), group_size,
                          capacity)


class ScriptedGenerate:
  """Segments of `segment` tokens numbered per call (call c emits 100 c, 100 c + 1, ...); a
  rollout listed in `eos_at` (by (group, index in call)) ends on its first token of that call."""

  def __init__(self, segment, eos=()):
    self.segment, self.eos, self.calls = segment, set(eos), 0
    self.contexts = []

  def __call__(self, params, rollouts, key):
    self.calls += 1
    self.contexts.append([r.context_P.tolist() for r in rollouts])
    out = []
    for i, r in enumerate(rollouts):
      n = min(self.segment, r.remaining)
      if (self.calls, r.group, i) in self.eos:
        n = 1
      tokens = [100 * self.calls + j for j in range(n)]
      stop = ('eos' if (self.calls, r.group, i) in self.eos
              else sampling.STOP_BUDGET if n == r.remaining else CONTINUE)
      out.append(Segment(tokens, [-0.1 * self.calls] * n, [0.5] * n, stop))
    return out, 10.0 * len(rollouts)


def _step(p, gen, version):
  """One scripted segment of every unfinished rollout, sampled by policy `version`."""
  rollouts = p.requests()
  p.accept(rollouts, gen(None, rollouts, None)[0], version)
  return rollouts


def test_paused_rollouts_resume_from_their_prefix_under_the_new_version():
  p = _pipeline()
  gen = ScriptedGenerate(2, eos={(1, 0, 1)})   # call 1: group 0's second rollout ends on EOS
  first = _step(p, gen, version=0)
  assert len(first) == 4 and p.rows_held() == 4  # two groups of two fill the capacity
  # A weight update (version 1): the unfinished ones continue from prompt + their tokens, and
  # the tokens before the pause stay as they were.
  second = _step(p, gen, version=1)
  assert len(second) == 3
  assert gen.contexts[1] == [[1, 2, 100, 101], [3, 100, 101], [3, 100, 101]]
  r = second[0]
  assert r.tokens == [100, 101, 200, 201] and r.versions == [0, 0, 1, 1]
  assert r.logprobs == pytest.approx([-0.1, -0.1, -0.2, -0.2])
  assert p.take(2, version=1) is None  # group 0 is not finished: a batch never skips it
  _step(p, gen, version=2)             # every rollout ends (budget 6)
  assert all(x.stop_reason == sampling.STOP_BUDGET for x in second)
  assert first[1].stop_reason == 'eos' and first[1].tokens == [100]
  # At version 2 both groups hold version-0 tokens (lag 2 > 1): dropped at once, and their room
  # goes to two new groups (no stall behind samples that can never be trained).
  assert p.take(2, version=2) is None
  assert p.rows_held() == 0 and p.pop_dropped() == (4, 6 + 1 + 6 + 6)
  assert [x.group for x in p.requests()] == [2, 2, 3, 3]


def test_pipeline_tokens_versions_lag_and_counts_by_hand():
  p = _pipeline(max_lag=1)
  gen = ScriptedGenerate(2, eos={(1, 0, 1), (2, 0, 0)})
  _step(p, gen, version=0)                     # call 1
  _step(p, gen, version=1)                     # call 2: group 0's first rollout ends on EOS
  taken = p.take(2, version=1)                 # group 0: oldest token version 0, lag 1 <= 1
  a, b = taken.groups[0]
  assert a.tokens == [100, 101, 200] and a.versions == [0, 0, 1] and a.stop_reason == 'eos'
  assert a.logprobs == pytest.approx([-0.1, -0.1, -0.2])
  assert b.tokens == [100] and b.versions == [0] and b.stop_reason == 'eos'
  assert (taken.dropped_samples, taken.dropped_tokens) == (0, 0)
  # Group 1 has 4 tokens (versions 0, 0, 1, 1); a new group 2 fills the freed room.
  rollouts = _step(p, gen, version=3)          # call 3: group 1 reaches its budget
  assert sorted({r.group for r in rollouts}) == [1, 2]
  g1 = [r for r in rollouts if r.group == 1]
  assert all(r.stop_reason == sampling.STOP_BUDGET and len(r.tokens) == 6 for r in g1)
  assert g1[0].versions == [0, 0, 1, 1, 3, 3]
  _step(p, gen, version=3)
  _step(p, gen, version=3)                     # group 2 finishes (budget)
  taken = p.take(2, version=3)   # group 1 lag 3 > 1: dropped (2 samples, 12 tokens); group 2 in
  assert [r.group for g in taken.groups for r in g] == [2, 2]
  assert (taken.dropped_samples, taken.dropped_tokens) == (2, 12)
  # Li2SAO's switch: leftovers dropped, singletons next; a segment that was running for a dropped
  # group comes back and counts as dropped tokens.
  rollouts = p.requests()
  p.reset(1)
  p.accept(rollouts, gen(None, rollouts, None)[0], version=3)
  assert p.pop_dropped() == (4, 2 * len(rollouts))
  rollouts = p.requests()
  assert len(rollouts) == 4 and len({r.group for r in rollouts}) == 4


def test_worker_take_resets_atomically_and_the_thread_fills_batches():
  gen = ScriptedGenerate(3)
  pipeline = _pipeline(group_size=2, capacity=4, segment=3, budget=3, max_lag=5)
  worker = inflight.RolloutWorker(pipeline, gen, jax.random.key(0))
  worker.publish({'w': np.zeros(2)}, version=0)
  assert worker.run_once()       # every rollout finishes at its budget in one call
  assert not worker.run_once()   # full: nothing to generate until a take
  taken, flops, busy = worker.take(4, version=0, next_group_size=1)
  assert [len(g) for g in taken.groups] == [2, 2] and flops == 40.0 and busy >= 0
  assert pipeline.group_size == 1 and pipeline.rows_held() == 0
  with pytest.raises(RuntimeError, match='no worker thread'):
    worker.take(4, version=0)
  worker.start()   # the thread: takes block until it has generated the batch
  for version in (1, 2, 3):
    worker.publish({'w': np.full(2, version)}, version)
    taken, _, _ = worker.take(4, version)
    assert [len(g) for g in taken.groups] == [1, 1, 1, 1]
    for r in (r for g in taken.groups for r in g):
      assert version - min(r.versions) <= 5 and len(r.tokens) == 3
  worker.close()
  assert worker._thread is None


def test_worker_errors_reach_the_trainer():
  def fail(params, rollouts, key):
    raise ValueError('boom')
  worker = inflight.RolloutWorker(_pipeline(), fail, jax.random.key(0))
  worker.publish({'w': np.zeros(1)}, 0)
  worker.start()
  with pytest.raises(RuntimeError, match='rollout worker failed'):
    worker.take(2, 0)
  worker.close()


def test_async_config_arguments_and_validation():
  for name in ('grpo', 'lisao', 'li2sao'):
    s = experiment.validate(load_config(name, 'async'), num_devices=8)
    assert getattr(s, name).inflight == InflightSettings(max_policy_lag=1, segment_tokens=16,
                                                         response_budget=80)
    assert getattr(experiment.validate(load_config(name), num_devices=8), name).inflight is None
  c = load_config('ppo')
  c.rollout.mode = 'async'
  with pytest.raises(experiment.ConfigError, match="rollout.mode='async' needs algorithm in"):
    experiment.validate(c, num_devices=8)
  c = load_config('lisao', 'async')
  c.rollout.segment_tokens = 0
  with pytest.raises(experiment.ConfigError, match='config.rollout: segment_tokens must be >= 1'):
    experiment.validate(c, num_devices=8)
  c.rollout.mode = 'later'
  with pytest.raises(experiment.ConfigError, match='config.rollout.mode must be one of'):
    experiment.validate(c, num_devices=8)
  # A run stored before the rollout section resumes synchronously only.
  stored = load_config('lisao').to_dict()
  del stored['rollout']
  assert run_record.differences(stored, load_config('lisao').to_dict()) == []
  assert run_record.differences(stored, load_config('lisao', 'async').to_dict()) == [
      "rollout.mode ('sync' -> 'async')"]
  assert compare.parse_method('li2sao:async').config_arg('bench') == 'bench,async'
  # The rollout sub-mesh: its devices come out of the training mesh's.
  c = load_config('li2sao', 'async')
  c.rollout.devices = 2
  s = experiment.validate(c, num_devices=8)
  assert s.rollout_devices == 2 and s.mesh_shape == (1, 6, 1)
  c.mesh.fsdp, c.mesh.tensor = 4, 2
  with pytest.raises(experiment.ConfigError, match=r'config.mesh: .*6 training devices beside 2 '
                     'rollout devices per process'):
    experiment.validate(c, num_devices=8)
  for devices, error in ((8, r'config.rollout.devices=8 leaves no training device: each process '
                             r'has 8 devices \(use 0..7\)'),
                         (-1, 'config.rollout.devices must be an integer >= 0, got -1')):
    c = load_config('li2sao', 'async')
    c.rollout.devices = devices
    with pytest.raises(experiment.ConfigError, match=error):
      experiment.validate(c, num_devices=8)
  c = load_config('li2sao')
  c.rollout.devices = 1
  with pytest.raises(experiment.ConfigError, match=r"config.rollout.devices=1 needs "
                     r"rollout.mode='async'"):
    experiment.validate(c, num_devices=8)
  assert run_record.differences(stored, load_config('lisao').to_dict()) == []


# --- The tiny model ------------------------------------------------------------------------------

BUDGET = 16
SIZES = {'grpo': {'grpo__problems_per_step': 4, 'grpo__group_size': 2},
         'lisao': {'lisao__problems_per_step': 8},
         'li2sao': {'li2sao__problems_per_step': 4, 'li2sao__group_size': 2}}


def _small(name, **extra):
  return {**SIZES[name], 'controller__response_budget': BUDGET, 'eval__temperature': 0.8,
          'eval__top_p': 1.0, 'eval__top_k': 0, 'rollout__mode': 'async', **extra}


def test_a_paused_rollout_resumes_from_its_prefix_under_the_new_weights(train_base, tmp_path,
                                                                        monkeypatch):
  """Segment 1 (4 tokens) under weights A (version 0), then B (version 1, random weights) is
  published and the rollouts finish under it: the stored log-probability of every token is the
  one its own version gives it after the whole prefix (recomputed by a full forward)."""
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, 'li2sao', **_small('li2sao'))
  rt, _, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  settings = InflightSettings(max_policy_lag=5, segment_tokens=4, response_budget=BUDGET)
  problems = iter(range(8))
  pipeline = InflightPipeline(settings, rt.train_prompts, lambda: next(problems), 1, capacity=8)
  worker = inflight.RolloutWorker(pipeline, inflight.sampler_segments(rt, settings),
                                  jax.random.key(3))
  params = {'A': state.params,
            'B': sharding.shard_params(models.init_params(rt.model_config, jax.random.key(9)),
                                       rt.mesh)}
  worker.publish(params['A'], 0)
  assert worker.run_once()
  worker.publish(params['B'], 1)
  while worker.run_once():
    pass
  taken = pipeline.take(8, version=1)
  rows = [rows_lib.Row(r.problem_index, r.prompt_P, 0, np.asarray(r.tokens, np.int32),
                       np.asarray(r.logprobs, np.float32), np.zeros(len(r.tokens)), r.stop_reason,
                       versions_N=np.asarray(r.versions)) for g in taken.groups for r in g]
  resumed = [r for r in rows if len(set(r.versions_N.tolist())) == 2]
  assert resumed  # some rollouts ran past the first segment
  # Their segments counted the decoding FLOPs of one whole generation each.
  assert worker.flops == sum(flops.decoding_flops(rt.model_config, len(r.context_P), len(r.new_N))
                             for r in rows)
  recomputed = {v: value_rows.read_logprobs(rt, params[v], rows) for v in ('A', 'B')}
  for i, r in enumerate(rows):
    n0 = int((r.versions_N == 0).sum())
    assert n0 == min(4, len(r.new_N)) and np.all(r.versions_N[n0:] == 1)
    np.testing.assert_allclose(r.logprobs_N[:n0], recomputed['A'][i][:n0], atol=2e-4)
    np.testing.assert_allclose(r.logprobs_N[n0:], recomputed['B'][i][n0:], atol=2e-4)
  after = np.concatenate([r.logprobs_N[4:] for r in resumed])
  under_a = np.concatenate([recomputed['A'][rows.index(r)][4:] for r in resumed])
  assert np.abs(after - under_a).mean() > 0.1  # not what weights A would have given them


def _train(train_base, workdir, monkeypatch, name, log=lambda *_: None, **extra):
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, name, **_small(name, **extra))
  return loop.train(c, str(workdir), log=log)


def _check_async(record, max_lag=1, critic=True):
  assert record['rows_trained'] == 8 and record['judge_failures'] == 0
  assert record['decoding_flops'] > 0 and record['tokens_generated'] > 0
  lags = [record[f'rollout/lag/{k}'] for k in range(max_lag + 1)]
  assert sum(lags) == pytest.approx(1.0) and 0.0 <= record['rollout/lag_mean'] <= max_lag
  assert record['rollout/dropped_samples'] == 0 and record['rollout/dropped_tokens'] == 0
  assert 0.0 <= record['rollout/overlap'] <= 1.0 and record['rollout/weights_square_sum'] > 0
  assert record['time/wait_rollouts'] >= 0 and record['time/publish_weights'] >= 0
  if critic:
    assert record['critic/update_norm'] > 0
  for minibatch in ('actor1', 'actor2'):
    assert record[f'{minibatch}/update_norm'] > 0


def test_grpo_async_step_through_loop_train(train_base, tmp_path, monkeypatch):
  """GRPO on a batch of groups from the worker: group-normalised advantages, the PPO-clipped
  ratio against the stored per-token log-probabilities (at step 1 all sampled by the initial
  policy: the first minibatch's ratio is 1)."""
  summary = _train(train_base, tmp_path, monkeypatch, 'grpo', num_steps=1)
  assert summary.finished and summary.last_step == 1 and is_finite_number(summary.final_score)
  record = read_records(str(tmp_path))[1]
  _check_async(record, critic=False)
  assert record['rollout/lag/0'] == 1.0 and 0.0 <= record['grpo/zero_variance_groups'] <= 1.0
  assert record['actor1/ratio'] == pytest.approx(1.0, abs=1e-3)


def test_lisao_async_step_through_loop_train(train_base, tmp_path, monkeypatch):
  summary = _train(train_base, tmp_path, monkeypatch, 'lisao', num_steps=1,
                   value_critic__warmup_steps=0)
  assert summary.finished and summary.last_step == 1 and is_finite_number(summary.final_score)
  record = read_records(str(tmp_path))[1]
  _check_async(record)
  assert record['rollout/lag/0'] == 1.0  # the first batch: all sampled by the initial policy


def test_li2sao_async_switch_trains_the_prefetched_group_batch_then_singletons(
    train_base, tmp_path, monkeypatch):
  """T_max = 1: the gate opens after step 1, while the worker already generates step 2's batch in
  groups of 2; step 2 trains it as groups, and step 3 trains single responses. The worker
  generates on a rollout sub-mesh of 2 of the 8 devices; the trainer's mesh has the other 6."""
  lines = []
  summary = _train(train_base, tmp_path, monkeypatch, 'li2sao', log=lines.append, num_steps=3,
                   li2sao__max_steps=1, li2sao__min_steps=1, rollout__devices=2)
  assert summary.finished and summary.last_step == 3
  assert ('training mesh: 6 devices (ids [0, 1, 2, 3, 4, 5]); rollout sub-mesh of each process: '
          '2 local devices (here ids [6, 7])') in lines
  records = read_records(str(tmp_path))
  # The train state lives on the training devices only; the worker's copy of the weights after
  # step 3 is the trained state's (its checkpoint).
  rt, _, state = experiment.build(
      tiny_config(train_base, 'li2sao', **_small('li2sao', rollout__devices=2)), str(tmp_path),
      log=lambda *_: None)
  assert {d.id for x in jax.tree.leaves(state) for d in x.devices()} == set(range(6))
  assert {d.id for d in rt.rollout_mesh.devices.flat} == {6, 7}
  ckpt = checkpointing.Checkpointer(str(tmp_path / 'checkpoints'))
  restored = ckpt.restore(state, step=3)[1]
  ckpt.close()
  assert records[3]['rollout/weights_square_sum'] == pytest.approx(
      sum(float(np.sum(np.square(np.asarray(x, np.float64)))) for x in
          jax.tree.leaves(restored.params)), rel=1e-5)
  assert records[2]['rollout/weights_square_sum'] != records[3]['rollout/weights_square_sum']
  for step in (1, 2, 3):
    _check_async(records[step])
  assert records[1]['rollout/lag/0'] == 1.0
  sizes = [(records[s]['li2sao/group_size'], records[s]['li2sao/problems']) for s in (1, 2, 3)]
  assert sizes == [(2, 4), (2, 4), (1, 8)]
  assert [records[s]['li2sao/switch_step'] for s in (1, 2, 3)] == [1, 1, 1]
  assert records[3]['critic/pairs'] == 0.0
