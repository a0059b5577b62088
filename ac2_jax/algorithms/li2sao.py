"""Li2SAO: group-relative actor-critic bootstrapping, then a one-way switch to LiSAO (ALGORITHMS.md,
"Li2SAO").

Every step trains on `trajectories` = problems_per_step x n_b responses. The group size of a batch
is fixed when its generation is requested: n_b while the gate is closed, 1 once it has opened
(same trajectories, so problems_per_step x n_b problems). The estimator is chosen by the batch's
own group size, never by the gate, so one optimizer step never mixes the two:

  bootstrap batch (groups of n_b), actor and critic from step 1, no warm-up:
    actor   A_i = (R_i - mu_g) / (sigma_g + eps) on every model token, DIS;
    critic  targets Z_i = R_i - mu_g on the divergence mask (mixed groups only), clipped residual
            loss (V_old = the reads) + rank_coef x the terminal ranking hinge
            (learner/value_critic.py);
    gate    e_k and a_k from the reads before the update (V(s_T) at each last action token, mixed
            groups), handed to controller/switch_gate.py;
  single batch (group size 1): LiSAO's step (algorithms/lisao.py): GAE with the per-trajectory
    lambda, absolute lambda = 1 return targets on every model token, no ranking pairs.

When the gate opens after step k, a synchronous run has nothing prefetched: step k + 1 samples
singletons. In-flight (`inflight` settings: the rollout worker generates the next batch while a
step trains) the batch already requested at n_b is finished and trained at step k + 1 as a
bootstrap batch; taking it resets the worker's pipeline to singletons in the same critical
section, which drops the leftover groups, so step k + 2 trains singletons. The gate's state (EMAs,
counter, switch step) is the host state a checkpoint saves; in-flight rollouts are dropped at a
save, so a run resumed after the switch starts with singletons.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ac2_jax import sampling
from ac2_jax.algorithms import base
from ac2_jax.algorithms import inflight
from ac2_jax.algorithms import lisao
from ac2_jax.algorithms import timing
from ac2_jax.algorithms import value_steps
from ac2_jax.controller.switch_gate import GateSettings, SwitchGate
from ac2_jax.learner.runtime import Runtime
from ac2_jax.rl import li2sao


@dataclasses.dataclass(frozen=True)
class Li2SAOSettings(lisao.SAOSettings):
  responses_per_problem: int = 8   # n_b, the bootstrap group size
  gate: GateSettings = dataclasses.field(default_factory=GateSettings)
  eps: float = 1e-6                # in the actor's (R - mu) / (sigma + eps)

  def __post_init__(self):
    super().__post_init__()
    if self.responses_per_problem < 2:
      raise ValueError('the bootstrap compares responses within a group: responses_per_problem '
                       f'must be >= 2, got {self.responses_per_problem}')
    if self.critic_warmup_steps:
      raise ValueError('Li2SAO trains actor and critic from step 1: critic_warmup_steps must be '
                       f'0, got {self.critic_warmup_steps}')

  @property
  def trajectories(self) -> int:
    """Responses per update, in both phases."""
    return self.problems_per_step * self.responses_per_problem


@dataclasses.dataclass
class Bootstrap:
  """A bootstrap batch's critic targets and masks per row, and its readiness statistics."""
  targets: list[np.ndarray]
  masks: list[np.ndarray]
  explained_variance: float | None   # e_k; None: no mixed group in the batch
  ranking_accuracy: float | None     # a_k
  mixed_fraction: float


def responses(data: value_steps.Rollouts, group_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_NxGxT, lengths_NxG): each row's generated tokens, right-padded to a length bucket
  (one program per bucket), as groups."""
  lengths_R = np.array([len(r.new_N) for r in data.rows])
  tokens_RxT = np.zeros((len(data.rows), sampling.bucket(lengths_R.max())), np.int32)
  for i, r in enumerate(data.rows):
    tokens_RxT[i, :len(r.new_N)] = r.new_N
  return (tokens_RxT.reshape(-1, group_size, tokens_RxT.shape[1]),
          lengths_R.reshape(-1, group_size))


@jax.jit
def _group_arrays(rewards_NxG, tokens_NxGxT, lengths_NxG, terminal_NxG, eps):
  """Actor advantages, residual targets, the critic mask [N, G, T] and e_k, a_k (NaN without a
  mixed group), in one program."""
  adv_NxG = li2sao.actor_advantages(rewards_NxG, eps=eps)
  z_NxG, keep_NxG = li2sao.residual_targets(rewards_NxG)
  # Single-turn responses: every generated token is a model token.
  model_NxGxT = jnp.arange(tokens_NxGxT.shape[-1]) < lengths_NxG[..., None]
  mask_NxGxT = li2sao.divergence_mask(tokens_NxGxT, lengths_NxG, model_NxGxT, rewards_NxG)
  mixed = keep_NxG.any()
  e = li2sao.explained_variance(z_NxG, terminal_NxG, keep_NxG)
  a = li2sao.ranking_accuracy(terminal_NxG, li2sao.ranking_pairs(rewards_NxG))
  return (adv_NxG, z_NxG, keep_NxG, mask_NxGxT & keep_NxG[..., None],
          jnp.where(mixed, e, jnp.nan), jnp.where(mixed, a, jnp.nan))


def bootstrap(data: value_steps.Rollouts, group_size: int, eps: float) -> Bootstrap:
  """Assigns the group-normalised actor advantages to `data.rows`; returns the critic's residual
  targets on the divergence mask and the readiness statistics of the reads."""
  rewards_NxG = data.rewards_R.reshape(-1, group_size)
  tokens_NxGxT, lengths_NxG = responses(data, group_size)
  # V(s_T): the read at each response's last action token, before this step's updates.
  terminal_NxG = np.array([v[-1] for v in data.values], np.float32).reshape(rewards_NxG.shape)
  adv_NxG, z_NxG, keep_NxG, mask_NxGxT, e, a = jax.device_get(_group_arrays(
      rewards_NxG, tokens_NxGxT, lengths_NxG, terminal_NxG, eps))
  mask_RxT = np.asarray(mask_NxGxT, np.float32).reshape(len(data.rows), -1)
  targets, masks = [], []
  for i, (row, a_i, z_i) in enumerate(zip(data.rows, adv_NxG.reshape(-1), z_NxG.reshape(-1))):
    n = len(row.new_N)
    row.advantages_N = np.full(n, a_i, np.float32)
    targets.append(np.full(n, z_i, np.float32))
    masks.append(mask_RxT[i, :n])
  stat = lambda x: None if np.isnan(x) else float(x)
  return Bootstrap(targets, masks, stat(e), stat(a), float(np.asarray(keep_NxG).any(-1).mean()))


class Li2SAO(base.Algorithm):

  def __init__(self, rt: Runtime, settings: Li2SAOSettings, seed: int):
    value_steps.check_setup(rt, 'Li2SAO', settings)
    lisao.check_dis(rt, 'Li2SAO')
    n = settings.responses_per_problem
    if settings.trajectories > len(rt.train_records):
      raise ValueError(f'Li2SAO: after the switch a step draws {settings.trajectories} distinct '
                       f'problems, more than the {len(rt.train_records)} training problems')
    # The ranking pairs and the divergence mask are per group: a group must not straddle an
    # actor/critic minibatch or a critic micro-batch.
    if settings.problems_per_step % rt.actor_minibatches:
      raise ValueError(f'Li2SAO: problems_per_step={settings.problems_per_step} must split '
                       f'evenly into {rt.actor_minibatches} minibatches (whole groups each)')
    micro = rt.update_settings.micro_batch
    if micro and micro % n:
      raise ValueError(f'Li2SAO: micro_batch={micro} must be a multiple of the group size {n}')
    self.settings = settings
    self.seed = seed
    self.gate = SwitchGate(settings.gate)
    self.source = (inflight.InflightSource(rt, settings.inflight, seed, n, settings.trajectories)
                   if settings.inflight else None)

  def state_dict(self) -> dict:
    return {'gate': self.gate.state_dict()}

  def load_state_dict(self, data: dict) -> None:
    self.gate.load_state_dict(data['gate'])

  def close(self) -> None:
    if self.source is not None:
      self.source.close()

  def group_size(self) -> int:
    """The group size of the next generation request."""
    return 1 if self.gate.switched else self.settings.responses_per_problem

  def rollouts(self, rt: Runtime, state, step: int, key: jax.Array, timer: timing.PhaseTimer
               ) -> tuple[value_steps.Rollouts, int, dict]:
    """A batch of `trajectories` judged rows with the critic's reads; its group size; the
    in-flight rollout metrics ({} when synchronous)."""
    s, n = self.settings, self.group_size()
    if self.source is not None:
      # The batch's own group size may still be n_b right after the switch (prefetched).
      data, n, metrics = self.source.take(state, step, timer, next_group_size=n)
    else:
      request = value_steps.RolloutSettings(problems_per_step=s.trajectories // n,
                                            responses_per_problem=n,
                                            response_budget=s.response_budget)
      data = value_steps.sample(rt, state.params, request, self.seed, 'li2sao_problems', step,
                                key, timer)
      metrics = {}
    value_steps.read(rt, state, data, timer)
    return data, n, metrics

  def step(self, rt: Runtime, state, step: int, key: jax.Array):
    s = self.settings
    timer = timing.PhaseTimer()
    data, n, rollout_metrics = self.rollouts(rt, state, step, key, timer)
    boot = None
    if n > 1:
      boot = bootstrap(data, n, s.eps)
      targets, masks = boot.targets, boot.masks
    else:
      advantages, targets = lisao.sao_advantages(data, s.gamma, s.lambda_alpha)
      for row, adv in zip(data.rows, advantages):
        row.advantages_N = adv
      masks = lisao.model_masks(data)
    groups = np.arange(len(data.rows)) // n
    state, device = lisao.actor_critic_updates(rt, state, s, data, targets, masks, timer,
                                               warmup=False, groups=groups)
    if self.source is not None:
      rollout_metrics.update(self.source.publish(state, step, timer))
    if boot is not None:
      self.gate.observe(step, boot.explained_variance, boot.ranking_accuracy)
    kept = np.concatenate(masks)
    g = self.gate
    return state, value_steps.step_metrics(
        data, device, timer, entropy=value_steps.entropy(data), **lisao.advantage_metrics(data),
        **rollout_metrics, **{'li2sao/group_size': n, 'li2sao/problems': len(data.rows) // n,
           'li2sao/switched': float(g.switched), 'li2sao/switch_step': g.switch_step,
           'li2sao/explained_variance': boot.explained_variance if boot else None,
           'li2sao/ranking_accuracy': boot.ranking_accuracy if boot else None,
           'li2sao/mixed_groups': boot.mixed_fraction if boot else None,
           'li2sao/ema_explained_variance': g.ema_explained_variance,
           'li2sao/ema_ranking_accuracy': g.ema_ranking_accuracy,
           'li2sao/ready_counter': g.counter, 'li2sao/critic_token_fraction': float(kept.mean())})
