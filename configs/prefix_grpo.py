"""Prefix GRPO: AC2's replay buffer and prefix cuts, but g full continuations per prefix and GRPO
advantages from terminal rewards; no critic.

CPU, built-in task, `tiny` model (SFT warm start included):
  python launch/tpu_run.py --config=configs/prefix_grpo.py --workdir=/tmp/prefix_grpo_run
Paper scale: `--config=configs/prefix_grpo.py:qwen3_4b` with the flags of configs/ac2.py.
"""

from ac2_jax.train import defaults


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'prefix_grpo'
  parts = [p for p in arg.split(',') if p]
  if 'qwen3_4b' in parts:
    c = defaults.paper_scale(c)
  unknown = set(parts) - {'qwen3_4b', 'tiny', 'cpu'}
  if unknown:
    raise ValueError(f'unknown Prefix GRPO config arguments {sorted(unknown)}')
  return c
