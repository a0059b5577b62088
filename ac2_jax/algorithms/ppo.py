"""PPO with a learned critic and GAE(lambda, gamma) (ALGORITHMS.md, "PPO with a learned critic").

One step: fresh problems get full responses scored by the judge; the value critic reads V(s_t) on
every generated token before any update; A_t = GAE(lambda, gamma) with the terminal reward on the
last token, return targets G_t = A_t + V(s_t). Per actor minibatch: the PPO update (dual clip,
adaptive eps_high as in every algorithm), then K critic updates on the same rows with the clipped
value loss against G (V_old = the reads). The first `critic_warmup_steps` steps train the critic
only. lambda = gamma = 1 gives A_t = R - V(s_t) on every model token.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ac2_jax.algorithms import base
from ac2_jax.algorithms import timing
from ac2_jax.algorithms import value_steps
from ac2_jax.controller.schedules import EntropyController
from ac2_jax.controller.settings import ControllerSettings
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner.runtime import Runtime
from ac2_jax.rl import gae


@dataclasses.dataclass(frozen=True)
class PPOSettings(value_steps.RolloutSettings):
  gamma: float = 1.0
  lam: float = 0.95

  def __post_init__(self):
    super().__post_init__()
    for name in ('gamma', 'lam'):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f'{name} must lie in [0, 1], got {getattr(self, name)!r}')


def gae_advantages(data: value_steps.Rollouts, gamma: float, lam: float
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(advantages, returns) per row from the reads `data.values` and the terminal rewards."""
  values_RxN, mask_RxN = data.padded(data.values)
  rewards_RxN = gae.terminal_rewards(data.rewards_R, mask_RxN)
  adv_RxN, ret_RxN = jax.device_get(gae.gae(values_RxN, rewards_RxN, mask_RxN, gamma=gamma,
                                            lam=lam))
  lengths = [len(v) for v in data.values]
  return ([np.asarray(adv_RxN[i, :n]) for i, n in enumerate(lengths)],
          [np.asarray(ret_RxN[i, :n]) for i, n in enumerate(lengths)])


class PPO(base.Algorithm):

  def __init__(self, rt: Runtime, settings: PPOSettings, entropy: ControllerSettings, seed: int):
    value_steps.check_setup(rt, 'PPO', settings)
    self.settings = settings
    self.seed = seed
    self.entropy = EntropyController(entropy)

  def state_dict(self) -> dict:
    return {'entropy': self.entropy.state_dict()}

  def load_state_dict(self, data: dict) -> None:
    self.entropy.load_state_dict(data['entropy'])

  def rollouts(self, rt: Runtime, state, step: int, key: jax.Array,
               timer: timing.PhaseTimer) -> tuple[value_steps.Rollouts, list[np.ndarray]]:
    """Sampled, judged rows with the critic's reads and their GAE advantages assigned; and the
    return targets G_t per row."""
    data = value_steps.sample(rt, state.params, self.settings, self.seed, 'ppo_problems', step,
                              key, timer)
    value_steps.read(rt, state, data, timer)
    advantages, returns = gae_advantages(data, self.settings.gamma, self.settings.lam)
    for row, a in zip(data.rows, advantages):
      row.advantages_N = a
    return data, returns

  def step(self, rt: Runtime, state, step: int, key: jax.Array):
    s = self.settings
    timer = timing.PhaseTimer()
    data, returns = self.rollouts(rt, state, step, key, timer)
    entropy = value_steps.entropy(data)
    eps_high = self.entropy.update(entropy)
    masks = [np.ones_like(v) for v in data.values]
    warmup = step <= s.critic_warmup_steps
    device = {'critic': []}
    for mb in range(rt.actor_minibatches):
      if not warmup:
        with timer('actor_updates'):
          state, device[f'actor{mb + 1}'] = timing.ready(
              rows_lib.train_actor(rt, state, data.rows, eps_high, mb))
      with timer('critic_updates'):
        state, metrics = value_steps.critic_updates(rt, state, s, data, mb, returns, masks)
      device['critic'] += metrics
    advantages = np.concatenate([r.advantages_N for r in data.rows])
    return state, value_steps.step_metrics(
        data, device, timer, entropy=entropy, eps_high=eps_high, critic_warmup=float(warmup),
        **{'adv/mean': float(advantages.mean()), 'adv/abs_mean': float(np.abs(advantages).mean())})
