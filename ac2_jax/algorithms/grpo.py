"""GRPO: fresh problems, g full responses each, A_i = R_i - mean_j R_j (optionally / std) on every token.

Synchronous by default (each step samples, then trains). With `inflight` settings
(rollout.mode='async') the step trains the next batch of groups from the in-flight rollout worker
(algorithms/inflight.py: generated while the previous steps trained, a rollout paused at a weight
update resuming under the new weights). Its loss is GRPO's usual PPO-clipped one; the ratio's
denominator is each token's log-probability stored when it was sampled, so a token sampled by an
older policy version is weighted by pi_theta / pi_rollout of its own version (ALGORITHMS.md, SAO:
the policy version may change inside a trajectory), clipped as any other.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ac2_jax.algorithms import base
from ac2_jax.algorithms import inflight
from ac2_jax.algorithms import timing
from ac2_jax.algorithms import value_steps
from ac2_jax.controller.inflight import InflightSettings
from ac2_jax.controller.schedules import EntropyController
from ac2_jax.controller.settings import ControllerSettings
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner.runtime import Runtime
from ac2_jax.rl import advantages as adv_lib


@dataclasses.dataclass(frozen=True)
class GRPOSettings:
  problems_per_step: int = 256
  group_size: int = 16
  normalize_std: bool = False
  response_budget: int = 50_000
  inflight: InflightSettings | None = None  # None: synchronous (sample, then train)

  def __post_init__(self):
    for name in ('problems_per_step', 'group_size', 'response_budget'):
      if getattr(self, name) < 1:
        raise ValueError(f'GRPOSettings: {name} must be >= 1, got {getattr(self, name)}')


class GRPO(base.Algorithm):

  def __init__(self, rt: Runtime, settings: GRPOSettings, entropy: ControllerSettings, seed: int):
    if settings.problems_per_step > len(rt.train_records):
      raise ValueError(f'GRPO: problems_per_step={settings.problems_per_step} exceeds the '
                       f'{len(rt.train_records)} training problems')
    self.settings = settings
    self.seed = seed
    self.entropy = EntropyController(entropy)
    self.source = (inflight.InflightSource(rt, settings.inflight, seed, settings.group_size,
                                           settings.problems_per_step * settings.group_size)
                   if settings.inflight else None)

  def state_dict(self) -> dict:
    # In-flight rollouts are dropped at a save (a resumed run starts the worker afresh).
    return {'entropy': self.entropy.state_dict()}

  def load_state_dict(self, data: dict) -> None:
    self.entropy.load_state_dict(data['entropy'])

  def close(self) -> None:
    if self.source is not None:
      self.source.close()

  def step(self, rt: Runtime, state, step: int, key: jax.Array):
    s = self.settings
    timer = timing.PhaseTimer()
    rollout_metrics = {}
    if self.source is not None:
      data, _, rollout_metrics = self.source.take(state, step, timer)
    else:
      data = value_steps.sample(
          rt, state.params, value_steps.RolloutSettings(s.problems_per_step, s.group_size,
                                                        s.response_budget),
          self.seed, 'grpo_problems', step, key, timer)
    rows = data.rows
    rewards_NxG = data.rewards_R.reshape(-1, s.group_size)
    adv_NxG = np.asarray(adv_lib.grpo_advantages(rewards_NxG, normalize_std=s.normalize_std))
    for row, a in zip(rows, adv_NxG.reshape(-1)):
      row.advantage, row.weight = float(a), 1.0

    entropy = float(np.mean(np.concatenate([r.entropies_N for r in rows])))
    eps_high = self.entropy.update(entropy)
    with timer('actor_updates'):
      state, m1 = timing.ready(rows_lib.train_actor(rt, state, rows, eps_high, 0))
      state, m2 = timing.ready(rows_lib.train_actor(rt, state, rows, eps_high, 1))
    if self.source is not None:
      rollout_metrics.update(self.source.publish(state, step, timer))
    host = base.host_metrics({'actor1': m1, 'actor2': m2})
    metrics = {
        'entropy': entropy, 'eps_high': eps_high,
        'reward/judged_mean': float(rewards_NxG.mean()),
        'grpo/zero_variance_groups': adv_lib.zero_variance_share(rewards_NxG),
        'judge_failures': data.judge_failures,
        'adv/abs_mean': float(np.abs(adv_NxG).mean()),
        'rows_trained': len(rows),
        'tokens_generated': int(sum(len(r.new_N) for r in rows)),
        'decoding_flops': data.decoding_flops,
        **{f'{part}/{k}': v for part in ('actor1', 'actor2') for k, v in host[part].items()},
        **rollout_metrics, **timer.metrics(),
    }
    return state, metrics
