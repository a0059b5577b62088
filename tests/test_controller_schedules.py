"""Critic learning-rate halving and adaptive entropy control."""

import json
import math

import pytest

from ac2_jax.controller import ControllerSettings, CriticLRController, EntropyController

HIGH = (2.0, 0.5, 0.5)   # ratio 2 > sqrt 2
LOW = (1.0, 0.5, 0.5)    # ratio 1


def test_lr_halves_after_exactly_two_consecutive_high_ratios():
  s = ControllerSettings()
  c = CriticLRController(s)
  assert c.observe(*HIGH) == s.critic_lr_init          # one high step: no change
  assert c.observe(*HIGH) == s.critic_lr_init / 2      # second consecutive: halve
  assert c.observe(*HIGH) == s.critic_lr_init / 2      # the streak starts again
  assert c.observe(*HIGH) == s.critic_lr_init / 4
  # High, low, high never halves.
  c = CriticLRController(s)
  for norms in (HIGH, LOW, HIGH, LOW, HIGH):
    assert c.observe(*norms) == s.critic_lr_init
  # Exactly at the threshold is not above it.
  c = CriticLRController(s)
  for _ in range(3):
    assert c.observe(math.sqrt(2), 0.5, 0.5) == s.critic_lr_init


def test_lr_halves_at_once_on_a_non_finite_update_and_stops_at_the_floor():
  s = ControllerSettings()
  c = CriticLRController(s)
  c.observe(*HIGH)
  assert c.observe(0.0, 0.5, 0.5, finite=False) == s.critic_lr_init / 2
  assert c.high_streak == 0                              # the skip also resets the streak
  assert c.observe(*HIGH) == s.critic_lr_init / 2
  assert c.observe(float('nan'), 0.5, 0.5) == s.critic_lr_init / 4
  for _ in range(10):
    c.observe(0.0, 0.0, 0.0, finite=False)
  assert c.lr == pytest.approx(s.critic_lr_floor) and c.lr >= s.critic_lr_floor
  assert CriticLRController.update_ratio(1.0, 0.0, 0.0) == math.inf
  assert math.isnan(CriticLRController.update_ratio(0.0, 0.0, 0.0))


def test_lr_state_round_trips_mid_streak():
  s = ControllerSettings()
  c = CriticLRController(s)
  c.observe(*HIGH)
  restored = CriticLRController(s)
  restored.load_state_dict(json.loads(json.dumps(c.state_dict())))
  assert restored.observe(*HIGH) == c.observe(*HIGH) == s.critic_lr_init / 2
  with pytest.raises(ValueError, match='learning rate'):
    restored.load_state_dict({'lr': float('nan'), 'high_streak': 0, 'num_halvings': 0})


def test_entropy_offset_moves_by_sign_and_clips():
  s = ControllerSettings()
  e = EntropyController(s)
  assert e.k == 0.06 and e.eps_high == pytest.approx(0.34)
  assert e.update(0.1) == pytest.approx(0.28 + 0.08)     # H below target: k up to the clip
  assert e.update(0.1) == pytest.approx(0.36)            # clipped at k_max
  assert e.k == 0.08
  for expected in (0.06, 0.04, 0.02, 0.0, -0.02, -0.04, -0.06, -0.08, -0.08):
    e.update(0.9)                                        # H above target: k down, clipped at k_min
    assert e.k == pytest.approx(expected)
  assert e.eps_high == pytest.approx(0.20)
  e.update(0.28)                                         # sign(0) = 0
  e.update(None)                                         # no empty-prefix rows this step
  e.update(float('nan'))
  assert e.k == pytest.approx(-0.08)
  restored = EntropyController(s)
  restored.load_state_dict(json.loads(json.dumps(e.state_dict())))
  assert restored.k == e.k
  with pytest.raises(ValueError, match='outside'):
    restored.load_state_dict({'k': 0.5})
