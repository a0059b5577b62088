"""GRPO: fresh problems, g full responses each, A_i = R_i - mean_j R_j (optionally / std) on every token."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ac2_jax.algorithms import base
from ac2_jax.algorithms import timing
from ac2_jax.controller import rng as rng_lib
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

  def state_dict(self) -> dict:
    return {'entropy': self.entropy.state_dict()}

  def load_state_dict(self, data: dict) -> None:
    self.entropy.load_state_dict(data['entropy'])

  def step(self, rt: Runtime, state, step: int, key: jax.Array):
    s = self.settings
    rng = rng_lib.generator(self.seed, 'grpo_problems', step)
    problems = rng.choice(len(rt.train_records), size=s.problems_per_step, replace=False)
    pidx = np.repeat(problems, s.group_size)
    n = len(pidx)
    timer = timing.PhaseTimer()
    with timer('generate'):
      rows, flops = rows_lib.generate_rows(rt, state.params, [rt.train_prompts[p] for p in pidx],
                                           [0] * n, pidx, [s.response_budget] * n,
                                           [s.response_budget] * n, key, rt.train_sampling)
    texts = rows_lib.response_texts(rt, rows)
    with timer('judge'):
      grades = rt.task.score_batch([rt.train_records[p] for p in pidx], texts)
    rewards_NxG = np.array([g.reward for g in grades], np.float32).reshape(-1, s.group_size)
    adv_NxG = np.asarray(adv_lib.grpo_advantages(rewards_NxG, normalize_std=s.normalize_std))
    for row, a in zip(rows, adv_NxG.reshape(-1)):
      row.advantage, row.weight = float(a), 1.0

    entropy = float(np.mean(np.concatenate([r.entropies_N for r in rows])))
    eps_high = self.entropy.update(entropy)
    with timer('actor_updates'):
      state, m1 = timing.ready(rows_lib.train_actor(rt, state, rows, eps_high, 0))
      state, m2 = timing.ready(rows_lib.train_actor(rt, state, rows, eps_high, 1))
    host = base.host_metrics({'actor1': m1, 'actor2': m2})
    metrics = {
        'entropy': entropy, 'eps_high': eps_high,
        'reward/judged_mean': float(rewards_NxG.mean()),
        'grpo/zero_variance_groups': adv_lib.zero_variance_share(rewards_NxG),
        'judge_failures': sum(not g.valid for g in grades),
        'adv/abs_mean': float(np.abs(adv_NxG).mean()),
        'rows_trained': len(rows),
        'tokens_generated': int(sum(len(r.new_N) for r in rows)),
        'decoding_flops': flops,
        **{f'{part}/{k}': v for part in ('actor1', 'actor2') for k, v in host[part].items()},
        **timer.metrics(),
    }
    return state, metrics
