"""One training step of every config file with the tiny model, end to end (config file ->
loop.train -> metrics.jsonl, TensorBoard events, orbax checkpoint, plots, summary), on a task
with varied rewards so that the advantages are not 0; an actor update that moves the parameters
toward a known advantage; and what each AC2 variant changes at step 1 or 2 (every problem made
ready from step 2), with chunk_small's audited groups read by the critic where audits.jsonl says."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax import controller as ctl
from ac2_jax import models, tokenization
from ac2_jax.algorithms import ac2 as ac2_lib
from ac2_jax.bench import critic_drift
from ac2_jax.controller.audit_gate import AuditAdvantages
from ac2_jax.controller.steps import RequestKind
from ac2_jax.learner import critic_adapter
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.train import checkpoint_eval, checkpointing, critic_panels, experiment, loop
from ac2_jax.train import sft as sft_lib
from train_fixtures import (AC2_VARIANTS, REPO, as_flags, check_one_step,  # noqa: F401
                            compile_cache, is_finite_number, length_credit_build_task,
                            load_config, overrides, read_records, tiny_config, train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')

# End to end through loop.train: one step of each algorithm's config file.
RUNS = ('ac2', 'prefix_grpo', 'grpo')

# The config switch each AC2 variant argument must set.
VARIANT_SWITCH = {
    'no_audit': ('no_audit', True),
    'group1': ('group_size_one', True),
    'stale_buffer': ('stale_buffer', True),
    'correct_only': ('correct_only', True),
    'chunk_small': ('chunk_size', load_config('ac2').controller.chunk_size // 5),
    'no_local_readiness': ('no_local_readiness', True),
    'no_reference': ('no_reference', True),
}


@pytest.mark.parametrize('name', RUNS)
def test_one_step(train_base, tmp_path, monkeypatch, name):
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, name)
  summary = loop.train(c, str(tmp_path), log=lambda *_: None)
  records = read_records(str(tmp_path))
  assert sorted(records) == [0, 1]
  assert records[0]['val/mean_score'] == summary.start_score
  record = records[1]
  check_one_step(str(tmp_path), summary, record)
  assert is_finite_number(record['eps_high']) and record['eps_high'] > 0
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['algorithm'] == name
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
  else:
    assert record['num_refills'] == record['buffer_size'] == c.controller.n_refill


def test_rl_problems_is_the_pool_and_bank_from_data_seeds_the_bank(train_base, tmp_path):
  c = tiny_config(train_base, 'ac2', task__rl_problems=6, controller__bank_from_data=True)
  rt, algorithm, _ = experiment.build(c, str(tmp_path), log=lambda *_: None)
  first = rt.task.records('train')[:6]
  assert [r.id for r in rt.train_records] == [r.id for r in first]
  assert list(algorithm.controller.problem_ids) == [r.id for r in first]
  assert len(rt.task.records('train')) == c.task.builtin_num_train
  # Every problem starts with its data set's solution, in the form a passing rollout gives.
  assert algorithm.controller.bank.items() == [(i, r.reference_solution)
                                               for i, r in enumerate(first)]
  assert rt.task.reference_from_response(first[0].reference_solution.replace(
      '\n<answer>', '\n</think>\n\n<answer>')) == first[0].reference_solution


@pytest.fixture(scope='module')
def built(train_base, tmp_path_factory):
  """(config, runtime, state) of the tiny AC2 config with LengthCreditTask, built once."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
    c = tiny_config(train_base, 'ac2')
    rt, _, state = experiment.build(c, str(tmp_path_factory.mktemp('built')), log=lambda *_: None)
  return c, rt, state


def _copy(state):
  """A private copy of the train state: the jitted updates donate (consume) their input state."""
  return jax.tree.map(lambda x: jax.device_put(x, x.sharding, may_alias=False), state)


# Jitted: eagerly, the forward dispatches hundreds of small XLA programs, and one such run
# aborted inside XLA on a loaded 2-core machine (an xdist worker died and the suite hung).
_sequence_logprobs = jax.jit(updates.sequence_logprobs, static_argnums=(0, 3))


def _masked_logprob(rt, params, batch) -> float:
  logp = _sequence_logprobs(rt.model_config, params, batch.tokens_BxT,
                            rt.update_settings.temperature)
  return float(jnp.sum(logp * batch.loss_mask_BxT))


@pytest.mark.parametrize('sign', [1.0, -1.0])
def test_actor_update_moves_toward_the_advantage(built, sign):
  """On-policy rows with advantage +1 (-1) on their tokens: one actor update makes those tokens
  more (less) likely."""
  _, rt, state = built
  rows = []
  for i in range(4):
    new = rt.train_prompts[i + 1][-6:]
    rows.append(rows_lib.Row(problem_index=i, context_P=rt.train_prompts[i], prefix_len=0,
                             new_N=new, logprobs_N=np.zeros(len(new), np.float32),
                             entropies_N=np.ones(len(new), np.float32), stop_reason='eos',
                             advantage=sign, weight=1.0))
  batch = rows_lib.actor_batch(rt, rows)
  old = _sequence_logprobs(rt.model_config, state.params, batch.tokens_BxT,
                           rt.update_settings.temperature)
  batch = batch.replace(old_logprobs_BxT=old)  # ratio 1: the clip is not active
  before = _masked_logprob(rt, state.params, batch)
  moved, metrics = rt.actor_step(_copy(state), batch, jnp.float32(0.28))
  assert float(metrics['skipped']) == 0.0 and float(metrics['update_norm']) > 0
  after = _masked_logprob(rt, moved.params, batch)
  assert sign * (after - before) > 0, (before, after)


def _variant_steps(train_base, built, arg, before_step):
  """Two AC2 steps under the variant's settings (configs/ac2.py:ARG at the tiny sizes) on the
  built runtime; every problem is ready from step 2. Returns (settings, algorithm, plans,
  records)."""
  c, rt, state = built
  settings = experiment.controller_settings(tiny_config(train_base, 'ac2', arg))
  key, value = VARIANT_SWITCH[arg]
  assert getattr(settings, key) == value
  algorithm = ac2_lib.AC2(rt, settings, c.seed)
  state = _copy(state)
  plans, records = {}, {}
  for step in (1, 2):
    if step == 2:
      algorithm.controller.readiness.ready_P[:] = True
    before_step(step, algorithm)
    plans[step] = algorithm.controller.plan(step)  # step() takes this pending plan
    state, records[step] = algorithm.step(rt, state, step, experiment.step_key(c.seed, step))
  return settings, algorithm, plans, records


def _requests(plan, kind):
  return [r for r in plan.requests if r.kind == kind]


def _check_audit_reads(s, requests, groups, last_batch):
  """The audited groups' extra reads (the step's last critic batch, `AC2.audit_records`): per group,
  V(s) without the bank's reference, then V(s . c_i[:b]) with it for each continuation past b."""
  responses, references, values = last_batch
  assert len(groups) == len(requests) and groups
  k = 0
  for req, g in zip(requests, groups):
    assert (g['problem'], g['slot'], g['cut'], g['reference']) == (req.problem_id, req.slot,
                                                                    req.cut, True)
    np.testing.assert_array_equal(responses[k], req.prefix_tokens_P)
    assert references[k] is None and g['v_prefix_noref'] == values[k]
    k += 1
    assert g['chunk_end_read'] == [n > s.chunk_size for n in g['new_tokens']]
    for read, value in zip(g['chunk_end_read'], g['chunk_end_value']):
      if read:
        assert len(responses[k]) == req.cut + s.chunk_size and references[k] is not None
        np.testing.assert_array_equal(responses[k][:req.cut], req.prefix_tokens_P)
        assert value == values[k]
        k += 1
  assert k == len(responses) and any(any(g['chunk_end_read']) for g in groups)


@pytest.mark.parametrize('arg', AC2_VARIANTS)
def test_variant_acts_at_step_1_or_2(train_base, built, monkeypatch, arg):
  _, rt, _ = built
  seen_references = []
  if arg == 'no_reference':
    # A reference for every problem in the bank: without the switch, the critic would read them.
    real = rt.task.critic_instruction
    monkeypatch.setattr(rt.task, 'critic_instruction',
                        lambda ref, response='': seen_references.append(ref) or real(ref, response))

  reads = []  # chunk_small: every critic-read batch of step 2, through the real reader
  if arg == 'chunk_small':
    real_reader = rows_lib.critic_reader

    def spied_reader(readout):
      def read(rt_, params, prompts, responses, references, policy_params=None):
        values = real_reader(readout)(rt_, params, prompts, responses, references, policy_params)
        reads.append((list(responses), list(references), values))
        return values
      return read
    monkeypatch.setattr(rows_lib, 'critic_reader', spied_reader)

  def before_step(step, algorithm):
    reads.clear()
    if arg == 'no_reference' and step == 1:
      algorithm.controller.bank.load_items(
          [(p, r.reference_solution) for p, r in enumerate(rt.train_records)])
    if arg == 'no_local_readiness' and step == 1:
      algorithm.controller.readiness.global_ok = lambda: True  # the global test passes

  s, algorithm, plans, records = _variant_steps(train_base, built, arg, before_step)
  ready = _requests(plans[2], RequestKind.READY_CHUNK)
  audits = _requests(plans[2], RequestKind.AUDIT)
  for step in (1, 2):
    assert records[step]['actor1/skipped'] == 0.0 and records[step]['rows_trained'] > 0
  if arg == 'no_audit':
    assert not audits and len(ready) == s.n_batch
  else:
    assert len(audits) == math.ceil(s.audit_fraction * s.n_batch) or arg == 'correct_only'
  if arg == 'group1':  # single continuations from distinct cuts of the ready slots
    assert len(ready) > s.n_batch - len(audits)
    assert all(r.num_continuations == 1 for r in ready)
    assert records[2]['num_dropped_rows'] <= len(ready)
  elif ready:
    assert all(r.num_continuations == s.group_size for r in ready)
  if arg == 'stale_buffer':  # the whole buffer collected at step 1, no refills at step 2
    collected = s.n_refill * s.stale_factor
    assert records[1]['num_refills'] == records[1]['buffer_size'] == collected
    assert records[2]['num_refills'] == 0 and records[2]['buffer_size'] == collected
  else:
    assert records[2]['num_refills'] == s.n_refill
  if arg == 'correct_only':  # only passing rollouts enter the buffer; none: cold start again
    assert all(t.passed for t in algorithm.controller.replay.trajectories)
    if records[1]['buffer_size'] == 0:
      assert len(_requests(plans[2], RequestKind.COLD_START)) == s.n_batch
  if arg == 'chunk_small':  # chunks of b / 5 new tokens from cuts on a grid of b / 5
    assert ready and all(r.max_new_tokens <= s.chunk_size and r.cut % s.cut_grid == 0
                         for r in ready)
    assert s.chunk_size < load_config('ac2').controller.chunk_size
    assert records[2]['routed_to_critic'] > 0
    _check_audit_reads(s, audits, algorithm.audited_groups(), reads[-1])
  if arg == 'no_local_readiness':  # every problem ready at once, with no reference or low error
    assert records[1]['num_newly_ready'] == len(rt.train_records)
  if arg == 'no_reference':
    assert len(algorithm.controller.bank) == len(rt.train_records)
    assert seen_references and all(ref is None for ref in seen_references)


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


def test_critic_adapter_through_the_trainer_and_a_resume(train_base, compile_cache, tmp_path,
                                                         monkeypatch):
  """The `adapter` variant (`critic.adapter_rank`): the critic update trains the adapter, the
  checkpoint holds it, and a stopped run resumes into it. The resume also names a compilation
  cache (the suite's own directory): a key a resume may change, and one the trainer hands to jax
  with every program kept (tests/conftest.py keeps those over 0.5 s)."""
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, 'ac2', 'adapter', num_steps=2)
  rank = c.critic.adapter_rank
  assert rank > 0
  assert loop.train(c, str(tmp_path), stop_after=1, log=lambda *_: None).last_step == 1
  lines = []
  kept = {k: getattr(jax.config, k) for k in ('jax_persistent_cache_min_compile_time_secs',
                                                'jax_persistent_cache_min_entry_size_bytes')}
  c.compilation_cache_dir = compile_cache
  try:
    assert loop.train(c, str(tmp_path), log=lines.append).last_step == 2
    assert jax.config.jax_compilation_cache_dir == os.path.abspath(compile_cache)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
  finally:  # the rest of the module keeps the suite's thresholds
    for k, v in kept.items():
      jax.config.update(k, v)
  assert any(m.startswith('resumed from step 1') for m in lines)
  records = read_records(str(tmp_path))
  assert sorted(records) == [0, 1, 2]
  assert all(records[s]['critic/pairs'] > 0 and records[s]['critic/update_norm'] > 0
             for s in (1, 2))
  _, params = models.load_hf_checkpoint(train_base[1])
  target = critic_adapter.init_state(
      params, critic_adapter.init_adapter(params, rank, jax.random.key(0)),
      state_lib.OptimSettings())
  ckpt = checkpointing.Checkpointer(os.path.join(str(tmp_path), 'checkpoints'))
  try:
    step, state, _ = ckpt.restore(target)
  finally:
    ckpt.close()
  assert step == 2 and isinstance(state, critic_adapter.AdapterState)
  assert max(float(np.abs(np.asarray(b)).max())
             for b in jax.tree.leaves(state.critic_adapter) if b.shape[0] == rank) > 0  # B moved
  # bench.py critic_drift on this checkpoint: the buffer's records, read under each weight pair.
  rt, algorithm, warm = experiment.build(c, str(tmp_path), log=lambda *_: None)
  _, state, saved = checkpoint_eval.restore_run_state(checkpoint_eval.resolve(str(tmp_path)), c,
                                                      warm)  # on the run's shardings
  algorithm.load_state_dict(saved['algorithm'])
  drift = critic_drift.run(rt, algorithm, warm, state, draws=2, log=lambda *_: None)
  assert list(drift) == ['run critic W_t + A_t B_t', 'W_0 + A_t B_t', 'warm start W_0',
                         'policy W_t']
  records = critic_drift.buffer_records(algorithm.controller, 2)
  assert {f['records'] for f in drift.values()} == {len(records)} and records
  np.testing.assert_allclose(drift['warm start W_0']['target_mean'],
                             np.mean([r.target for r in records]))
  direct = rows_lib.critic_reader(rt.critic_readout)(
      rt, params, [rt.prompt_ids_by_id[r.problem_id] for r in records],
      [r.prefix_tokens_P for r in records], [r.reference for r in records])
  assert drift['warm start W_0']['invalid'] == sum(v is None for v in direct)
  if any(v is not None for v in direct):  # a 3-step warm start rarely puts half its mass on grid
    np.testing.assert_allclose(drift['warm start W_0']['read_mean'],
                               np.mean([v for v in direct if v is not None]), rtol=1e-5)


def test_chunk_end_pairs_join_the_critic_update(train_base, tmp_path, monkeypatch):
  """`controller.chunk_end_pairs`: the step's judged chunk ends are trained beside the buffer's
  pairs (each a record or two), and the step runs through."""
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, 'ac2', **{'controller.chunk_end_pairs': 6})
  loop.train(c, str(tmp_path), log=lambda *_: None)
  record = read_records(str(tmp_path))[1]
  assert 0 < record['critic/chunk_end_pairs'] <= 6
  assert record['critic/records'] >= record['critic/pairs'] + record['critic/chunk_end_pairs']
  assert is_finite_number(record['critic/loss']) and record['critic/skipped'] == 0.0


@pytest.fixture
def recorded_plans(monkeypatch):
  """Every (controller, plan) the controllers make, in order."""
  plans = []
  real_plan = ctl.Controller.plan

  def recorded(self, step):
    plan = real_plan(self, step)
    plans.append((self, plan))
    return plan

  monkeypatch.setattr(ctl.Controller, 'plan', recorded)
  return plans


def test_cuts_before_uncredited_lines_through_the_trainer(train_base, tmp_path, recorded_plans):
  """`controller.cut_before_uncredited` under leading credit: every refill stored in the buffer
  carries the token position of its first line without credit (recomputed here from its text),
  and the next step's replayed prefixes end at or before it."""
  c = tiny_config(train_base, 'prefix_grpo', num_steps=2, task__builtin_scoring='leading_fine',
                  controller__cut_before_uncredited=True)
  loop.train(c, str(tmp_path), log=lambda *_: None)
  controller, plan = recorded_plans[-1]
  task, tok = experiment.build_task(c, str(tmp_path), None)
  records = {r.id: r for r in task.records('train')}
  stored = {t.trajectory_id: t for t in controller.replay.trajectories}
  for t in stored.values():
    end = task.replay_cut_end(records[controller.problem_ids[t.problem]],
                              tok.decode(t.tokens_L.tolist()))
    assert t.cut_end == tokenization.tokens_within(tok, t.tokens_L, end)
  replayed = [r for r in plan.requests if r.kind != RequestKind.REFILL]
  assert replayed and all(r.cut <= stored[r.source_trajectory_id].cut_end for r in replayed)
  with pytest.raises(experiment.ConfigError, match='cut_before_uncredited'):
    experiment.validate(tiny_config(train_base, 'prefix_grpo', 'walk',
                                    controller__cut_before_uncredited=True))


@pytest.mark.parametrize('arg', ['uncredited', 'at_uncredited'])
def test_chunks_run_through_uncredited_lines_through_the_trainer(train_base, tmp_path,
                                                                recorded_plans, arg):
  """`controller.chunk_through_uncredited` (AC2 variants `uncredited`, `at_uncredited`): every
  stored refill carries the token position just past its first line without credit (recomputed
  here from its text); at the next step, with every problem ready, each ready chunk and audit
  reaches at least that far, b at the least, the budget at the most, and the audits read the
  critic at those chunk ends. `at_uncredited` (controller.cut_at_uncredited) also cuts every
  prefix at its trajectory's cut end itself."""
  c = tiny_config(train_base, 'ac2', arg, task__builtin_scoring='leading_fine')
  assert c.controller.cut_before_uncredited and c.controller.chunk_through_uncredited
  assert c.controller.cut_at_uncredited == (arg == 'at_uncredited')
  rt, algorithm, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  state, _ = algorithm.step(rt, state, 1, experiment.step_key(c.seed, 1))
  controller = recorded_plans[-1][0]
  records = {r.id: r for r in rt.task.records('train')}
  stored = {t.trajectory_id: t for t in controller.replay.trajectories}
  for t in stored.values():
    end = rt.task.replay_chunk_end(records[controller.problem_ids[t.problem]],
                                   rt.tokenizer.decode(t.tokens_L.tolist()))
    assert t.chunk_end == (None if end is None
                           else tokenization.tokens_reaching(rt.tokenizer, t.tokens_L, end))
  controller.readiness.ready_P[:] = True
  state, _ = algorithm.step(rt, state, 2, experiment.step_key(c.seed, 2))
  plan = recorded_plans[-1][1]
  b, budget = c.controller.chunk_size, c.controller.response_budget
  ready = [r for r in plan.requests if r.kind in (RequestKind.READY_CHUNK, RequestKind.AUDIT)]
  assert ready
  for r in ready:
    source = stored[r.source_trajectory_id]
    if arg == 'at_uncredited':
      assert r.cut == min(source.cut_end, source.length - 1)
    end = source.chunk_end
    assert r.chunk_tokens == (b if end is None else max(b, end - r.cut))
    if r.kind == RequestKind.READY_CHUNK:
      assert r.max_new_tokens == min(r.chunk_tokens, budget - r.cut)
  assert any(r.chunk_tokens > b for r in ready)  # the tiny policy's first lines lack credit
  audits = {(g['slot'], g['cut']): g for g in algorithm.audited_groups()}
  assert audits and len(audits) < len(ready)
  for r in ready:
    if r.kind == RequestKind.AUDIT:
      g = audits[(r.slot, r.cut)]
      assert g['chunk_end_read'] == [n > r.chunk_tokens for n in g['new_tokens']]


def _every_problem_ready_at_step_2(train_base, tmp_path, variant: str, before=lambda _: None):
  """An AC2 variant's run through step 1, then every problem made ready (and `before` applied to
  the controller) and step 2: (config, runtime, algorithm, state, step 2's record)."""
  c = tiny_config(train_base, 'ac2', variant)
  rt, algorithm, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  state, _ = algorithm.step(rt, state, 1, experiment.step_key(c.seed, 1))
  algorithm.controller.readiness.ready_P[:] = True
  before(algorithm.controller)
  state, record = algorithm.step(rt, state, 2, experiment.step_key(c.seed, 2))
  return c, rt, algorithm, state, record


def test_audit_gate_through_the_trainer(train_base, tmp_path, recorded_plans):
  """AC2 variant `audit_gate`: with every problem ready at step 2 and no audit yet, every ready
  slot is audited; the controller's gate sees the same chunk-end reads and rewards as the audit
  records (its correlation is the critic panels' over them), and step 3 audits every ready slot
  or alpha of them as the gate says."""
  c, rt, algorithm, state, record = _every_problem_ready_at_step_2(train_base, tmp_path,
                                                                  'audit_gate')
  assert c.controller.audit_gate
  controller = algorithm.controller
  kinds = [r.kind for r in recorded_plans[-1][1].requests if r.kind != RequestKind.REFILL]
  assert kinds == [RequestKind.AUDIT] * c.controller.n_batch
  audited = critic_panels.groups([{'step': 2, 'groups': algorithm.audited_groups()}])
  assert any(g.critic_share > 0 for g in audited)
  panel = critic_panels.summarize(audited)
  assert controller.audit_gate.num_rows == panel['advantage_rows'] > 0
  np.testing.assert_allclose(record['critic_audit_corr'], panel['advantage_corr'])
  trusted = controller.audit_gate.trusted()
  assert record['critic_trusted'] == float(trusted)
  state, _ = algorithm.step(rt, state, 3, experiment.step_key(c.seed, 3))
  plan = recorded_plans[-1][1]
  audits = [r for r in plan.requests if r.kind == RequestKind.AUDIT]
  assert len(audits) == (math.ceil(c.controller.audit_fraction * plan.num_ready_slots) if trusted
                         else plan.num_ready_slots)


@pytest.fixture
def assigned(monkeypatch):
  """Every step's StepData, recorded after AC2 assigned its advantages."""
  steps = []
  real_assign = ac2_lib.AC2.assign_advantages

  def recording(self, data):
    real_assign(self, data)
    steps.append(data)

  monkeypatch.setattr(ac2_lib.AC2, 'assign_advantages', recording)
  return steps


def test_audit_scale_through_the_trainer(train_base, tmp_path, assigned):
  """AC2 variant `audit_scale`: with every problem ready and the gate's window seeded with audit
  rows whose Monte Carlo advantages are twice the critic's, the step logs the controller's scale
  (above 1), and on that step's rows, their critic reads set to distinct values (the tiny critic's
  are mostly invalid), a ready group trains on the scale times v_i - mean_j v_j, an audited
  group on its plain r_i - mean_j r_j."""
  critic_A = np.linspace(-0.2, 0.2, 64)
  c, _, algorithm, _, record = _every_problem_ready_at_step_2(
      train_base, tmp_path, 'audit_scale',
      lambda controller: controller.audit_gate.record_step(
          [AuditAdvantages(0.5, 0.5, critic_A, 2 * critic_A)]))
  assert c.controller.audit_scale
  controller = algorithm.controller
  scale = controller.chunk_advantage_scale
  assert 1.0 < scale <= c.controller.audit_scale_max
  assert record['chunk_advantage_scale'] == pytest.approx(scale)
  data = assigned[-1]
  groups = {}
  for row in data.rows:
    groups.setdefault(row.request_index, []).append(row)
  kinds = {i: data.plan.requests[i].kind for i in groups}
  ready = [m for i, m in groups.items() if kinds[i] == RequestKind.READY_CHUNK
           and any(r.to_critic for r in m)]
  audited = [m for i, m in groups.items() if kinds[i] == RequestKind.AUDIT]
  assert ready and audited
  for members in ready:
    for k, m in enumerate(members):
      if m.to_critic:
        m.critic_value = 0.1 * (k + 1)
  algorithm.assign_advantages(data)
  for members, factor in [(m, scale) for m in ready] + [(m, 1.0) for m in audited]:
    v = np.array([m.actor_value for m in members])
    np.testing.assert_allclose([m.rollout.advantage for m in members], factor * (v - v.mean()),
                               atol=1e-5)


def test_trained_refills_through_the_trainer(train_base, tmp_path, assigned):
  """AC2 variant `trained_refills`: at step 1 (nothing ready) no refill is trained; at step 2,
  every problem ready, the critic reads every refill's empty prefix and the step logs how many
  refills trained; on that step's rows, the reads set by hand (the tiny critic's are mostly
  invalid), a refill trains on r - V(s0) with weight 1, one whose read is invalid with weight 0."""
  c, _, algorithm, _, record = _every_problem_ready_at_step_2(train_base, tmp_path,
                                                             'trained_refills')
  assert c.controller.train_refills
  step1, data = assigned
  assert all(r.rollout.weight == 0 for r in step1.rows_of(RequestKind.REFILL))
  refills = [i for i, r in enumerate(data.plan.requests) if r.kind == RequestKind.REFILL]
  assert len(refills) == c.controller.n_refill and set(refills) <= set(data.prefix_values)
  assert record['refills_trained'] == sum(data.prefix_values[i] is not None for i in refills)
  baselines = {i: None if k == 0 else 0.1 * k for k, i in enumerate(refills)}
  data.prefix_values.update(baselines)
  algorithm.assign_advantages(data)
  for row in data.rows_of(RequestKind.REFILL):
    baseline = baselines[row.request_index]
    assert row.rollout.weight == (0.0 if baseline is None else 1.0)
    if baseline is not None:
      assert row.rollout.advantage == pytest.approx(row.grade.reward - baseline, abs=1e-6)


def test_critic_updates_train_the_critic_more_than_once_a_step(train_base, tmp_path, monkeypatch):
  """`controller.critic_updates`: two updates a step on two draws; their records add up and the
  run goes through."""
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  c = tiny_config(train_base, 'ac2', **{'controller.critic_updates': 2})
  loop.train(c, str(tmp_path), log=lambda *_: None)
  record = read_records(str(tmp_path))[1]
  drawn = min(record['critic_buffer_size'], c.controller.critic_pairs_per_update)
  assert record['critic/pairs'] + record['critic/skipped_context'] == 2 * drawn > 0
  assert record['critic/records'] >= record['critic/pairs']
  assert is_finite_number(record['critic/loss']) and record['critic/skipped'] == 0.0


def test_critic_adapter_needs_ac2(train_base):
  c = tiny_config(train_base, 'grpo')
  c.critic.adapter_rank = 4
  with pytest.raises(experiment.ConfigError, match='critic.adapter_rank'):
    experiment.validate(c)
