"""Planning and observing steps: refills, cold start, replay, routing, targets, critic batches."""

import collections
import dataclasses

import numpy as np
import pytest

from ac2_jax.controller import (ChunkEnd, Continuation, Controller, RequestKind, RequestResult,
                                ValueSource)
from ac2_jax.controller import sampling
from ac2_jax.controller.audit_gate import AuditAdvantages
from controller_harness import make_results, problem_ids, run_step, tiny_settings


def _make_ready(controller, steps=5):
  """Perfect critic, passing rollouts: every problem in the buffer is ready after `steps` steps."""
  for step in range(steps):
    run_step(controller, step, value=lambda r, j: 1.0, prefix=lambda r: 1.0)


def test_cold_start_then_refills_fill_the_buffer_fifo():
  s = tiny_settings(n_refill=4, n_batch=5, buffer_capacity=6)
  c = Controller(s, seed=0, problem_ids=problem_ids(10))
  plan = c.plan(0)
  refills = [r for r in plan.requests if r.kind == RequestKind.REFILL]
  cold = [r for r in plan.requests if r.kind == RequestKind.COLD_START]
  assert len(refills) == 4 and len({r.problem_id for r in refills}) == 4   # distinct in the step
  assert all(r.num_continuations == 1 and r.max_new_tokens == 50 and not r.needs_prefix_value
             and r.cut == 0 and not r.trained for r in refills)
  assert [r.slot for r in cold] == list(range(5)) and len({r.problem_id for r in cold}) == 5
  assert all(r.num_continuations == 4 and r.max_new_tokens == r.remaining_budget == 50
             and r.needs_prefix_value and r.empty_prefix and not r.critic_may_score for r in cold)
  assert plan.prefix_value_requests == tuple(range(4, 9))
  outcome = c.observe(0, make_results(plan, s))
  assert outcome.stats.buffer_size == 4 and outcome.stats.num_cold_start == 5
  added = [[r.problem_id for r in plan.requests if r.kind == RequestKind.REFILL]]
  for step in (1, 2):
    plan, _ = run_step(c, step)
    assert plan.count(RequestKind.COLD_START) == 0 and plan.count(RequestKind.UNREADY) == 5
    added.append([r.problem_id for r in plan.requests if r.kind == RequestKind.REFILL])
  # Capacity 6 keeps the newest six refills: the last two of step 1 and all four of step 2.
  kept = c.replay.trajectories
  assert [c.problem_ids[t.problem] for t in kept] == added[1][2:] + added[2]
  assert [t.step for t in kept] == [1, 1, 2, 2, 2, 2]


def test_replay_slots_cycle_through_the_buffers_problems_and_cut_prefixes():
  s = tiny_settings(n_refill=3, n_batch=7)
  c = Controller(s, seed=5, problem_ids=problem_ids(3))
  run_step(c, 0)
  plan = c.plan(1)
  replay = [r for r in plan.requests if r.kind != RequestKind.REFILL]
  counts = collections.Counter(r.problem_id for r in replay)
  assert sorted(counts.values()) == [2, 2, 3]                # a permutation of 3 problems, cycled
  assert [r.problem_id for r in replay[:3]] == [r.problem_id for r in replay[3:6]]
  stored = {t.trajectory_id: t for t in c.replay.trajectories}
  for r in replay:
    source = stored[r.source_trajectory_id]
    assert c.problem_ids[source.problem] == r.problem_id
    assert np.array_equal(r.prefix_tokens_P, source.tokens_L[:r.cut])
    assert r.cut % s.cut_grid == 0 and r.cut <= 0.9 * source.length
    assert r.remaining_budget == 50 - r.cut and r.max_new_tokens == r.remaining_budget
    assert r.kind == RequestKind.UNREADY and not r.critic_may_score


def test_cuts_stay_at_or_before_each_trajectorys_cut_end():
  s = tiny_settings(n_refill=4, n_batch=40, cut_before_uncredited=True)
  c = Controller(s, seed=2, problem_ids=problem_ids(4))
  # p0: no end (the grid and 0.9 L decide); p1: 0 (only the empty prefix); p2: 19, p3: 30.
  ends = {'p0': None, 'p1': 0, 'p2': 19, 'p3': 30}
  run_step(c, 0, cut_end=lambda r: ends[r.problem_id])
  stored = {t.trajectory_id: t for t in c.replay.trajectories}
  assert {c.problem_ids[t.problem]: t.cut_end for t in stored.values()} == ends
  cuts = collections.defaultdict(set)
  for r in c.plan(1).requests:
    if r.kind != RequestKind.REFILL:
      cuts[r.problem_id].add(r.cut)
  assert cuts['p1'] == {0} and cuts['p2'] == {0, 10} and cuts['p3'] == {0, 10, 20, 30}
  p0_length, = [t.length for t in stored.values() if t.problem == 0]
  assert 0 < max(cuts['p0']) <= 0.9 * p0_length
  # Group-size-1 singles draw their distinct cuts under the same ends.
  assert list(sampling.cut_candidates(27, 10, 0.9, 19)) == [0, 10]
  assert list(sampling.cut_candidates(27, 10, 0.9)) == [0, 10, 20]


def test_cuts_at_each_trajectorys_cut_end():
  s = tiny_settings(n_refill=4, n_batch=40, cut_before_uncredited=True, cut_at_uncredited=True)
  c = Controller(s, seed=2, problem_ids=problem_ids(4))
  # p0: no end (the grid draw stays); p1: 0; p2: 19 (off the grid of 10); p3: 99, past L - 1.
  ends = {'p0': None, 'p1': 0, 'p2': 19, 'p3': 99}
  run_step(c, 0, cut_end=lambda r: ends[r.problem_id])
  cuts = collections.defaultdict(set)
  for r in c.plan(1).requests:
    if r.kind != RequestKind.REFILL:
      cuts[r.problem_id].add(r.cut)
  p0, p3 = (next(t for t in c.replay.trajectories if t.problem == k) for k in (0, 3))
  assert cuts['p1'] == {0} and cuts['p2'] == {19} and cuts['p3'] == {p3.length - 1}
  assert len(cuts['p0']) > 1 and all(cut % 10 == 0 and cut <= 0.9 * p0.length
                                     for cut in cuts['p0'])
  # The draw behind the cuts is the same as without the switch: the slots and audits do not move.
  plain = Controller(dataclasses.replace(s, cut_at_uncredited=False), seed=2,
                     problem_ids=problem_ids(4))
  run_step(plain, 0, cut_end=lambda r: ends[r.problem_id])
  assert ([(r.kind, r.slot, r.source_trajectory_id) for r in plain.plan(1).requests]
          == [(r.kind, r.slot, r.source_trajectory_id) for r in c.plan(1).requests])
  with pytest.raises(ValueError, match='cut_at_uncredited needs cut_before_uncredited'):
    tiny_settings(cut_at_uncredited=True)


def test_ready_chunks_run_through_each_trajectorys_chunk_end():
  s = tiny_settings(n_refill=6, n_batch=30, chunk_size=10, cut_grid=10,
                    cut_before_uncredited=True, chunk_through_uncredited=True)
  c = Controller(s, seed=2, problem_ids=problem_ids(6))
  # p0: no chunk end (b decides); p1: 6, before any chunk from a cut at 0 ends; p2: 27; p3-p5: 44
  # (a chunk from cut 10 would reach 44, past the budget of 50 from cut 20: capped there).
  reach = {'p0': None, 'p1': 6, 'p2': 27}
  for step in range(5):  # as _make_ready, with the chunk ends
    run_step(c, step, value=lambda r, j: 1.0, prefix=lambda r: 1.0,
             length=lambda r: 45, chunk_end=lambda r: reach.get(r.problem_id, 44))
  plan = c.plan(5)
  ready = [r for r in plan.requests if r.kind in (RequestKind.READY_CHUNK, RequestKind.AUDIT)]
  assert plan.count(RequestKind.READY_CHUNK) > 0 and plan.count(RequestKind.AUDIT) > 0
  for r in ready:
    end = reach.get(r.problem_id, 44)
    assert r.chunk_tokens == (10 if end is None else max(10, end - r.cut))
    if r.kind == RequestKind.READY_CHUNK:
      assert r.critic_may_score and r.max_new_tokens == min(r.chunk_tokens, 50 - r.cut)
    else:
      assert not r.critic_may_score and r.max_new_tokens == 50 - r.cut
  assert any(r.chunk_tokens > 10 for r in ready)
  # Only refills are stored, so only they may carry ends.
  results = make_results(plan, s)
  k = next(i for i, r in enumerate(plan.requests) if r.kind == RequestKind.READY_CHUNK)
  bad = dataclasses.replace(results[k], continuations=(
      dataclasses.replace(results[k].continuations[0], chunk_end=3),
      *results[k].continuations[1:]))
  with pytest.raises(ValueError, match='only refills carry a chunk_end'):
    c.observe(5, [*results[:k], bad, *results[k + 1:]])
  # Without cut_before_uncredited a cut could lie past the line: a config error.
  with pytest.raises(ValueError, match='chunk_through_uncredited needs cut_before_uncredited'):
    tiny_settings(chunk_through_uncredited=True)
  # Off, every ready slot's chunk is b.
  off = Controller(tiny_settings(n_refill=6, n_batch=10, chunk_size=10, cut_grid=10),
                   seed=2, problem_ids=problem_ids(6))
  _make_ready(off)
  assert {r.chunk_tokens for r in off.plan(5).requests
          if r.kind in (RequestKind.READY_CHUNK, RequestKind.AUDIT)} == {10}


def test_ready_chunks_audits_and_caps():
  s = tiny_settings(n_refill=6, n_batch=10, chunk_size=10, cut_grid=10)
  c = Controller(s, seed=2, problem_ids=problem_ids(6))
  _make_ready(c)
  plan = c.plan(5)
  replay = [r for r in plan.requests if r.kind != RequestKind.REFILL]
  assert plan.num_ready_slots == 10
  assert plan.count(RequestKind.AUDIT) == 3                  # ceil(0.25 * 10)
  for r in replay:
    if r.kind == RequestKind.READY_CHUNK:
      assert r.critic_may_score and r.max_new_tokens == min(10, 50 - r.cut)
    else:
      assert not r.critic_may_score and r.max_new_tokens == 50 - r.cut
  # Audits are a seeded draw: another step picks other slots, the same step the same ones.
  audit_slots = lambda p: [r.slot for r in p.requests if r.kind == RequestKind.AUDIT]
  assert audit_slots(plan) == audit_slots(c.plan(5))
  c2 = Controller(s.replace(audit_fraction=0.1), seed=2, problem_ids=problem_ids(6))
  _make_ready(c2)
  assert c2.plan(5).count(RequestKind.AUDIT) == 1
  outcome = c.observe(5, make_results(plan, s, value=lambda r, j: 1.0, prefix=lambda r: 0.7))
  assert outcome.stats.critic_error_audited == pytest.approx(0.3)
  assert outcome.stats.ready_fraction == 1.0 and outcome.stats.num_audit == 3


@pytest.mark.parametrize('gate', [False, True])
def test_trained_refills_are_the_ready_problems_while_the_critic_scores_chunks(gate):
  """controller.train_refills: a refill asks for V(s0) and is trained exactly when its problem is
  ready and (under audit_gate) the gate is open; the paper's refills are never trained."""
  s = tiny_settings(n_refill=8, n_batch=4, audit_gate=gate)
  ids = problem_ids(8)  # every problem gets a refill each step

  def trained_refills(train_refills, gate_open=False):
    c = Controller(s.replace(train_refills=train_refills), seed=3, problem_ids=ids)
    run_step(c, 0)
    c.readiness.ready_P[:4] = True
    if gate_open:
      critic_A = np.linspace(-0.2, 0.2, 64)
      c.audit_gate.record_step([AuditAdvantages(0.5, 0.5, critic_A, critic_A)])
    refills = [r for r in c.plan(1).requests if r.kind == RequestKind.REFILL]
    assert len(refills) == 8 and all(r.trained == r.needs_prefix_value for r in refills)
    return {r.problem_id for r in refills if r.trained}

  assert trained_refills(True) == (set() if gate else set(ids[:4]))
  assert trained_refills(True, gate_open=True) == set(ids[:4])
  assert trained_refills(False, gate_open=True) == set()


def test_targets_need_enough_valid_values_and_feed_the_critic_buffer():
  s = tiny_settings(n_refill=3, n_batch=3, min_valid_per_target=3)
  c = Controller(s, seed=0, problem_ids=problem_ids(3))
  # Two of four values invalid for p0 (no target), one for p1 (target = mean of 3), none for p2.
  invalid = {'p0': 2, 'p1': 1, 'p2': 0}
  plan, outcome = run_step(
      c, 0, value=lambda r, j: None if j < invalid[r.problem_id] else 0.4 + 0.1 * j,
      prefix=lambda r: 0.5)
  by_problem = {r.problem_id: i for i, r in enumerate(plan.requests)
                if r.kind == RequestKind.COLD_START}
  assert np.isnan(outcome.targets_R[by_problem['p0']])
  assert np.isnan(outcome.errors_R[by_problem['p0']])
  assert outcome.targets_R[by_problem['p1']] == 0.6          # mean(.5, .6, .7) = .6
  assert outcome.targets_R[by_problem['p2']] == 0.5          # mean(.4, .5, .6, .7) = .55: tie, down
  assert outcome.errors_R[by_problem['p1']] == pytest.approx(0.1)
  assert outcome.stats.num_targets == 2 and outcome.stats.num_pairs_added == 2
  assert len(c.critic_buffer) == 2
  # The pairs keep the unrounded means beside the targets (two-hot critic targets spread them).
  assert sorted((p.target, p.value) for p in c.critic_buffer.pairs) == [
      (0.5, pytest.approx(0.55)), (0.6, pytest.approx(0.6))]
  assert all(np.isnan(outcome.targets_R[i]) for i, r in enumerate(plan.requests)
             if r.kind == RequestKind.REFILL)


def test_bank_takes_replay_rollouts_and_critic_batch_resolves_references():
  s = tiny_settings(n_refill=2, n_batch=2, critic_pairs_per_update=40)
  c = Controller(s, seed=4, problem_ids=problem_ids(2))
  # Step 0: refills fail (p0 scores 0.5, p1 passes); cold-start pairs on both problems.
  run_step(c, 0, value=lambda r, j: 1.0 if (r.problem_id == 'p1' and r.kind == RequestKind.REFILL)
           else 0.5)
  assert c.reference('p0') is None and c.reference('p1') == 'p1@0.0'
  batch = c.critic_batch(0)
  records = {(r.problem_id, r.reference): r.weight for r in batch.records}
  assert records == {('p0', None): 1.0, ('p1', 'p1@0.0'): 0.5, ('p1', None): 0.5}
  assert all(r.prefix_tokens_P.size == 0 for r in batch.records)
  # Without the plain twin (controller.critic_plain_twin off), a pair with a reference is that
  # record alone, at weight 1; the same pairs are drawn.
  lone = Controller(s.replace(critic_plain_twin=False), seed=4, problem_ids=problem_ids(2))
  run_step(lone, 0, value=lambda r, j: 1.0 if (r.problem_id == 'p1' and r.kind == RequestKind.REFILL)
           else 0.5)
  lone_batch = lone.critic_batch(0)
  assert {(r.problem_id, r.reference): r.weight for r in lone_batch.records} == {
      ('p0', None): 1.0, ('p1', 'p1@0.0'): 1.0}
  assert lone_batch.num_pairs == batch.num_pairs
  # Step 1: a replay continuation of p0 passes: the bank gains it, and the old p0 pair gains it too.
  run_step(c, 1, value=lambda r, j: 1.0 if (r.problem_id == 'p0' and r.kind != RequestKind.REFILL
                                            and j == 2) else 0.5)
  assert c.reference('p0') == 'p0@1.2'
  assert c.critic_batch(1).num_pairs == 4
  assert all(r.reference in (None, 'p0@1.2')
             for r in c.critic_batch(1).records if r.problem_id == 'p0')
  assert sum(r.weight for r in c.critic_batch(1).records) == 4.0


def test_a_pair_uses_its_source_trajectorys_solution_if_it_passed_else_the_banks():
  s = tiny_settings(n_refill=1, n_batch=4, critic_pairs_per_update=40)
  c = Controller(s, seed=4, problem_ids=problem_ids(1))
  # Step 0: the refill fails, a cold-start continuation passes (bank = 'cold'); step 1: the refill
  # passes with its own solution 'traj'; step 2 replays both trajectories.
  run_step(c, 0, value=lambda r, j: 1.0 if (r.kind == RequestKind.COLD_START and j == 0) else 0.5,
           reference=lambda r, j: 'cold')
  run_step(c, 1, value=lambda r, j: 1.0 if r.kind == RequestKind.REFILL else 0.5,
           reference=lambda r, j: 'traj')
  assert c.reference('p0') == 'cold'
  plan, _ = run_step(c, 2, value=lambda r, j: 0.5)
  passed = {t.trajectory_id: t.passed for t in c.replay.trajectories}
  assert sorted(passed.values()) == [False, False, True]
  sources = {r.source_trajectory_id for r in plan.requests if r.kind == RequestKind.UNREADY}
  assert len(sources) >= 2                                     # both kinds of source got replayed
  seen = set()
  for record in c.critic_batch(2).records:
    if record.reference is not None and record.source_trajectory_id >= 0:
      expected = 'traj' if passed[record.source_trajectory_id] else 'cold'
      assert record.reference == expected
      seen.add(expected)
  assert seen == {'traj', 'cold'}


def test_plans_are_deterministic_and_idempotent():
  s = tiny_settings()
  a, b, other = (Controller(s, seed=seed, problem_ids=problem_ids(9)) for seed in (1, 1, 2))
  signature = lambda p: [(r.kind, r.problem_id, r.source_trajectory_id, r.cut) for r in p.requests]
  for step in range(4):
    pa, pb, po = a.plan(step), b.plan(step), other.plan(step)
    assert a.plan(step) is pa and signature(pa) == signature(pb)
    for controller, plan in ((a, pa), (b, pb), (other, po)):
      controller.observe(step, make_results(plan, s))
  assert signature(a.plan(4)) != signature(other.plan(4))


def test_bad_results_are_rejected_with_clear_errors():
  s = tiny_settings(n_refill=2, n_batch=2)
  c = Controller(s, seed=0, problem_ids=problem_ids(4))
  with pytest.raises(ValueError, match='call plan'):
    c.observe(0, [])
  plan = c.plan(0)
  good = make_results(plan, s)
  with pytest.raises(ValueError, match='4 requests'):
    c.observe(0, good[:3])
  def swap(index, **changes):
    bad = list(good)
    if 'continuations' in changes:
      bad[index] = RequestResult(changes['continuations'], bad[index].prefix_value)
    else:
      bad[index] = dataclasses.replace(bad[index], **changes)
    return bad
  cold = good[2]
  cases = [
      (swap(2, continuations=cold.continuations[:2]), 'asked for 4'),
      (swap(2, prefix_value=1.5), 'prefix_value'),
      (swap(2, continuations=(Continuation(0.5, ValueSource.CRITIC),) * 4), 'judged'),
      (swap(2, continuations=(Continuation(1.0, ValueSource.JUDGE, 7, True),) * 4), 'no reference'),
      (swap(2, continuations=(Continuation(float('nan'), ValueSource.JUDGE),) * 4), 'value'),
      (swap(2, continuations=(Continuation(0.5, ValueSource.JUDGE, 9),) * 4), 'points'),
      (swap(2, continuations=(Continuation(0.5, ValueSource.JUDGE, -0.5),) * 4), 'points'),
      (swap(0, continuations=(Continuation(0.5, ValueSource.JUDGE, 3),)), 'tokens_N'),
  ]
  for bad, message in cases:
    with pytest.raises(ValueError, match=message):
      c.observe(0, bad)
  with pytest.raises(ValueError, match='not observed'):
    c.state_dict()
  # Fractional points (the built-in task's local scoring) are judge points too.
  fractional = swap(2, continuations=(Continuation(0.75, ValueSource.JUDGE, 5.25),) * 4)
  c.observe(0, fractional)
  with pytest.raises(ValueError, match='already observed'):
    c.plan(0)
  with pytest.raises(KeyError, match='unknown problem'):
    c.is_ready('nope')
  with pytest.raises(ValueError, match='duplicates'):
    Controller(s, seed=0, problem_ids=['a', 'a'])


def test_further_critic_updates_draw_their_own_pairs():
  """`critic_updates`: draw k > 0 of a step is its own seeded draw from the buffer; draw 0 is the
  step's one draw of the paper, unchanged."""
  s = tiny_settings(n_refill=6, n_batch=6, critic_pairs_per_update=3, critic_updates=2)
  c = Controller(s, seed=4, problem_ids=problem_ids(6))
  for step in range(3):
    run_step(c, step)
  keys = lambda batch: [(r.problem_id, tuple(r.prefix_tokens_P), r.reference)
                        for r in batch.records]
  first, second = c.critic_batch(3), c.critic_batch(3, draw=1)
  assert first.num_pairs == second.num_pairs == 3
  assert keys(first) == keys(c.critic_batch(3, draw=0)) and keys(second) == keys(
      c.critic_batch(3, draw=1))
  assert keys(first) != keys(second)
  with pytest.raises(ValueError, match='critic_updates must be an integer >= 1'):
    tiny_settings(critic_updates=0)


def test_chunk_end_pairs_train_on_judged_chunk_ends_with_their_own_rewards():
  """`chunk_end_pairs`: this step's judged chunk ends become critic records (grid-rounded reward,
  the bank's reference: with and without it at 1/2), at most that many, without replacement."""
  s = tiny_settings(n_refill=2, n_batch=2, chunk_end_pairs=2)
  c = Controller(s, seed=4, problem_ids=problem_ids(2))
  run_step(c, 0, value=lambda r, j: 1.0 if (r.problem_id == 'p1' and r.kind == RequestKind.REFILL)
           else 0.5)
  assert c.reference('p0') is None and c.reference('p1') == 'p1@0.0'
  ends = [ChunkEnd(0, np.array([5, 6], np.int32), 0.26), ChunkEnd(1, np.array([7], np.int32), 1.0),
          ChunkEnd(1, np.array([8, 9, 10], np.int32), 0.04)]
  batch = c.chunk_end_batch(1, ends)
  assert batch.num_pairs == 2 and batch.num_skipped == 0
  by_prefix = {tuple(r.prefix_tokens_P): [] for r in batch.records}
  for r in batch.records:
    by_prefix[tuple(r.prefix_tokens_P)].append((r.problem_id, r.target, r.reference, r.weight))
  expected = {(5, 6): [('p0', 0.3, None, 1.0)],
              (7,): [('p1', 1.0, 'p1@0.0', 0.5), ('p1', 1.0, None, 0.5)],
              (8, 9, 10): [('p1', 0.0, 'p1@0.0', 0.5), ('p1', 0.0, None, 0.5)]}
  assert len(by_prefix) == 2 and all(by_prefix[k] == expected[k] for k in by_prefix)
  same = c.chunk_end_batch(1, ends)  # seeded by the step
  assert [tuple(r.prefix_tokens_P) for r in same.records] == [
      tuple(r.prefix_tokens_P) for r in batch.records]
  # A context limit skips what does not fit; 0 (the default) adds nothing.
  assert c.chunk_end_batch(1, ends, context_limit=1).num_pairs == 0
  off = Controller(tiny_settings(n_refill=2, n_batch=2), seed=4, problem_ids=problem_ids(2))
  assert off.chunk_end_batch(1, ends).records == ()
  plain = Controller(tiny_settings(n_refill=2, n_batch=2, chunk_end_pairs=5, no_reference=True),
                     seed=4, problem_ids=problem_ids(2))
  assert all(r.reference is None and r.weight == 1.0
             for r in plain.chunk_end_batch(1, ends).records)
  assert plain.chunk_end_batch(1, ends).num_pairs == 3
  lone = Controller(tiny_settings(n_refill=2, n_batch=2, chunk_end_pairs=5,
                                  critic_plain_twin=False), seed=4, problem_ids=problem_ids(2))
  lone.bank.load_items([(0, 'p0@ref'), (1, 'p1@ref')])
  assert all(r.reference is not None and r.weight == 1.0
             for r in lone.chunk_end_batch(1, ends).records)
  assert len(lone.chunk_end_batch(1, ends).records) == 3
