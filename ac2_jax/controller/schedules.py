"""Host-side schedules of one AC2 step: the critic learning rate and the adaptive entropy offset.

Both are plain objects with state_dict/load_state_dict so a resumed run continues them exactly.

Critic learning rate (AC2 item 10): after each step, with the parameter changes of the critic update
and of the two actor minibatch updates (each measured from the parameters just before it), the rate
halves (down to the floor) after `patience` (= 2) consecutive steps whose ratio
||dV|| / (||dPPO1|| + ||dPPO2||) exceeds the threshold (sqrt 2); the streak then starts again. A
non-finite critic loss or gradient skips the critic update and halves at once (the streak resets).

Adaptive entropy control: once per step, before the actor update, with H the token-mean entropy over
the generated tokens of rows with an empty prefix, k <- clip(k + step * sign(target - H), k_min,
k_max) and eps_high = eps_high_base + k.
"""

from __future__ import annotations

import math

from ac2_jax.controller.settings import ControllerSettings


class CriticLRController:
  """The critic's learning rate and its high-ratio streak."""

  def __init__(self, settings: ControllerSettings):
    self.settings = settings
    self.lr = settings.critic_lr_init
    self.high_streak = 0
    self.num_halvings = 0

  @staticmethod
  def update_ratio(critic_norm: float, actor_norm_1: float, actor_norm_2: float) -> float:
    """||dV|| / (||dPPO1|| + ||dPPO2||): inf when only the critic moved, NaN when nothing moved."""
    denominator = actor_norm_1 + actor_norm_2
    if denominator == 0.0:
      return float('inf') if critic_norm > 0.0 else float('nan')
    return critic_norm / denominator

  def observe(self, critic_norm: float, actor_norm_1: float, actor_norm_2: float,
              finite: bool = True) -> float:
    """Records one step's update norms; returns the learning rate for the next critic update.

    finite=False (or a non-finite critic norm) means the critic update was skipped: halve now.
    """
    if not finite or not math.isfinite(critic_norm):
      self.high_streak = 0
      self._halve()
      return self.lr
    ratio = self.update_ratio(critic_norm, actor_norm_1, actor_norm_2)
    # A NaN ratio (nothing moved) is not evidence of a too-large critic step.
    if ratio > self.settings.critic_lr_ratio_threshold:
      self.high_streak += 1
      if self.high_streak >= self.settings.critic_lr_patience:
        self.high_streak = 0
        self._halve()
    else:
      self.high_streak = 0
    return self.lr

  def _halve(self) -> None:
    self.lr = max(self.lr * 0.5, self.settings.critic_lr_floor)
    self.num_halvings += 1

  def state_dict(self) -> dict:
    return {'lr': float(self.lr), 'high_streak': int(self.high_streak),
            'num_halvings': int(self.num_halvings)}

  def load_state_dict(self, state: dict) -> None:
    lr = float(state['lr'])
    if not (math.isfinite(lr) and lr > 0.0):
      raise ValueError(f'critic learning rate in the checkpoint must be finite and > 0, got {lr}')
    self.lr = max(lr, self.settings.critic_lr_floor)
    self.high_streak = int(state['high_streak'])
    self.num_halvings = int(state['num_halvings'])


class EntropyController:
  """The entropy offset k and the PPO upper clip eps_high = eps_high_base + k."""

  def __init__(self, settings: ControllerSettings):
    self.settings = settings
    self.k = settings.entropy_k_init

  @property
  def eps_high(self) -> float:
    return self.settings.eps_high_base + self.k

  def update(self, entropy: float | None) -> float:
    """One step's update from H (nats); returns eps_high for this step's actor minibatches.

    None or NaN (no generated token with an empty prefix this step) leaves k unchanged.
    """
    if entropy is not None and math.isfinite(entropy):
      s = self.settings
      direction = (s.entropy_target > entropy) - (s.entropy_target < entropy)
      self.k = min(max(self.k + s.entropy_step * direction, s.entropy_k_min), s.entropy_k_max)
      # Keep k on the step grid despite float accumulation (0.06 + 0.02 = 0.08000000000000002).
      self.k = round(self.k, 12)
    return self.eps_high

  def state_dict(self) -> dict:
    return {'k': float(self.k)}

  def load_state_dict(self, state: dict) -> None:
    k = float(state['k'])
    s = self.settings
    if not s.entropy_k_min <= k <= s.entropy_k_max:
      raise ValueError(f'entropy offset k={k} in the checkpoint lies outside '
                       f'[{s.entropy_k_min}, {s.entropy_k_max}]')
    self.k = k
