"""The stages PPO with GAE, PACT, LiSAO and Li2SAO share: fresh rollouts scored by the judge,
V(s_t) reads of the separate value critic before any update, the critic updates and the critic's
metrics (GRPO samples its synchronous batches with `sample` too).

  sample      problems_per_step fresh problems x responses_per_problem full responses, judged
  read        V(s_t) on every generated token, from the critic as it was before this step
  (the algorithm: advantages, actor minibatches, critic targets)
  critic      K critic updates per actor minibatch, on that minibatch's rows
  metrics     the critic's error and explained variance against the terminal reward R (from the
              reads before the update: how well it predicted data it had not seen)
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ac2_jax.algorithms import base
from ac2_jax.algorithms import timing
from ac2_jax.controller import rng as rng_lib
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import value_rows
from ac2_jax.learner.runtime import Runtime


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
  problems_per_step: int = 16
  responses_per_problem: int = 8
  response_budget: int = 50_000
  critic_updates: int = 1       # K critic updates per actor minibatch update
  critic_warmup_steps: int = 0  # first steps that train the critic only

  def __post_init__(self):
    for name in ('problems_per_step', 'responses_per_problem', 'response_budget',
                 'critic_updates'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
    if self.critic_warmup_steps < 0:
      raise ValueError(f'critic_warmup_steps must be >= 0, got {self.critic_warmup_steps}')


@dataclasses.dataclass
class Rollouts:
  """One step's rows (every one in the loss), their rewards and the critic's reads."""
  rows: list[rows_lib.Row]
  rewards_R: np.ndarray
  judge_failures: int
  decoding_flops: float
  values: list[np.ndarray] = dataclasses.field(default_factory=list)  # V(s_t) per row

  def padded(self, per_row: list[np.ndarray], width: int | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """(x_RxN, mask_RxN): per-row arrays right-padded to the longest row (or to `width`)."""
    n = width or max(len(x) for x in per_row)
    x_RxN = np.zeros((len(per_row), n), np.float32)
    mask_RxN = np.zeros((len(per_row), n), np.float32)
    for i, x in enumerate(per_row):
      x_RxN[i, :len(x)] = x
      mask_RxN[i, :len(x)] = 1.0
    return x_RxN, mask_RxN


def check_setup(rt: Runtime, name: str, s: RolloutSettings) -> None:
  """What a value-critic algorithm needs of its runtime and its training problems."""
  if rt.value_step is None:
    raise ValueError(f'{name} needs the value critic: build the runtime with value_settings')
  if s.problems_per_step > len(rt.train_records):
    raise ValueError(f'{name}: problems_per_step={s.problems_per_step} exceeds the '
                     f'{len(rt.train_records)} training problems')


def sample(rt: Runtime, params, s: RolloutSettings, seed: int, purpose: str, step: int,
           key: jax.Array, timer: timing.PhaseTimer) -> Rollouts:
  rng = rng_lib.generator(seed, purpose, step)
  problems = rng.choice(len(rt.train_records), size=s.problems_per_step, replace=False)
  pidx = np.repeat(problems, s.responses_per_problem)
  n = len(pidx)
  with timer('generate'):
    rows, flops = rows_lib.generate_rows(rt, params, [rt.train_prompts[p] for p in pidx],
                                         [0] * n, pidx, [s.response_budget] * n,
                                         [s.response_budget] * n, key, rt.train_sampling)
  texts = rows_lib.response_texts(rt, rows)
  with timer('judge'):
    grades = rt.task.score_batch([rt.train_records[p] for p in pidx], texts)
  for row in rows:
    row.weight = 1.0
  rewards_R = np.array([g.reward for g in grades], np.float32)
  return Rollouts(rows, rewards_R, sum(not g.valid for g in grades), float(np.sum(flops)))


def read(rt: Runtime, state, data: Rollouts, timer: timing.PhaseTimer) -> None:
  with timer('value_reads'):
    data.values = value_rows.read_values(rt, state.value_params, data.rows)


def critic_updates(rt: Runtime, state, s: RolloutSettings, data: Rollouts, minibatch: int,
                   targets, masks, groups=None) -> tuple:
  """K critic updates on one minibatch; returns (state, list of device metrics). `groups` (a
  group id per row) turns on the ranking term's pairs (Li2SAO)."""
  ranked = {} if groups is None else {'groups': groups, 'rewards': data.rewards_R}
  metrics = []
  for _ in range(s.critic_updates):
    state, m = timing.ready(value_rows.train_value(rt, state, data.rows, targets, masks,
                                                   data.values, minibatch, **ranked))
    metrics.append(m)
  return state, metrics


def mean_update_metrics(host_list: list[dict]) -> dict:
  """Means over several updates' host metrics (`skipped` summed: updates that were skipped), and
  how many updates there were."""
  keys = sorted({k for m in host_list for k in m})
  out = {'updates': len(host_list)}
  for k in keys:
    xs = [m[k] for m in host_list if k in m]
    out[k] = float(np.sum(xs)) if k.startswith('skipped') else float(np.mean(xs))
  return out


def critic_fit(data: Rollouts) -> dict:
  """Token-level |V(s_t) - R| and explained variance 1 - Var(R - V) / Var(R) (None when every
  reward is equal), from the reads before this step's updates."""
  v = np.concatenate(data.values)
  r = np.concatenate([np.full(len(x), rew, np.float32)
                      for x, rew in zip(data.values, data.rewards_R)])
  var = float(np.var(r))
  return {'critic_error': float(np.mean(np.abs(v - r))),
          'critic/explained_variance': 1.0 - float(np.var(r - v)) / var if var > 0 else None,
          'critic/value_mean': float(np.mean(v))}


def entropy(data: Rollouts) -> float:
  return float(np.mean(np.concatenate([r.entropies_N for r in data.rows])))


def step_metrics(data: Rollouts, device: dict, timer: timing.PhaseTimer, **extra) -> dict:
  """The metrics every value-critic algorithm writes; `device` maps a prefix ('actor1', 'critic',
  ...) to a device metrics dict or a list of them (averaged)."""
  host = base.host_metrics(device)
  out = {
      'reward/judged_mean': float(data.rewards_R.mean()),
      'judge_failures': data.judge_failures,
      'rows_trained': len(data.rows),
      'tokens_generated': int(sum(len(r.new_N) for r in data.rows)),
      'decoding_flops': data.decoding_flops,
      **critic_fit(data),
      **extra,
  }
  for prefix, metrics in host.items():
    if isinstance(metrics, list):
      metrics = mean_update_metrics(metrics)
    out.update({f'{prefix}/{k}': v for k, v in metrics.items()})
  return {**out, **timer.metrics()}
