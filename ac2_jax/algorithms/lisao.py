"""LiSAO: single-rollout optimisation with a separate value critic (ALGORITHMS.md, "SAO / LiSAO").

One step: `problems_per_step` fresh problems get ONE full response each, scored by the judge
(synchronous), or the next such batch from the in-flight rollout worker (`inflight` settings,
algorithms/inflight.py: generated while the previous steps trained); the value critic (attention
frozen in configs/lisao.py) reads V(s_t) on every generated token before any update. Advantages: skip-observation GAE over the model tokens with gamma and a
per-trajectory lambda = clamp(1 - 1 / (alpha L), 0, 1), L = the row's model tokens; critic
targets: the lambda = 1 returns (at gamma = 1, R on every model token). Per actor minibatch: the
DIS update on the log-probabilities stored when each token was sampled, then K critic updates
(clipped value loss, V_old = the reads). The first `critic_warmup_steps` steps train the critic
only (10 in the paper).

A single-turn response is model tokens only, so the skip-observation recursion is plain GAE here;
a multi-turn task would mask its observation tokens out of `model_masks`.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ac2_jax import sampling
from ac2_jax.algorithms import base
from ac2_jax.algorithms import inflight
from ac2_jax.algorithms import timing
from ac2_jax.algorithms import value_steps
from ac2_jax.controller.inflight import InflightSettings
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner.runtime import Runtime
from ac2_jax.rl import gae


@dataclasses.dataclass(frozen=True)
class SAOSettings(value_steps.RolloutSettings):
  """What LiSAO and Li2SAO share: GAE's discount, lambda's length coefficient, the DIS band."""
  gamma: float = 1.0
  lambda_alpha: float = 1.5   # lambda = clamp(1 - 1 / (lambda_alpha L), 0, 1) per trajectory
  # The actor's DIS band (ALGORITHMS.md: 0.7..6.0 in the math setting): tokens whose ratio to the
  # sampling policy leaves (dis_low, dis_high) drop out of the actor loss.
  dis_low: float = 0.7
  dis_high: float = 6.0
  inflight: InflightSettings | None = None  # None: synchronous (sample, then train)

  def __post_init__(self):
    super().__post_init__()
    if not 0.0 <= self.gamma <= 1.0:
      raise ValueError(f'gamma must lie in [0, 1], got {self.gamma!r}')
    if not self.lambda_alpha > 0:
      raise ValueError(f'lambda_alpha must be > 0, got {self.lambda_alpha!r}')
    if not 0.0 <= self.dis_low < 1.0 < self.dis_high:
      raise ValueError(f'the DIS band must satisfy 0 <= dis_low < 1 < dis_high, got '
                       f'({self.dis_low}, {self.dis_high})')


@dataclasses.dataclass(frozen=True)
class LiSAOSettings(SAOSettings):
  responses_per_problem: int = 1

  def __post_init__(self):
    super().__post_init__()
    if self.responses_per_problem != 1:
      raise ValueError('LiSAO samples one response per problem, got responses_per_problem='
                       f'{self.responses_per_problem}')


def model_masks(data: value_steps.Rollouts) -> list[np.ndarray]:
  """1 on each row's model tokens: every generated token of a single-turn response."""
  return [np.ones(len(r.new_N), np.float32) for r in data.rows]


@jax.jit
def _sao_gae(values_RxN, model_RxN, rewards_R, gamma, lambda_alpha):
  """(advantages at the per-row lambda, returns at lambda = 1), both [R, N]."""
  rewards_RxN = gae.terminal_rewards(rewards_R, model_RxN)
  lam_R = gae.adaptive_lambda(model_RxN.sum(1), alpha=lambda_alpha)
  adv_RxN, _ = gae.skip_observation_gae(values_RxN, rewards_RxN, model_RxN, gamma=gamma,
                                        lam=lam_R)
  _, ret_RxN = gae.skip_observation_gae(values_RxN, rewards_RxN, model_RxN, gamma=gamma, lam=1.0)
  return adv_RxN, ret_RxN


def sao_advantages(data: value_steps.Rollouts, gamma: float, lambda_alpha: float
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(advantages, returns) per row: skip-observation GAE with each trajectory's own lambda, and
  the lambda = 1 returns the critic fits; from the reads `data.values` and the terminal rewards."""
  lengths = [len(v) for v in data.values]
  # One program per length bucket, not per longest row.
  width = sampling.bucket(max(lengths))
  values_RxN, _ = data.padded(data.values, width)
  model_RxN, _ = data.padded(model_masks(data), width)
  adv_RxN, ret_RxN = jax.device_get(_sao_gae(values_RxN, model_RxN, data.rewards_R, gamma,
                                             lambda_alpha))
  return ([np.asarray(adv_RxN[i, :n]) for i, n in enumerate(lengths)],
          [np.asarray(ret_RxN[i, :n]) for i, n in enumerate(lengths)])


def actor_critic_updates(rt: Runtime, state, s: value_steps.RolloutSettings,
                         data: value_steps.Rollouts, targets, masks, timer: timing.PhaseTimer,
                         *, warmup: bool, groups=None) -> tuple:
  """Per actor minibatch: the DIS actor update (none while `warmup`), then K critic updates on
  the same rows. Returns (state, device metrics by prefix)."""
  device = {'critic': []}
  for mb in range(rt.actor_minibatches):
    if not warmup:
      with timer('actor_updates'):
        # DIS has no PPO clip: eps_high is not read.
        state, device[f'actor{mb + 1}'] = timing.ready(
            rows_lib.train_actor(rt, state, data.rows, 0.0, mb))
    with timer('critic_updates'):
      state, metrics = value_steps.critic_updates(rt, state, s, data, mb, targets, masks, groups)
    device['critic'] += metrics
  return state, device


def advantage_metrics(data: value_steps.Rollouts) -> dict:
  advantages = np.concatenate([r.advantages_N for r in data.rows])
  return {'adv/mean': float(advantages.mean()), 'adv/abs_mean': float(np.abs(advantages).mean())}


def check_dis(rt: Runtime, name: str) -> None:
  if rt.update_settings.policy_loss != 'dis':
    raise ValueError(f'{name} trains its actor with DIS, got {rt.update_settings.policy_loss!r}')
  if rt.value_settings is not None and rt.value_settings.loss != 'clipped_mse':
    raise ValueError(f'{name} needs the linear value head (clipped_mse), got '
                     f'{rt.value_settings.loss!r}')


class LiSAO(base.Algorithm):

  def __init__(self, rt: Runtime, settings: LiSAOSettings, seed: int):
    value_steps.check_setup(rt, 'LiSAO', settings)
    check_dis(rt, 'LiSAO')
    self.settings = settings
    self.seed = seed
    self.source = (inflight.InflightSource(rt, settings.inflight, seed, 1,
                                           settings.problems_per_step)
                   if settings.inflight else None)

  def state_dict(self) -> dict:
    # Nothing but the (seed, step)-keyed draws; in-flight rollouts are dropped at a save.
    return {}

  def load_state_dict(self, data: dict) -> None:
    pass

  def close(self) -> None:
    if self.source is not None:
      self.source.close()

  def rollouts(self, rt: Runtime, state, step: int, key: jax.Array, timer: timing.PhaseTimer
               ) -> tuple[value_steps.Rollouts, list[np.ndarray], dict]:
    """Judged rows with the critic's reads and their GAE advantages assigned; the return targets
    per row; the in-flight rollout metrics ({} when synchronous)."""
    metrics = {}
    if self.source is not None:
      data, _, metrics = self.source.take(state, step, timer)
    else:
      data = value_steps.sample(rt, state.params, self.settings, self.seed, 'lisao_problems',
                                step, key, timer)
    value_steps.read(rt, state, data, timer)
    advantages, returns = sao_advantages(data, self.settings.gamma, self.settings.lambda_alpha)
    for row, a in zip(data.rows, advantages):
      row.advantages_N = a
    return data, returns, metrics

  def step(self, rt: Runtime, state, step: int, key: jax.Array):
    s = self.settings
    timer = timing.PhaseTimer()
    data, returns, rollout_metrics = self.rollouts(rt, state, step, key, timer)
    warmup = step <= s.critic_warmup_steps
    state, device = actor_critic_updates(rt, state, s, data, returns, model_masks(data), timer,
                                         warmup=warmup)
    if self.source is not None:
      rollout_metrics.update(self.source.publish(state, step, timer))
    lengths = np.array([len(r.new_N) for r in data.rows])
    return state, value_steps.step_metrics(
        data, device, timer, entropy=value_steps.entropy(data), critic_warmup=float(warmup),
        **advantage_metrics(data), **rollout_metrics, **{
            'sao/lambda_mean': float(np.mean(gae.adaptive_lambda(lengths, alpha=s.lambda_alpha)))})
