"""PACT: policy-aligned critic training, actor then critic (ALGORITHMS.md, "PACT").

One step: fresh problems get full responses scored by the judge, with the sampling log-probs
stored; the sigmoid critic reads V^(s_t) (a constant of this step); A_t = R - V^(s_t) on every
model token (gamma = lambda = 1). B actor steps (the DIS loss, `actor.minibatches` of them); then
one forward of the UPDATED policy pi_{k+1} gives rho_t = exp(logp_new - logp_stored), the mask
m_t = 1[0 <= rho_t <= max_ratio] and the targets Y_t = rho_t R; B critic steps (K each, on the
actor's minibatches) minimise sum m BCE(V^, Y) / sum m.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ac2_jax.algorithms import base
from ac2_jax.algorithms import timing
from ac2_jax.algorithms import value_steps
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import value_rows
from ac2_jax.learner.runtime import Runtime
from ac2_jax.rl import pact


@dataclasses.dataclass(frozen=True)
class PACTSettings(value_steps.RolloutSettings):
  max_ratio: float = pact.MAX_RATIO   # critic tokens keep 0 <= rho <= max_ratio
  # The actor's DIS band (ALGORITHMS.md: 0.7..6.0 in the math setting): tokens whose ratio to the
  # sampling policy leaves (dis_low, dis_high) drop out of the actor loss.
  dis_low: float = 0.7
  dis_high: float = 6.0

  def __post_init__(self):
    super().__post_init__()
    if not self.max_ratio > 0:
      raise ValueError(f'max_ratio must be > 0, got {self.max_ratio!r}')
    if not 0.0 <= self.dis_low < 1.0 < self.dis_high:
      raise ValueError(f'the DIS band must satisfy 0 <= dis_low < 1 < dis_high, got '
                       f'({self.dis_low}, {self.dis_high})')


@dataclasses.dataclass
class CriticTargets:
  """Per row: rho_t under the updated policy, the critic mask and the targets rho_t R."""
  rho: list[np.ndarray]
  masks: list[np.ndarray]
  targets: list[np.ndarray]


class PACT(base.Algorithm):

  def __init__(self, rt: Runtime, settings: PACTSettings, seed: int):
    value_steps.check_setup(rt, 'PACT', settings)
    if rt.value_settings.loss != 'soft_bce':
      raise ValueError('PACT needs the sigmoid critic (value loss soft_bce), got '
                       f'{rt.value_settings.loss!r}')
    if rt.update_settings.policy_loss != 'dis':
      raise ValueError(f'PACT trains its actor with DIS, got {rt.update_settings.policy_loss!r}')
    self.settings = settings
    self.seed = seed

  def state_dict(self) -> dict:
    return {}  # nothing but the (seed, step)-keyed draws

  def load_state_dict(self, data: dict) -> None:
    pass

  def rollouts(self, rt: Runtime, state, step: int, key: jax.Array,
               timer: timing.PhaseTimer) -> value_steps.Rollouts:
    """Sampled, judged rows with the critic's reads and A_t = R - V^(s_t) assigned."""
    data = value_steps.sample(rt, state.params, self.settings, self.seed, 'pact_problems', step,
                              key, timer)
    value_steps.read(rt, state, data, timer)
    for row, v, reward in zip(data.rows, data.values, data.rewards_R):
      row.advantages_N = (reward - v).astype(np.float32)
    return data

  def critic_targets(self, rt: Runtime, params, data: value_steps.Rollouts) -> CriticTargets:
    """rho, mask and targets from one forward of the policy `params` (the updated one) against
    the log-probs stored at sampling."""
    logp_new = value_rows.read_logprobs(rt, params, data.rows)
    new_RxN, mask_RxN = data.padded(logp_new)
    old_RxN, _ = data.padded([r.logprobs_N for r in data.rows])
    targets_RxN, keep_RxN = jax.device_get(pact.critic_targets(
        new_RxN, old_RxN, data.rewards_R, mask_RxN, max_ratio=self.settings.max_ratio))
    rho_RxN = np.exp(np.where(mask_RxN > 0, new_RxN - old_RxN, 0.0))
    n = [len(x) for x in logp_new]
    return CriticTargets([rho_RxN[i, :k] for i, k in enumerate(n)],
                         [np.asarray(keep_RxN[i, :k], np.float32) for i, k in enumerate(n)],
                         [np.asarray(targets_RxN[i, :k]) for i, k in enumerate(n)])

  def step(self, rt: Runtime, state, step: int, key: jax.Array):
    s = self.settings
    timer = timing.PhaseTimer()
    data = self.rollouts(rt, state, step, key, timer)
    warmup = step <= s.critic_warmup_steps
    device = {'critic': []}
    if not warmup:
      with timer('actor_updates'):
        for mb in range(rt.actor_minibatches):
          # DIS has no PPO clip: eps_high is not read.
          state, device[f'actor{mb + 1}'] = timing.ready(
              rows_lib.train_actor(rt, state, data.rows, 0.0, mb))
    with timer('ratio_forward'):
      targets = self.critic_targets(rt, state.params, data)
    with timer('critic_updates'):
      for mb in range(rt.actor_minibatches):
        state, metrics = value_steps.critic_updates(rt, state, s, data, mb, targets.targets,
                                                    targets.masks)
        device['critic'] += metrics
    rho, keep = np.concatenate(targets.rho), np.concatenate(targets.masks)
    advantages = np.concatenate([r.advantages_N for r in data.rows])
    return state, value_steps.step_metrics(
        data, device, timer, entropy=value_steps.entropy(data), critic_warmup=float(warmup),
        **{'adv/mean': float(advantages.mean()), 'adv/abs_mean': float(np.abs(advantages).mean()),
           'pact/rho_mean': float(rho.mean()), 'pact/kept_fraction': float(keep.mean()),
           'pact/target_mean': float(np.concatenate(targets.targets)[keep > 0].mean())
           if keep.any() else None})
