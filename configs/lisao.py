"""LiSAO (single-rollout optimisation, SAO without value pretraining): one response per problem,
a separate value-head critic (the policy's weights with a scalar head, attention frozen, K = 2
critic updates per actor minibatch, 10 critic-only warm-up steps), skip-observation GAE with the
per-trajectory lambda = clamp(1 - 1 / (1.5 L), 0, 1), lambda = 1 return targets, and the DIS actor
loss on the log-probabilities stored at sampling (band lisao.dis_low..dis_high).

Synchronous by default (each step samples, then trains); `async`: a rollout worker thread
generates the next batch while a step trains (rollout.*: in-flight weight updates between segments
of rollout.segment_tokens, samples more than rollout.max_policy_lag versions old dropped;
rollout.devices local devices per process form the worker's rollout sub-mesh, required on several
processes).

CPU, built-in task, `tiny` model (SFT warm start included):
  python launch/tpu_run.py --config=configs/lisao.py --workdir=/tmp/lisao_run
Expected: the validation score at the end above the SFT starting score. Measured (one seed, 20
steps from the seed-0 warm start, 2 cores at load 5-7; BENCHMARKS.md): 0.482 -> 0.572, median step
16 s in the critic warm-up and 24 s after (128 single responses per step: about the sampling cost
of a GRPO step).
Paper scale (Qwen3-4B; critic lr 5e-6, 128 trajectories per update):
  python launch/tpu_run.py --config=configs/lisao.py:qwen3_4b --workdir=... \
    --config.model.init_checkpoint=... --config.task.proofs_train_dir=... \
    --config.task.proofs_validation_dir=... --config.judge.base_url=...

Arguments (combinable with commas): `qwen3_4b` (paper scale, defaults.paper_scale), `walk`
(the built-in walk task instead of the chain; ac2_jax/tasks/walk.py), `bench` (the
benchmark setting of launch/compare.py; ac2_jax/train/bench_setting.py), `async` (the
in-flight rollout worker; measured in two sync/async pairs, one seed, 20 steps, 2 cores shared:
0.482 -> 0.567 and 0.558; 243 trained tokens per second of step time against 356 for `sync` (load
5-11), and 425 against 536 (load 2-7): slower on 2 cores, where the worker and the updates share the
cores).
"""

from ac2_jax.train import defaults

ARGUMENTS = defaults.SHARED_ARGUMENTS + ('async',)


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'lisao'
  parts = [p for p in arg.split(',') if p]
  unknown = set(parts) - set(ARGUMENTS)
  if unknown:
    raise ValueError(f'unknown LiSAO config arguments {sorted(unknown)}; known: {ARGUMENTS}')
  c = defaults.apply_shared_arguments(c, parts)
  if 'async' in parts:
    c.rollout.mode = 'async'
  c.value_critic.freeze_attention = True  # MLP blocks, final norm and head train (SAO)
  c.value_critic.updates = 2              # K critic updates per actor minibatch
  c.value_critic.warmup_steps = 10        # the actor waits while the critic warms up
  return c
