"""AC2 controller building blocks: settings, keyed RNG, cuts, audits, targets, buffers, bank."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from ac2_jax.controller import ControllerSettings
from ac2_jax.controller import rng as rng_lib
from ac2_jax.controller import sampling
from ac2_jax.controller.bank import ReferenceBank
from ac2_jax.controller.critic_buffer import CriticBuffer, CriticPair
from ac2_jax.controller.replay import ReplayBuffer, Trajectory, freeze_tokens
from ac2_jax.controller.targets import group_target
from ac2_jax.critic.values import round_to_grid


def _trajectory(i, problem=0, length=30, passed=False, reference=None):
  return Trajectory(i, problem, freeze_tokens(np.arange(length) + 100 * i), 7 if passed else 2,
                    passed, reference, 0)


def test_defaults_are_the_paper_table():
  s = ControllerSettings()
  assert (s.group_size, s.audit_fraction, s.n_batch, s.n_refill, s.buffer_capacity) == (
      16, 0.25, 192, 192, 256)
  assert (s.response_budget, s.chunk_size, s.cut_grid, s.max_cut_fraction) == (
      50_000, 10_000, 10_000, 0.9)
  assert (s.critic_buffer_capacity, s.critic_pairs_per_update, s.min_valid_per_target) == (
      1920, 768, 8)
  assert (s.readiness_window, s.tau_global, s.tau_local, s.pass_points, s.max_points) == (
      5, .2, .18, 6, 7)
  assert s.critic_lr_init == pytest.approx(2 * math.sqrt(2) * 1e-6)
  assert s.critic_lr_floor == pytest.approx(5 * math.sqrt(2) * 1e-7)
  assert s.critic_lr_ratio_threshold == pytest.approx(math.sqrt(2))
  assert (s.entropy_target, s.entropy_step, s.entropy_k_min, s.entropy_k_max, s.entropy_k_init,
          s.eps_high_base) == (.28, .02, -.08, .08, .06, .28)
  variant = s.with_chunk_size(2000)
  assert (variant.chunk_size, variant.cut_grid) == (2000, 2000)


@pytest.mark.parametrize('changes, message', [
    (dict(group_size=0), 'group_size'),
    (dict(audit_fraction=1.5), 'audit_fraction'),
    (dict(chunk_size=60_000), 'chunk_size'),
    (dict(max_cut_fraction=1.0), 'max_cut_fraction'),
    (dict(group_size=4), 'min_valid_per_target'),
    (dict(pass_points=8), 'pass_points'),
    (dict(critic_lr_floor=1e-5), 'critic_lr_floor'),
    (dict(entropy_k_init=0.2), 'entropy_k_init'),
    (dict(n_batch=-1), 'n_batch'),
    (dict(tau_local=0.0), 'tau_local'),
])
def test_settings_reject_bad_values_by_name(changes, message):
  with pytest.raises(ValueError, match=message):
    ControllerSettings(**changes)


def test_rng_is_keyed_and_stable_across_processes():
  a = rng_lib.generator(7, 'cuts', 3).integers(0, 1 << 30, 4)
  assert np.array_equal(a, rng_lib.generator(7, 'cuts', 3).integers(0, 1 << 30, 4))
  for other in [(8, 'cuts', 3, 0), (7, 'audit', 3, 0), (7, 'cuts', 4, 0), (7, 'cuts', 3, 1)]:
    assert rng_lib.key(*other) != rng_lib.key(7, 'cuts', 3, 0)
  code = ('from ac2_jax.controller import rng; '
          'print(rng.generator(7, "cuts", 3).integers(0, 1 << 30, 4).tolist())')
  for hash_seed in ('1', '2'):
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                         env={**os.environ, 'PYTHONHASHSEED': hash_seed}).stdout
    assert out.strip() == str(a.tolist())


def test_cuts_lie_on_the_grid_within_the_allowed_fraction():
  rng = np.random.default_rng(0)
  lengths = np.concatenate([np.arange(0, 130), rng.integers(0, 50_000, 300)])
  for grid, fraction in [(10, 0.9), (10_000, 0.9), (1, 0.9), (7, 0.5)]:
    for trial in range(20):
      cuts = sampling.sample_cuts(np.random.default_rng(trial), lengths, grid, fraction)
      assert np.all(cuts % grid == 0) or grid == 1
      assert np.all(cuts <= np.floor(fraction * lengths + 1e-9))
      assert np.all(cuts <= np.maximum(lengths - 1, 0)) and np.all(cuts >= 0)
  # Every allowed grid point is reachable, 0 included (L = 100, grid 10: 0, 10, ..., 90).
  cuts = sampling.sample_cuts(np.random.default_rng(0), np.full(500, 100), 10, 0.9)
  assert set(cuts.tolist()) == set(range(0, 91, 10))
  cuts = sampling.sample_cuts(np.random.default_rng(0), np.full(50, 5), 10, 0.9)
  assert set(cuts.tolist()) == {0}
  assert sampling.cut_candidates(100, 10, 0.9).tolist() == list(range(0, 91, 10))
  assert sampling.cut_candidates(0, 10, 0.9).tolist() == [0]


def test_cut_is_capped_at_length_minus_one():
  # With a fraction close to 1 and grid 1, floor(0.99 * 3) = 2 = L - 1; with L = 1 only 0.
  cuts = sampling.sample_cuts(np.random.default_rng(0), np.full(200, 1), 1, 0.99)
  assert set(cuts.tolist()) == {0}
  cuts = sampling.sample_cuts(np.random.default_rng(0), np.full(200, 3), 1, 0.99)
  assert set(cuts.tolist()) == {0, 1, 2}


def test_cycle_draw_is_without_replacement_then_cycles():
  rng = np.random.default_rng(0)
  drawn = sampling.cycle_draw(rng, np.arange(10), 7)
  assert len(set(drawn.tolist())) == 7
  drawn = sampling.cycle_draw(rng, np.arange(4), 10)
  assert sorted(drawn[:4].tolist()) == [0, 1, 2, 3] and drawn[4:8].tolist() == drawn[:4].tolist()
  assert drawn[8:].tolist() == drawn[:2].tolist()
  with pytest.raises(ValueError, match='empty population'):
    sampling.cycle_draw(rng, np.arange(0), 3)


@pytest.mark.parametrize('num_ready, alpha, expected', [
    (0, .25, 0), (1, .25, 1), (4, .25, 1), (5, .25, 2), (192, .25, 48), (30, .1, 3), (7, 0.0, 0),
    (3, 1.0, 3)])
def test_audit_count_is_ceil_alpha_n(num_ready, alpha, expected):
  assert sampling.audit_count(num_ready, alpha) == expected
  picks = sampling.select_audits(np.random.default_rng(1), num_ready, alpha)
  assert len(picks) == expected and len(set(picks.tolist())) == expected


def test_grid_rounding_ties_go_down_and_targets_need_enough_valid_values():
  assert [round_to_grid(x) for x in (0.05, 0.15, 0.25, 0.35, 0.45, 0.251, 0.96, 1.0, 0.0)] == [
      0.0, 0.1, 0.2, 0.3, 0.4, 0.3, 1.0, 1.0, 0.0]
  assert group_target([1.0] * 7 + [None] * 9, 8) is None
  assert group_target([1.0] * 4 + [0.0] * 4 + [None] * 8, 8) == 0.5
  assert group_target([None, None], 1) is None
  assert group_target([3 / 7, 3 / 7, None], 2) == 0.4
  with pytest.raises(ValueError, match='finite'):
    round_to_grid(float('nan'))


def test_replay_buffer_evicts_oldest_first():
  buffer = ReplayBuffer(3)
  for i in range(5):
    buffer.add(_trajectory(i, problem=i % 2))
  assert [t.trajectory_id for t in buffer.trajectories] == [2, 3, 4]
  by_problem = buffer.by_problem()
  assert {p: [t.trajectory_id for t in ts] for p, ts in by_problem.items()} == {0: [2, 4], 1: [3]}
  buffer.replace_all([_trajectory(9)])
  assert [t.trajectory_id for t in buffer.trajectories] == [9]


def test_stored_tokens_are_owned_and_read_only():
  tokens = np.arange(5, dtype=np.int64)
  frozen = freeze_tokens(tokens)
  tokens[0] = 99
  assert frozen.dtype == np.int32 and frozen[0] == 0
  with pytest.raises(ValueError):
    frozen[:2][0] = 1
  with pytest.raises(ValueError, match='one-dimensional'):
    freeze_tokens(np.zeros((2, 2)))


def test_bank_adds_once_and_picks_among_the_steps_candidates():
  picks = set()
  for step in range(40):
    bank = ReferenceBank(3)
    added = bank.add_candidates(rng_lib.generator(0, 'bank', step), [(1, 'a'), (1, 'b'), (2, 'c')])
    assert added == [1, 2]
    picks.add(bank.get(1))
    assert bank.add_candidates(rng_lib.generator(0, 'bank', step + 1), [(1, 'z'), (0, 'y')]) == [0]
    assert bank.get(1) in ('a', 'b') and bank.get(0) == 'y' and len(bank) == 3
  assert picks == {'a', 'b'}  # random among the candidates, not always the first
  assert ReferenceBank(3).mask().tolist() == [False] * 3


def test_critic_buffer_fifo_sampling_limits_and_weights():
  buffer = CriticBuffer(4)
  sources = [_trajectory(i, problem=i, length=10 * (i + 1), passed=(i == 1), reference=f'own{i}')
             for i in range(6)]
  for i, t in enumerate(sources):
    buffer.add(CriticPair(t.problem, t, 5 * i, 0.1 * i, i))
  assert [p.source.trajectory_id for p in buffer.pairs] == [2, 3, 4, 5]
  reference_for = lambda pair: 'bank' if pair.problem == 3 else None
  batch = buffer.sample(np.random.default_rng(0), 10, reference_for, lambda p: f'p{p}')
  assert batch.num_pairs == 4 and batch.num_skipped == 0
  weights = {}
  for record in batch.records:
    weights.setdefault(record.problem_id, []).append((record.reference, record.weight))
    assert record.prefix_tokens_P.shape[0] == 5 * int(record.problem_id[1:])
  assert weights['p3'] == [('bank', 0.5), (None, 0.5)]
  assert weights['p2'] == [(None, 1.0)]
  # Without replacement: at most max_pairs distinct pairs.
  batch = buffer.sample(np.random.default_rng(1), 2, reference_for, lambda p: p)
  assert batch.num_pairs == 2 and len({r.problem_id for r in batch.records}) == 2
  # Int limit on prefix + reference length ('bank': 4): cut 10 fits, 15 + 4, 20 and 25 do not.
  batch = buffer.sample(np.random.default_rng(0), 10, reference_for, lambda p: p, context_limit=18)
  assert {r.problem_id for r in batch.records} == {2} and batch.num_skipped == 3
  batch = buffer.sample(np.random.default_rng(0), 10, reference_for, lambda p: p,
                        context_limit=lambda r: r.prefix_tokens_P.shape[0] <= 15)
  assert {r.problem_id for r in batch.records} == {2, 3} and batch.num_skipped == 2


def test_the_controller_imports_no_jax():
  code = ('import sys, ac2_jax.controller, ac2_jax.bench.controller; '
          'print(sorted(m for m in sys.modules if m == "jax" or m.startswith("jax.")))')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == '[]'
