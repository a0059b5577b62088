"""AC2 variants: no audit, group size 1, stale buffer, correct-only, no reference, chunk size."""

import numpy as np

from ac2_jax.controller import Controller, RequestKind
from controller_harness import make_results, problem_ids, run_step, tiny_settings


def _make_ready(controller, steps=5):
  for step in range(steps):
    run_step(controller, step, value=lambda r, j: 1.0, prefix=lambda r: 1.0)


def test_no_audit_routes_every_ready_slot_to_chunks():
  for changes in (dict(no_audit=True), dict(audit_fraction=0.0)):
    c = Controller(tiny_settings(**changes), seed=0, problem_ids=problem_ids(6))
    _make_ready(c)
    plan = c.plan(5)
    assert plan.num_ready_slots == 6 and plan.count(RequestKind.AUDIT) == 0
    assert plan.count(RequestKind.READY_CHUNK) == 6


def test_group_size_one_singles_from_distinct_cuts_targets_and_dropped_rows():
  s = tiny_settings(group_size_one=True, no_audit=True, buffer_capacity=24,
                    critic_buffer_capacity=100)
  c = Controller(s, seed=1, problem_ids=problem_ids(6))
  # Before readiness: full groups of g on unready (and cold-start) slots.
  plan, _ = run_step(c, 0, value=lambda r, j: 1.0, prefix=lambda r: 1.0)
  assert all(r.num_continuations == 4 for r in plan.requests if r.kind != RequestKind.REFILL)
  for step in range(1, 5):
    run_step(c, step, value=lambda r, j: 1.0, prefix=lambda r: 1.0)
  plan = c.plan(5)
  singles = [r for r in plan.requests if r.kind == RequestKind.READY_CHUNK]
  assert len(singles) == 6 * 4
  assert all(r.num_continuations == 1 and r.needs_prefix_value for r in singles)
  stored = {t.trajectory_id: t for t in c.replay.trajectories}
  for slot in range(6):
    group = [r for r in singles if r.slot == slot]
    assert len(group) == 4 and len({r.problem_id for r in group}) == 1
    prefixes = {(r.source_trajectory_id, r.cut) for r in group}
    assert len(prefixes) == 4                                   # distinct cuts
    for r in group:
      assert np.array_equal(r.prefix_tokens_P, stored[r.source_trajectory_id].tokens_L[:r.cut])
      assert r.max_new_tokens == min(10, 50 - r.cut)
  # Single j of each slot: j = 0 invalid value, j = 1 invalid V(s), others valid.
  def position(r):
    if r.kind != RequestKind.READY_CHUNK:
      return -1
    return [x for x in singles if x.slot == r.slot].index(r)

  before = len(c.critic_buffer)
  outcome = c.observe(5, make_results(
      plan, s, value=lambda r, j: None if position(r) == 0 else 0.34,
      prefix=lambda r: None if position(r) == 1 else 0.5))
  targets = {position(r): outcome.targets_R[i] for i, r in enumerate(plan.requests)
             if r.kind == RequestKind.READY_CHUNK}
  assert np.isnan(targets[0]) and targets[2] == targets[3] == 0.3   # grid(v): one valid suffices
  assert outcome.stats.num_dropped_rows == 6                    # invalid V(s): dropped, no pair
  assert outcome.stats.num_pairs_added == 6 * 2                 # positions 2 and 3 of each slot
  assert len(c.critic_buffer) == before + 12
  assert outcome.stats.num_invalid_predictions == 6             # but error 1 for readiness
  errors = [outcome.errors_R[i] for i, r in enumerate(plan.requests) if position(r) == 1]
  assert errors == [1.0] * 6


def test_group_size_one_keeps_full_groups_on_audits():
  c = Controller(tiny_settings(group_size_one=True), seed=1, problem_ids=problem_ids(6))
  _make_ready(c)
  plan = c.plan(5)
  audits = [r for r in plan.requests if r.kind == RequestKind.AUDIT]
  assert len(audits) == 2 and all(r.num_continuations == 4 for r in audits)
  assert plan.count(RequestKind.READY_CHUNK) == 4 * 4


def test_stale_buffer_collects_every_period_and_replaces_the_buffer():
  s = tiny_settings(stale_buffer=True, stale_period=3, stale_factor=2, n_refill=2, n_batch=4)
  c = Controller(s, seed=0, problem_ids=problem_ids(8))
  collections = {}
  for step in range(8):
    plan, outcome = run_step(c, step)
    refills = plan.count(RequestKind.REFILL)
    assert refills == (4 if step in (0, 3, 6) else 0)
    ids = {t.trajectory_id for t in c.replay.trajectories}
    if refills:
      collections[step] = ids
      assert len(ids) == 4 and {t.step for t in c.replay.trajectories} == {step}
    sources = {r.source_trajectory_id for r in plan.requests
               if r.kind not in (RequestKind.REFILL, RequestKind.COLD_START)}
    if step == 0:
      assert plan.count(RequestKind.COLD_START) == 4
    else:
      owner = max(k for k in collections if k < step)
      assert sources <= collections[owner] and sources
    assert outcome.stats.buffer_size == 4


def test_correct_only_admits_passing_rollouts_and_cold_starts_until_then():
  s = tiny_settings(correct_only=True, n_refill=3, n_batch=3)
  c = Controller(s, seed=0, problem_ids=problem_ids(3))
  for step in range(3):
    plan, outcome = run_step(c, step, value=lambda r, j: 0.5)   # 4 points: nothing passes
    assert plan.count(RequestKind.COLD_START) == 3 and outcome.stats.buffer_size == 0
  plan, outcome = run_step(c, 3, value=lambda r, j: 1.0 if r.problem_id == 'p1' else 0.5)
  assert outcome.stats.buffer_size == 1 and c.replay.trajectories[0].passed
  plan = c.plan(4)
  assert plan.count(RequestKind.COLD_START) == 0
  assert {r.problem_id for r in plan.requests if r.kind == RequestKind.UNREADY} == {'p1'}


def test_no_reference_hides_references_from_the_critic_but_keeps_the_bank_condition():
  s = tiny_settings(no_reference=True)
  c = Controller(s, seed=0, problem_ids=problem_ids(6))
  # p0 never passes; everyone else does. The critic is perfect for all.
  for step in range(6):
    run_step(c, step, value=lambda r, j: 0.5 if r.problem_id == 'p0' else 1.0,
             prefix=lambda r: 0.5 if r.problem_id == 'p0' else 1.0)
  assert len(c.bank) == 5 and c.reference('p0') is None
  assert not c.is_ready('p0') and all(c.is_ready(f'p{i}') for i in range(1, 6))
  batch = c.critic_batch(5)
  assert batch.num_pairs == 16 and len(batch.records) == 16
  assert all(r.reference is None and r.weight == 1.0 for r in batch.records)
  # The same run with references trains pairs of solved problems under both prompts.
  c = Controller(tiny_settings(), seed=0, problem_ids=problem_ids(6))
  for step in range(6):
    run_step(c, step, value=lambda r, j: 0.5 if r.problem_id == 'p0' else 1.0,
             prefix=lambda r: 0.5 if r.problem_id == 'p0' else 1.0)
  batch = c.critic_batch(5)
  with_reference = [r for r in batch.records if r.reference is not None]
  assert with_reference and all(r.weight == 0.5 for r in with_reference)
  assert sum(r.weight for r in batch.records) == batch.num_pairs


def test_chunk_size_variant_moves_chunk_and_cut_grid_together():
  s = tiny_settings().with_chunk_size(5)
  c = Controller(s, seed=0, problem_ids=problem_ids(6))
  _make_ready(c)
  plan = c.plan(5)
  replay = [r for r in plan.requests if r.kind != RequestKind.REFILL]
  assert all(r.cut % 5 == 0 for r in replay)
  assert any(r.cut % 10 == 5 for r in replay)
  assert all(r.max_new_tokens == 5 for r in replay if r.kind == RequestKind.READY_CHUNK)
