"""PPO with a learned critic and GAE(lambda, gamma): a separate value-head critic (the policy's
architecture and weights, or value_critic.init_checkpoint's, with a scalar head), clipped value
loss, dual-clip policy loss.

CPU, built-in task, `tiny` model (SFT warm start included):
  python launch/tpu_run.py --config=configs/ppo.py --workdir=/tmp/ppo_run
Expected: the validation score at the end above the SFT starting score (step 0). Measured once
(seed 0, 20 steps, BENCHMARKS.md): 0.482 -> 0.541; the default 60 steps were not run.
Paper scale (Qwen3-4B, the flags of configs/ac2.py; docs/tpu.md gives the memory):
  python launch/tpu_run.py --config=configs/ppo.py:qwen3_4b --workdir=... \
    --config.model.init_checkpoint=... --config.task.proofs_train_dir=... \
    --config.task.proofs_validation_dir=... --config.judge.base_url=...

Arguments (combinable with commas):
  lambda1   GAE lambda = 1: A_t = R - V(s_t) on every model token (gamma stays 1)
  frozen    the critic trains its MLP blocks, final norm and head only (attention frozen, as SAO's)
  walk      the built-in walk task instead of the chain
  bench     the benchmark setting of launch/compare.py (ac2_jax/train/bench_setting.py)
  qwen3_4b  paper scale (defaults.paper_scale)
"""

from ac2_jax.train import defaults

ARGUMENTS = defaults.SHARED_ARGUMENTS + ('lambda1', 'frozen')


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'ppo'
  parts = [p for p in arg.split(',') if p]
  unknown = set(parts) - set(ARGUMENTS)
  if unknown:
    raise ValueError(f'unknown PPO config arguments {sorted(unknown)}; known: {ARGUMENTS}')
  c = defaults.apply_shared_arguments(c, parts)
  if 'lambda1' in parts:
    c.ppo.lam = 1.0
  if 'frozen' in parts:
    c.value_critic.freeze_attention = True
  return c
