"""Li2SAO's one-way switch from group bootstrapping to single rollouts (ALGORITHMS.md, "Li2SAO").

Host bookkeeping, no JAX. After each bootstrap step k the algorithm hands the gate that step's
readiness statistics, measured on mixed groups: the residual explained variance e_k and the
pair-ordering accuracy a_k. The gate keeps their EMAs (beta), a counter M of consecutive ready
steps, and opens once:

  e_bar <- beta e_bar + (1 - beta) e_k;  a_bar likewise    (both start at 0)
  counter <- counter + 1 if k >= T_min and e_bar > eta_e and a_bar > eta_a, else 0
  switch when counter >= M or k >= T_max

A step without mixed groups has no statistics (None): the EMAs keep their values and the counter
is decided on them as they stand. Once switched the gate never closes again; `observe` after the
switch changes nothing. What the switch does to sampling (finish the prefetched group batch, drop
leftovers, then group size 1) is the algorithm's (algorithms/li2sao.py).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GateSettings:
  ema_beta: float = 0.9
  min_explained_variance: float = 0.2   # eta_e
  min_ranking_accuracy: float = 0.65    # eta_a
  ready_steps: int = 10                 # M consecutive ready steps
  min_steps: int = 60                   # T_min: the counter only counts from this step on
  max_steps: int = 150                  # T_max: switch at this step whatever the statistics

  def __post_init__(self):
    if not 0.0 <= self.ema_beta < 1.0:
      raise ValueError(f'ema_beta must lie in [0, 1), got {self.ema_beta!r}')
    if self.ready_steps < 1:
      raise ValueError(f'ready_steps must be >= 1, got {self.ready_steps!r}')
    if not 0 <= self.min_steps <= self.max_steps:
      raise ValueError(f'need 0 <= min_steps <= max_steps, got ({self.min_steps}, '
                       f'{self.max_steps})')


class SwitchGate:
  """The EMAs, the counter and the step at which the switch happened (None: not yet)."""

  def __init__(self, settings: GateSettings):
    self.settings = settings
    self.ema_explained_variance = 0.0
    self.ema_ranking_accuracy = 0.0
    self.counter = 0
    self.switch_step: int | None = None

  @property
  def switched(self) -> bool:
    return self.switch_step is not None

  def ready(self, step: int) -> bool:
    """Whether step `step` counts as ready on the EMAs as they stand."""
    s = self.settings
    return (step >= s.min_steps and self.ema_explained_variance > s.min_explained_variance
            and self.ema_ranking_accuracy > s.min_ranking_accuracy)

  def observe(self, step: int, explained_variance: float | None,
              ranking_accuracy: float | None) -> bool:
    """Records bootstrap step `step`'s statistics; True when this call opened the gate."""
    if self.switched:
      return False
    s = self.settings
    if explained_variance is not None and ranking_accuracy is not None:
      b = s.ema_beta
      self.ema_explained_variance = b * self.ema_explained_variance + (1 - b) * explained_variance
      self.ema_ranking_accuracy = b * self.ema_ranking_accuracy + (1 - b) * ranking_accuracy
    self.counter = self.counter + 1 if self.ready(step) else 0
    if self.counter >= s.ready_steps or step >= s.max_steps:
      self.switch_step = step
      return True
    return False

  def state_dict(self) -> dict:
    return {'ema_explained_variance': self.ema_explained_variance,
            'ema_ranking_accuracy': self.ema_ranking_accuracy, 'counter': self.counter,
            'switch_step': self.switch_step}

  def load_state_dict(self, data: dict) -> None:
    self.ema_explained_variance = float(data['ema_explained_variance'])
    self.ema_ranking_accuracy = float(data['ema_ranking_accuracy'])
    self.counter = int(data['counter'])
    step = data['switch_step']
    self.switch_step = None if step is None else int(step)
