"""The critic panels' numbers (train/critic_panels.py) on a hand-written workdir, worked by hand,
and notebooks/critic_diagnostics.ipynb drawing them (tests/test_compare.py runs it on a real AC2
run, whose tiny critic reads nothing valid)."""

import json

import numpy as np
import pytest

from ac2_jax.train import critic_panels
from test_notebooks import execute_notebook

METRICS = [
    {'step': 0, 'val/mean_score': 0.5},
    {'step': 1, 'ready_fraction': 0.0, 'global_window_error': None, 'critic_error': 0.6,
     'critic_error_audited': None},
    {'step': 2, 'ready_fraction': 0.5, 'global_window_error': 0.3, 'critic_error': 0.2,
     'critic_error_audited': 0.1},
]


def _group(reference, ref, noref, rewards, read, values, problem='p'):
  return {'problem': problem, 'slot': 0, 'cut': 16, 'reference': reference, 'v_prefix_ref': ref,
          'v_prefix_noref': noref, 'rewards': rewards, 'new_tokens': [20] * len(rewards),
          'chunk_end_read': read, 'chunk_end_value': values}


# G1: v = [0.9, 0.3, 1, 0] (two chunk-end reads, two rewards), mean 0.55; r mean 0.5.
G1 = _group(True, 0.5, 0.8, [1.0, 0.0, 1.0, 0.0], [True, True, False, False],
            [0.9, 0.3, None, None], 'a')
# G2: the first read is invalid: filled with mean(0.4, 0, 1) = 7/15 and left out of the rows;
# v mean 7/15, r mean 0.25; V(s) without the reference invalid: not paired.
G2 = _group(True, 0.2, None, [0.0, 0.0, 0.0, 1.0], [True, True, False, False],
            [None, 0.4, None, None], 'b')
# G3: a failed judge call: left out.
G3 = _group(False, None, 0.6, [0.5, None, 1.0, 1.0], [False] * 4, [None] * 4, 'c')
# G4 (step 3): no reference, V(s) invalid, no chunk-end read (f = 0).
G4 = _group(False, None, None, [0.5, 0.5], [False, False], [None, None], 'd')
AUDITS = [{'step': 1, 'groups': []}, {'step': 2, 'groups': [G1, G2, G3]},
          {'step': 3, 'groups': [G4]}]

# Critic and Monte Carlo advantages of the valid rows of G1 and G2, by hand.
CRITIC_A = [0.35, -0.25, 0.45, -0.55, 0.4 - 7 / 15, -7 / 15, 1 - 7 / 15]
REWARD_A = [0.5, -0.5, 0.5, -0.5, -0.25, -0.25, 0.75]


@pytest.fixture
def workdir(tmp_path):
  for name, records in (('metrics.jsonl', METRICS), ('audits.jsonl', AUDITS)):
    with open(tmp_path / name, 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in records)
  return str(tmp_path)


def test_step_series_and_trailing_mean(workdir):
  metrics, audits = critic_panels.read_workdir(workdir)
  assert audits == AUDITS
  s = critic_panels.step_series(metrics)
  np.testing.assert_array_equal(s['step'], [1, 2])
  np.testing.assert_array_equal(s['ready_fraction'], [0.0, 0.5])
  np.testing.assert_array_equal(s['global_window_error'], [np.nan, 0.3])
  np.testing.assert_array_equal(s['critic_error_audited'], [np.nan, 0.1])
  np.testing.assert_array_equal(critic_panels.trailing_mean([1, np.nan, 3, 5, 7, 9]),
                                [1, 1, 2, 3, 4, 6])


def test_groups_follow_the_invalid_read_rules():
  gs = critic_panels.groups(AUDITS)
  assert [g.problem for g in gs] == ['a', 'b', 'd']  # c: a failed judge call
  a, b, d = gs
  assert (a.step, a.v_prefix, a.mean_value, a.mean_reward, a.critic_share) == (
      2, 0.5, pytest.approx(0.55), 0.5, 0.5)
  np.testing.assert_allclose(a.critic_advantages, CRITIC_A[:4])
  np.testing.assert_allclose(b.mean_value, 7 / 15)
  np.testing.assert_allclose(b.critic_advantages, CRITIC_A[4:])
  np.testing.assert_allclose(b.reward_advantages, REWARD_A[4:])
  assert d.v_prefix is None and d.critic_share == 0.0 and d.mean_value == 0.5


def test_summaries_per_step_and_pooled():
  gs = critic_panels.groups(AUDITS)
  steps = critic_panels.per_step(gs)
  np.testing.assert_array_equal(steps['step'], [2, 3])
  want_corr = np.corrcoef(CRITIC_A, REWARD_A)[0, 1]
  want = {  # step 2: G1, G2; step 3: G4
      'groups': [2, 1],
      'prefix_mae': [(0.0 + 0.05) / 2, np.nan],
      'prefix_reads_invalid': [0, 1],
      'groups_with_reference': [1, 0],
      'mae_ref': [0.0, np.nan],
      'mae_noref': [0.3, np.nan],
      'group_mean_mae': [(0.05 + (7 / 15 - 0.25)) / 2, 0.0],
      'advantage_rows': [7, 0],
      'advantage_corr': [want_corr, np.nan],
      'advantage_mae': [np.mean(np.abs(np.subtract(CRITIC_A, REWARD_A))), np.nan],
      'advantage_scale': [np.mean(np.abs(CRITIC_A)) / np.mean(np.abs(REWARD_A)), np.nan],
      'advantage_slope': [np.dot(CRITIC_A, REWARD_A) / np.dot(CRITIC_A, CRITIC_A), np.nan],
      'flat_groups': [0.0, np.nan],
  }
  assert set(steps) == {'step', *want}
  for key, values in want.items():
    np.testing.assert_allclose(steps[key], values, err_msg=key)
  pooled = critic_panels.summarize(gs)
  assert pooled['groups'] == 3 and pooled['advantage_rows'] == 7
  assert pooled['group_mean_mae'] == pytest.approx((0.05 + (7 / 15 - 0.25) + 0.0) / 3)
  assert pooled['advantage_corr'] == pytest.approx(want_corr)
  assert 0.8 < want_corr < 0.95  # by hand: the critic ranks the rows as the rewards do, roughly
  assert critic_panels.pearson([1, 2], [3, 3]) != critic_panels.pearson([1, 2], [3, 3])  # NaN
  assert critic_panels.per_step([])['step'].size == 0


def test_flat_groups_are_chunks_that_end_before_the_rewards_differ():
  # Two end states read 1e-4 apart (equal states, different texts) while the rewards differ: flat.
  flat = _group(True, 0.5, 0.5, [1.0, 0.0, 0.0], [True, True, True], [0.3, 0.3001, 0.3])
  tied = _group(True, 0.5, 0.5, [0.0, 0.0, 0.0], [True, True, True], [0.3, 0.3, 0.3])
  wide = _group(True, 0.5, 0.5, [1.0, 0.0, 0.0], [True, True, True], [0.3, 0.32, 0.3])
  gs = critic_panels.groups([{'step': 1, 'groups': [flat, tied, wide]}])
  s = critic_panels.summarize(gs)
  assert s['flat_groups'] == pytest.approx(1 / 3)
  # The slope is driven by `wide` alone: critic A (-1/150, 2/150, -1/150), rewards (2/3, -1/3,
  # -1/3); `flat` adds almost nothing to either sum.
  a = np.concatenate([g.critic_advantages for g in gs])
  r = np.concatenate([g.reward_advantages for g in gs])
  assert s['advantage_slope'] == pytest.approx(a @ r / (a @ a))
  assert s['advantage_slope'] < -10  # `wide` ranks its rows against the rewards


@pytest.mark.slow
def test_notebook_prints_the_hand_worked_numbers(workdir):
  nb = execute_notebook('notebooks/critic_diagnostics.ipynb', {'WORKDIR': workdir})
  text = ''.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code'
                 for o in c.get('outputs', []))
  assert '2 steps; 3 steps with audit records, 3 audited groups' in text
  for line in ('mae_noref                0.3', 'advantage_rows           7',
               f'advantage_corr           {np.corrcoef(CRITIC_A, REWARD_A)[0, 1]:.4g}'):
    assert line in text, text
