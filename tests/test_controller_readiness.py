"""Readiness scenarios: every condition must hold, the pooled window, flips, and the bank timing.

Each run has 6 problems, 6 refills and 6 replay slots per step, so every problem is refilled and
replayed every step; the scripted critic's prediction at a prefix sets that prefix's error exactly.
"""

import numpy as np

from ac2_jax.controller import Controller, RequestKind
from controller_harness import make_results, problem_ids, run_step, tiny_settings

P = 6


def _controller(**changes):
  return Controller(tiny_settings(n_batch=P, n_refill=P, **changes), seed=3,
                    problem_ids=problem_ids(P))


def _ready(controller):
  return {pid for pid in controller.problem_ids if controller.is_ready(pid)}


def _drive(controller, steps, value=lambda r, j: 1.0, prefix=lambda r: 1.0):
  outcomes = [run_step(controller, step, value=value, prefix=prefix)[1] for step in steps]
  return outcomes


def test_all_conditions_hold_after_five_complete_steps_and_flip_next_step():
  c = _controller()
  outcomes = _drive(c, range(4))
  assert _ready(c) == set() and not outcomes[-1].stats.global_ready   # only 4 steps in the window
  plan = c.plan(4)
  assert plan.num_ready_slots == 0
  outcome = c.observe(4, make_results(
      plan, c.settings, value=lambda r, j: 1.0, prefix=lambda r: 1.0))
  assert set(outcome.newly_ready) == set(problem_ids(P)) and outcome.stats.global_ready
  # Step 4's own routing was decided before the flip; step 5 routes the ready problems.
  assert all(r.kind in (RequestKind.REFILL, RequestKind.UNREADY) for r in plan.requests)
  plan = c.plan(5)
  assert plan.num_ready_slots == P
  assert {r.kind for r in plan.requests} == {
      RequestKind.REFILL, RequestKind.READY_CHUNK, RequestKind.AUDIT}


def test_refused_while_the_global_test_fails():
  # p0 is perfect; the others err by 0.3, so the pooled error 0.25 blocks everyone.
  c = _controller()
  _drive(c, range(8), prefix=lambda r: 1.0 if r.problem_id == 'p0' else 0.7)
  assert _ready(c) == set()
  assert abs(c.readiness.window_error() - 0.25) < 1e-9


def test_refused_while_the_local_test_fails():
  # The others err by 0.2 (>= tau_local 0.18) but the pooled error 1/6 passes: only p0 is ready.
  c = _controller()
  _drive(c, range(6), prefix=lambda r: 1.0 if r.problem_id == 'p0' else 0.8)
  assert _ready(c) == {'p0'}


def test_refused_without_a_reference_and_the_bank_counts_as_before_the_step():
  # p0 never passes (0.5 = 4 points) until its refill passes at step 6.
  c = _controller()
  passes_from = {'step': 99}
  current = {'step': 0}

  def value(r, j):
    if r.problem_id != 'p0':
      return 1.0
    return 1.0 if (r.kind == RequestKind.REFILL and current['step'] >= passes_from['step']) else 0.5

  def prefix(r):
    return 0.5 if r.problem_id == 'p0' else 1.0

  for step in range(6):
    current['step'] = step
    run_step(c, step, value=value, prefix=prefix)
  assert _ready(c) == set(problem_ids(P)) - {'p0'}
  assert c.reference('p0') is None
  passes_from['step'] = 6
  current['step'] = 6
  outcome = run_step(c, 6, value=value, prefix=prefix)[1]
  assert c.reference('p0') is not None and outcome.stats.num_bank_added == 1
  assert 'p0' not in outcome.newly_ready                      # the bank before step 6's additions
  current['step'] = 7
  outcome = run_step(c, 7, value=value, prefix=prefix)[1]
  assert outcome.newly_ready == ('p0',)


def test_refused_until_the_critic_predicts_a_nonzero_value():
  # p0's replays score 0 and the critic predicts 0 (error 0); its refills pass (a reference).
  c = _controller()
  current = {'step': 0}

  def value(r, j):
    return 1.0 if (r.problem_id != 'p0' or r.kind == RequestKind.REFILL) else 0.0

  def prefix(r):
    if r.problem_id != 'p0':
      return 1.0
    return 0.1 if current['step'] >= 7 else 0.0

  for step in range(7):
    current['step'] = step
    run_step(c, step, value=value, prefix=prefix)
  assert _ready(c) == set(problem_ids(P)) - {'p0'} and c.reference('p0') is not None
  current['step'] = 7
  outcome = run_step(c, 7, value=value, prefix=prefix)[1]  # 0.1 vs target 0: error 0.1, nonzero
  assert outcome.newly_ready == ('p0',)


def test_an_invalid_prediction_counts_as_error_one_in_the_global_window():
  # 3 problems, errors 0.17 everywhere: pooled 0.17 passes. One unparseable prediction at step 2
  # makes it (14 * 0.17 + 1) / 15 = 0.225 until step 2 leaves the window after step 7.
  def run(invalid):
    c = Controller(tiny_settings(n_batch=3, n_refill=3), seed=1, problem_ids=problem_ids(3))
    flips = {}
    for step in range(9):
      def prefix(r, step=step):
        if invalid and step == 2 and r.problem_id == 'p1':
          return None
        return 0.83
      outcome = run_step(c, step, value=lambda r, j: 1.0, prefix=prefix)[1]
      if step == 2:
        assert outcome.stats.num_invalid_predictions == int(invalid)
        assert np.nanmax(outcome.errors_R) == (1.0 if invalid else np.float64(abs(0.83 - 1.0)))
      for pid in outcome.newly_ready:
        flips[pid] = step
    return flips

  assert run(invalid=False) == {'p0': 4, 'p1': 4, 'p2': 4}
  assert run(invalid=True) == {'p0': 7, 'p1': 7, 'p2': 7}


def test_ready_is_forever_and_the_no_local_variant_readies_everything():
  c = _controller()
  _drive(c, range(5))
  assert _ready(c) == set(problem_ids(P))
  _drive(c, range(5, 12), prefix=lambda r: 0.0)              # error 1 everywhere from now on
  assert _ready(c) == set(problem_ids(P)) and not c.readiness.global_ok()
  # Without local readiness the global test alone readies every problem, even unseen ones and ones
  # with no reference or a large local error.
  c = Controller(tiny_settings(n_batch=P, n_refill=P, no_local_readiness=True), seed=3,
                 problem_ids=problem_ids(P + 4))
  outcomes = _drive(c, range(5), value=lambda r, j: 0.5,
                    prefix=lambda r: 0.8 if r.problem_id == 'p0' else 0.5)
  assert len(c.bank) == 0
  assert _ready(c) == set(problem_ids(P + 4)) and outcomes[-1].stats.num_newly_ready == P + 4


def test_judged_only_readiness_ignores_the_critics_own_targets():
  """Every problem ready after steps 0-4; then the judge values every continuation 0.5 while the
  critic reads 1.0 at prefixes and chunk ends. A ready group's target is the mean of its critic
  values (1.0: error 0), so the pooled window hides the critic's error; judged-only readiness sees
  only the audits' (0.5)."""
  windows = {}
  for judged_only in (False, True):
    c = _controller(readiness_judged_only=judged_only)
    _drive(c, range(5))
    assert _ready(c) == set(problem_ids(P))
    late = lambda r, j: 1.0 if r.kind == RequestKind.READY_CHUNK and r.critic_may_score else 0.5
    _drive(c, range(5, 10), value=late)
    windows[judged_only] = c.readiness.window_error()
  assert abs(windows[True] - 0.5) < 1e-9
  assert windows[False] < 0.3


def test_revocable_readiness_takes_back_the_problems_whose_audit_fails():
  """Every problem ready after steps 0-4; at step 5 the judge values every full continuation 0.5
  while the critic reads 1.0 everywhere, so each audit misses its judged target by 0.5. Under the
  spec the audited problems stay ready; revocable, exactly the audited ones become unready, are
  routed as unready groups next step, and can become ready again once the critic matches."""
  late = lambda r, j: 1.0 if r.kind == RequestKind.READY_CHUNK and r.critic_may_score else 0.5
  for revocable in (False, True):
    c = _controller(readiness_revocable=revocable)
    _drive(c, range(5))
    assert _ready(c) == set(problem_ids(P))
    plan = c.plan(5)
    audited = {r.problem_id for r in plan.requests if r.kind == RequestKind.AUDIT}
    assert audited and audited != set(problem_ids(P))
    outcome = c.observe(5, make_results(plan, c.settings, value=late, prefix=lambda r: 1.0))
    if not revocable:
      assert _ready(c) == set(problem_ids(P)) and outcome.stats.num_revoked == 0
      continue
    assert _ready(c) == set(problem_ids(P)) - audited
    assert outcome.stats.num_revoked == len(audited)
    plan = c.plan(6)
    assert audited <= {r.problem_id for r in plan.requests if r.kind == RequestKind.UNREADY}
  # Once the critic reads the judge's values again, the revoked problems are ready again.
  c.observe(6, make_results(plan, c.settings, value=lambda r, j: 0.5, prefix=lambda r: 0.5))
  _drive(c, range(7, 12), value=lambda r, j: 0.5, prefix=lambda r: 0.5)
  assert _ready(c) == set(problem_ids(P))


def test_judged_only_critic_pairs_leave_out_the_critics_own_targets():
  """Every problem ready after steps 0-4; at step 5 the judge values every continuation 0.5 while
  the critic reads 1.0 at chunk ends. A ready group's target is then 1.0, the mean of its critic
  values; with critic_judged_only none of those enters the critic buffer, every judged one does."""
  late = lambda r, j: 1.0 if r.kind == RequestKind.READY_CHUNK and r.critic_may_score else 0.5
  for judged_only in (False, True):
    c = _controller(critic_judged_only=judged_only, critic_buffer_capacity=1000)
    _drive(c, range(5))
    before = len(c.critic_buffer)
    plan = c.plan(5)
    scored = sum(r.kind == RequestKind.READY_CHUNK and r.critic_may_score for r in plan.requests)
    judged = sum(r.kind in (RequestKind.AUDIT, RequestKind.UNREADY) for r in plan.requests)
    assert scored and judged
    c.observe(5, make_results(plan, c.settings, value=late, prefix=lambda r: 1.0))
    targets = sorted(p.target for p in c.critic_buffer.pairs[before:])
    if judged_only:
      assert targets == [0.5] * judged
    else:
      assert targets == [0.5] * judged + [1.0] * scored
