"""Checkpointing: save mid-run as JSON, restore into a fresh controller, continue identically."""

import json

import numpy as np
import pytest

from ac2_jax.controller import Controller, RequestKind
from controller_harness import make_results, problem_ids, tiny_settings


def _base(step, r):
  return ((step * 3 + int(r.problem_id[1:])) % 5) / 4


def _value(step):
  # Mostly the problem's base value, now and then an invalid one.
  return lambda r, j: None if (j == 3 and (step + r.slot) % 4 == 0) else _base(step, r)


def _prefix(step):
  # Close to the target, now and then unparseable.
  def prefix(r):
    if (step * 7 + r.slot + r.cut) % 19 == 0:
      return None
    return min(1.0, _base(step, r) + 0.05 * ((r.slot + step) % 2))
  return prefix


def _step(controller, step):
  plan = controller.plan(step)
  # References are token arrays, as the trainer would pass them.
  results = make_results(plan, controller.settings, value=_value(step), prefix=_prefix(step),
                         reference=lambda r, j: np.array([step, j, len(r.problem_id)], np.int32))
  outcome = controller.observe(step, results)
  eps_high = controller.update_entropy(0.1 if step % 3 else 0.5)
  lr = controller.observe_update_norms(2.0 if step % 4 else 0.5, 0.5, 0.5, finite=step != 6)
  batch = controller.critic_batch(step, context_limit=35)
  return plan, outcome, eps_high, lr, batch


def _signature(plan, outcome, eps_high, lr, batch):
  requests = [(r.kind.value, r.problem_id, r.slot, r.source_trajectory_id, r.cut,
               r.num_continuations, r.max_new_tokens, r.prefix_tokens_P.tolist())
              for r in plan.requests]
  records = [(r.problem_id, r.target, r.value,
              None if r.reference is None else np.asarray(r.reference).tolist(), r.weight,
              r.prefix_tokens_P.tolist()) for r in batch.records]
  return (requests, np.nan_to_num(outcome.targets_R, nan=-1).tolist(),
          np.nan_to_num(outcome.errors_R, nan=-1).tolist(), outcome.newly_ready,
          outcome.stats.as_dict().__repr__(), eps_high, lr, records, batch.num_skipped)


@pytest.mark.parametrize('changes', [dict(), dict(group_size_one=True),
                                     dict(stale_buffer=True, stale_period=3, stale_factor=2)])
def test_restore_mid_run_continues_exactly(changes):
  s = tiny_settings(n_batch=8, **changes)
  ids = problem_ids(9)
  straight = Controller(s, seed=11, problem_ids=ids)
  resumed = Controller(s, seed=11, problem_ids=ids)
  for step in range(7):
    _step(straight, step)
    _step(resumed, step)
  # Strict JSON: what orbax JsonSave writes.
  text = json.dumps(resumed.state_dict(), allow_nan=False)
  resumed = Controller(s, seed=11, problem_ids=ids)
  resumed.load_state_dict(json.loads(text))
  assert json.dumps(resumed.state_dict(), allow_nan=False) == text
  kinds, eps_highs = set(), set()
  for step in range(7, 13):
    a, b = _step(straight, step), _step(resumed, step)
    assert _signature(*a) == _signature(*b)
    kinds.update(r.kind for r in a[0].requests)
    eps_highs.add(a[2])
  assert json.dumps(straight.state_dict()) == json.dumps(resumed.state_dict())
  # The scripted run really exercised readiness, the bank and both kinds of request.
  assert straight.readiness.num_ready > 0 and len(straight.bank) > 0
  assert RequestKind.READY_CHUNK in kinds and RequestKind.UNREADY in kinds
  assert len(eps_highs) > 1 and straight.critic_lr < s.critic_lr_init


def test_branching_a_variant_from_a_checkpoint_trims_buffers_to_new_capacities():
  s = tiny_settings(n_batch=8)
  ids = problem_ids(9)
  c = Controller(s, seed=3, problem_ids=ids)
  for step in range(6):
    _step(c, step)
  state = json.loads(json.dumps(c.state_dict()))
  newest_pairs = [(p.problem, p.cut, p.target, p.step) for p in c.critic_buffer.pairs][-5:]
  newest_trajectories = [t.trajectory_id for t in c.replay.trajectories][-4:]
  branch = Controller(s.replace(critic_buffer_capacity=5, buffer_capacity=4,
                                no_local_readiness=True, critic_pairs_per_update=5),
                      seed=3, problem_ids=ids)
  branch.load_state_dict(state)
  assert [(p.problem, p.cut, p.target, p.step) for p in branch.critic_buffer.pairs] == newest_pairs
  assert [t.trajectory_id for t in branch.replay.trajectories] == newest_trajectories
  assert branch.plan(6).step == 6
  with pytest.raises(ValueError, match='other problem ids'):
    Controller(s, seed=3, problem_ids=problem_ids(10)).load_state_dict(state)
  with pytest.raises(ValueError, match='version'):
    Controller(s, seed=3, problem_ids=ids).load_state_dict({**state, 'version': 99})


def test_trajectories_keep_their_cut_and_chunk_ends_through_a_restore():
  s = tiny_settings(n_batch=8, cut_before_uncredited=True, chunk_through_uncredited=True)
  ids = problem_ids(5)
  end_of = lambda problem_id: None if problem_id == 'p0' else 3 * int(problem_id[1:])
  c = Controller(s, seed=3, problem_ids=ids)
  for step in range(3):
    plan = c.plan(step)
    c.observe(step, make_results(plan, s, cut_end=lambda r: end_of(r.problem_id),
                                 chunk_end=lambda r: 4 + 5 * int(r.problem_id[1:])))
  restored = Controller(s, seed=3, problem_ids=ids)
  restored.load_state_dict(json.loads(json.dumps(c.state_dict(), allow_nan=False)))
  got = {t.trajectory_id: (t.cut_end, t.chunk_end) for t in restored.replay.trajectories}
  assert got == {t.trajectory_id: (end_of(ids[t.problem]), 4 + 5 * t.problem)
                 for t in c.replay.trajectories}
  assert (None, 4) in got.values() and (12, 24) in got.values()
  # A state saved before trajectories kept cut (chunk) ends restores them as None.
  state = c.state_dict()
  del state['trajectories']['cut_ends'], state['trajectories']['chunk_ends']
  old = Controller(s, seed=3, problem_ids=ids)
  old.load_state_dict(json.loads(json.dumps(state)))
  assert {(t.cut_end, t.chunk_end) for t in old.replay.trajectories} == {(None, None)}
