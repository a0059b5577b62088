"""PACT (policy-aligned critic training): a separate sigmoid value critic trained with soft BCE
after the actor, on ratio-corrected targets; the actor takes DIS steps on A_t = R - V^(s_t).

Order per step: roll out with pi_k (log-probs stored); V^(s_t) from the critic; B actor steps
(`actor.minibatches`); one forward of pi_{k+1} gives rho_t, the mask 0 <= rho_t <= pact.max_ratio
and the targets rho_t R; B critic steps. DIS band `pact.dis_low`..`pact.dis_high`.

CPU, built-in task, `tiny` model (SFT warm start included):
  python launch/tpu_run.py --config=configs/pact.py --workdir=/tmp/pact_run
Expected: the validation score at the end above the SFT starting score. NOT YET MEASURED over a
whole run.
Paper scale (Qwen3-4B; PACT's actor lr 1e-6, critic lr 5e-6):
  python launch/tpu_run.py --config=configs/pact.py:qwen3_4b --workdir=... (flags of configs/ac2.py)

Arguments: `qwen3_4b`, `walk` (the built-in walk task instead of the chain; ac2_jax/tasks/walk.py),
`bench` (the benchmark setting of launch/compare.py; ac2_jax/train/bench_setting.py), `frozen`
(the critic's attention frozen).
"""

from ac2_jax.train import defaults

ARGUMENTS = defaults.SHARED_ARGUMENTS + ('frozen',)


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'pact'
  parts = [p for p in arg.split(',') if p]
  unknown = set(parts) - set(ARGUMENTS)
  if unknown:
    raise ValueError(f'unknown PACT config arguments {sorted(unknown)}; known: {ARGUMENTS}')
  c = defaults.apply_shared_arguments(c, parts)
  if 'qwen3_4b' in parts:
    c.actor.learning_rate = 1e-6
  if 'frozen' in parts:
    c.value_critic.freeze_attention = True
  return c
