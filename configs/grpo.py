"""GRPO: fresh problems, g full responses each, group-mean baseline on the terminal reward.

CPU, built-in task, `tiny` model (SFT warm start included):
  python launch/tpu_run.py --config=configs/grpo.py --workdir=/tmp/grpo_run
Paper scale (256 problems x 16 responses per step, Qwen3-4B; see docs/tpu.md):
  python launch/tpu_run.py --config=configs/grpo.py:qwen3_4b --workdir=... \
    --config.model.init_checkpoint=... --config.task.proofs_train_dir=... \
    --config.task.proofs_validation_dir=... --config.judge.base_url=...
Argument `std` divides advantages by the group's standard deviation.
Argument `walk`: the built-in walk task instead of the chain (ac2_jax/tasks/walk.py;
defaults.walk_task).
Argument `bench`: the benchmark setting of launch/compare.py (ac2_jax/train/bench_setting.py: warm
starts 0.25-0.34 on seeds 0-2, GRPO still rising after step 40, peaks 0.73-0.81 in 80 steps).
Argument `async`: in-flight asynchronous rollouts (rollout.*; algorithms/inflight.py): a worker
thread generates the next batch of groups while a step trains; the PPO-clipped ratio is taken
against each token's log-probability stored when it was sampled. UNMEASURED (one-step smoke test
only).
"""

from ac2_jax.train import defaults


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'grpo'
  parts = [p for p in arg.split(',') if p]
  c = defaults.apply_shared_arguments(c, parts)
  if 'std' in parts:
    c.grpo.normalize_std = True
  if 'async' in parts:
    c.rollout.mode = 'async'
  unknown = set(parts) - {*defaults.SHARED_ARGUMENTS, 'std', 'async'}
  if unknown:
    raise ValueError(f'unknown GRPO config arguments {sorted(unknown)}')
  return c
