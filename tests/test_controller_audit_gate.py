"""The audit gate (controller.audit_gate): ready chunks are critic-scored only while the audits'
chunk advantages correlate with their Monte Carlo ones; until then every ready slot is audited."""

import numpy as np
import pytest

from ac2_jax.controller import Continuation, Controller, RequestKind, RequestResult, ValueSource
from ac2_jax.controller.audit_gate import AuditGate, advantage_slope, audit_advantages
from ac2_jax.controller.steps import check_result
from controller_harness import make_results, problem_ids, run_step, tiny_settings

P = 6
# Judged values 0, 1/3, 2/3, 1 within every group of 4: the rewards always differ.
SPREAD = lambda r, j: j / 3


def test_advantages_of_a_hand_checked_group():
  # Row 2 ended inside its chunk (v = r = 0.5); row 3's read is invalid: left out, filled with the
  # valid mean (0.8 + 0.2 + 0.5) / 3 = 0.5, so mean v = 0.5.
  a = audit_advantages([1.0, 0.0, 0.5, 0.5], [True, True, False, True], [0.8, 0.2, None, None])
  np.testing.assert_allclose(a.critic_A, [0.3, -0.3, 0.0])
  np.testing.assert_allclose(a.reward_A, [0.5, -0.5, 0.0])
  assert a.mean_value == pytest.approx(0.5) and a.mean_reward == pytest.approx(0.5)
  assert audit_advantages([1.0, None], [True, True], [0.5, 0.5]) is None  # a failed judge call


def _group(critic, reward):
  return audit_advantages(reward, [True] * len(reward), critic)


def test_gate_needs_rows_and_a_correlation_and_forgets_old_steps():
  gate = AuditGate(window=2, min_corr=0.5, min_rows=6)
  assert not gate.trusted() and gate.correlation() != gate.correlation()  # no rows: NaN
  gate.record_step([_group([0.9, 0.1, 0.5], [1.0, 0.0, 0.5])])
  assert gate.num_rows == 3 and gate.correlation() == pytest.approx(1.0) and not gate.trusted()
  gate.record_step([_group([0.6, 0.4, 0.5], [1.0, 0.0, 0.5])])
  assert gate.num_rows == 6 and gate.trusted()
  gate.record_step([])  # a step without audits keeps the window
  assert gate.trusted()
  # A critic that answers one value: its advantages are all 0, it does not rank (NaN).
  gate.record_step([_group([0.5, 0.5, 0.5], [1.0, 0.0, 0.5])])
  gate.record_step([_group([0.5, 0.5, 0.5], [0.0, 1.0, 0.5])])
  assert gate.num_rows == 6 and not gate.trusted()
  gate.record_step([_group([0.9, 0.1, 0.5], [0.0, 1.0, 0.5])])  # ranks them backwards
  assert gate.correlation() < 0 and not gate.trusted()
  restored = AuditGate(window=2, min_corr=0.5, min_rows=6)
  restored.load_state_dict(gate.state_dict())
  assert restored.correlation() == gate.correlation()
  with pytest.raises(ValueError, match='audit gate state'):
    restored.load_state_dict([np.zeros((3, 2))])


def test_slope_of_monte_carlo_on_critic_advantages():
  # Critic advantages (0.1, -0.1, 0.2, -0.2), Monte Carlo (0.3, -0.1, 0.4, -0.6):
  # sum a r = 0.03 + 0.01 + 0.08 + 0.12 = 0.24 over sum a^2 = 0.10.
  a, r = np.array([0.1, -0.1, 0.2, -0.2]), np.array([0.3, -0.1, 0.4, -0.6])
  assert advantage_slope(a, r) == pytest.approx(2.4)
  assert advantage_slope(np.zeros(4), r) != advantage_slope(np.zeros(4), r)  # flat critic: NaN
  gate = AuditGate(window=2, min_corr=0.3, min_rows=4)
  gate.record_step([_group([0.6, 0.4], [0.8, 0.4])])
  assert gate.slope() != gate.slope()  # 2 rows: too few to calibrate on
  gate.record_step([_group([0.7, 0.3], [0.9, 0.1])])
  # Critic (0.1, -0.1, 0.2, -0.2), rewards (0.2, -0.2, 0.4, -0.4): twice the critic's.
  assert gate.slope() == pytest.approx(2.0)


def _ready_controller(**changes):
  c = Controller(tiny_settings(n_batch=P, n_refill=P, **changes), seed=3,
                 problem_ids=problem_ids(P))
  for step in range(5):  # the readiness harness: every problem ready after steps 0-4
    run_step(c, step, value=lambda r, j: 1.0, prefix=lambda r: 1.0)
  assert c.readiness.num_ready == P
  return c


def _kinds(plan):
  return [r.kind for r in plan.requests if r.kind != RequestKind.REFILL]


def test_closed_gate_audits_every_ready_slot_until_the_audits_show_a_ranking_critic():
  c = _ready_controller(audit_gate=True, audit_gate_rows=8, audit_gate_corr=0.5)
  plan = c.plan(5)
  assert _kinds(plan) == [RequestKind.AUDIT] * P  # no audit rows yet: nothing is trusted
  # A critic that answers one value at every chunk end: accurate enough for readiness, no ranking.
  outcome = c.observe(5, make_results(plan, c.settings, value=SPREAD, prefix=lambda r: 0.5,
                                      audit_read=lambda r, j: 0.5))
  assert not outcome.stats.critic_trusted and c.readiness.num_ready == P
  plan = c.plan(6)
  assert _kinds(plan) == [RequestKind.AUDIT] * P
  # Chunk-end reads that follow the rewards (noisily) for the next window of steps open it.
  for step in range(6, 11):
    outcome = c.observe(step, make_results(plan, c.settings, value=SPREAD, prefix=lambda r: 0.5,
                                           audit_read=lambda r, j: 0.2 + j / 5))
    plan = c.plan(step + 1)
  assert outcome.stats.critic_trusted and outcome.stats.critic_audit_corr == pytest.approx(1.0)
  kinds = _kinds(plan)
  assert kinds.count(RequestKind.AUDIT) == int(np.ceil(0.25 * P))  # alpha again
  assert kinds.count(RequestKind.READY_CHUNK) == P - int(np.ceil(0.25 * P))


def test_without_the_gate_the_audits_are_measured_but_alpha_stays():
  c = _ready_controller()
  for step in range(5, 8):
    plan, outcome = run_step(c, step, value=SPREAD, prefix=lambda r: 0.5,
                             audit_read=lambda r, j: 0.5)
    assert _kinds(plan).count(RequestKind.AUDIT) == int(np.ceil(0.25 * P))
    assert outcome.stats.critic_trusted
  assert c.audit_gate.num_rows == 3 * 2 * 4  # 2 audited groups of 4 a step
  assert c.audit_gate.correlation() != c.audit_gate.correlation()  # flat reads: NaN


def test_gate_window_survives_a_checkpoint_and_old_states_restore_it_empty():
  c = _ready_controller(audit_gate=True, audit_gate_rows=8)
  for step in range(5, 7):
    run_step(c, step, value=SPREAD, prefix=lambda r: 0.5, audit_read=lambda r, j: 0.2 + j / 5)
  assert c.audit_gate_open
  state = c.state_dict()
  restored = Controller(c.settings, seed=3, problem_ids=problem_ids(P))
  restored.load_state_dict(state)
  assert restored.audit_gate_open and restored.audit_gate.num_rows == c.audit_gate.num_rows
  same = lambda plan: [(r.kind, r.problem_id, r.slot, r.cut) for r in plan.requests]
  assert same(restored.plan(7)) == same(c.plan(7))
  del state['audit_gate']
  restored.load_state_dict(state)
  assert restored.audit_gate.num_rows == 0 and not restored.audit_gate_open


def test_audit_scale_is_the_windows_slope_clipped_to_one_and_the_cap():
  """Chunk-end reads a fifth apart against rewards a third apart: Monte Carlo advantages are
  5/3 of the critic's. audit_scale makes that the chunk advantages' factor; the cap and the floor
  clip it (a backwards critic's slope -1 to 1); without the setting, or before the window holds audit_gate_rows rows, it is 1."""
  for changes, read, expected in (({}, lambda r, j: 0.2 + j / 5, 1.0),
                                  ({'audit_scale': True}, lambda r, j: 0.2 + j / 5, 5 / 3),
                                  ({'audit_scale': True, 'audit_scale_max': 1.5},
                                   lambda r, j: 0.2 + j / 5, 1.5),
                                  ({'audit_scale': True}, lambda r, j: 1 - j / 3, 1.0)):  # -1
    c = _ready_controller(audit_gate_rows=8, **changes)
    assert c.chunk_advantage_scale == 1.0  # no audit rows yet
    _, outcome = run_step(c, 5, value=SPREAD, prefix=lambda r: 0.5, audit_read=read)
    assert c.audit_gate.num_rows >= 8
    assert outcome.stats.chunk_advantage_scale == pytest.approx(expected)
    assert c.chunk_advantage_scale == pytest.approx(expected)


def test_refused_settings_and_results():
  with pytest.raises(ValueError, match='audit_gate needs audits'):
    tiny_settings(audit_gate=True, no_audit=True)
  with pytest.raises(ValueError, match='audit_scale needs audits'):
    tiny_settings(audit_scale=True, audit_fraction=0.0)
  with pytest.raises(ValueError, match='audit_scale_max'):
    tiny_settings(audit_scale=True, audit_scale_max=0.5)
  with pytest.raises(ValueError, match='audit_gate_corr'):
    tiny_settings(audit_gate_corr=1.5)
  c = _ready_controller()
  plan = c.plan(5)
  chunk = next(i for i, r in enumerate(plan.requests) if r.kind == RequestKind.READY_CHUNK)
  audit = next(i for i, r in enumerate(plan.requests) if r.kind == RequestKind.AUDIT)
  judged = Continuation(0.5, ValueSource.JUDGE, points=3, chunk_end_read=True,
                        chunk_end_value=0.4)
  n = plan.requests[chunk].num_continuations
  with pytest.raises(ValueError, match='only audits carry chunk-end reads'):
    check_result(chunk, plan.requests[chunk], RequestResult((judged,) * n, 0.5), c.settings)
  bad = Continuation(0.5, ValueSource.JUDGE, points=3, chunk_end_read=True, chunk_end_value=1.5)
  with pytest.raises(ValueError, match='chunk_end_value must be None'):
    check_result(audit, plan.requests[audit], RequestResult((bad,) * n, 0.5), c.settings)
