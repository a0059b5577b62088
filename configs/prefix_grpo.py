"""Prefix GRPO: AC2's replay buffer and prefix cuts, but g full continuations per prefix and GRPO
advantages from terminal rewards; no critic.

CPU, built-in task, `tiny` model (SFT warm start included):
  python launch/tpu_run.py --config=configs/prefix_grpo.py --workdir=/tmp/prefix_grpo_run
Paper scale: `--config=configs/prefix_grpo.py:qwen3_4b` with the flags of configs/ac2.py.
Argument `walk`: the built-in walk task instead of the chain (ac2_jax/tasks/walk.py;
defaults.walk_task).
Argument `bench`: the benchmark setting of launch/compare.py (ac2_jax/train/bench_setting.py).
Arguments `uncredited`, `at_uncredited`: AC2's variants of the same names (configs/ac2.py), cuts
at or before (at) a trajectory's first uncredited line; its chunk switch is unused here.
"""

from ac2_jax.train import defaults


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'prefix_grpo'
  parts = [p for p in arg.split(',') if p]
  c = defaults.apply_shared_arguments(c, parts)
  unknown = set(parts) - set(defaults.SHARED_ARGUMENTS) - set(defaults.UNCREDITED_ARGUMENTS)
  if unknown:
    raise ValueError(f'unknown Prefix GRPO config arguments {sorted(unknown)}')
  for part in parts:
    if part in defaults.UNCREDITED_ARGUMENTS:
      defaults.apply_uncredited(c, part)
  return c
