"""Li2SAO: group-relative actor-critic bootstrapping, then a one-way switch to LiSAO.

Bootstrap (groups of li2sao.group_size = 8, actor and critic from step 1): actor advantages
(R - mu_g) / (sigma_g + eps); the critic (the policy's weights with a scalar head, attention
frozen, K = 2 updates per actor minibatch) fits the group residuals R - mu_g on the divergence mask
with the clipped loss plus li2sao.rank_coef x the terminal ranking hinge. Readiness: EMAs of the
residual explained variance and the pair-ordering accuracy; the gate opens after
li2sao.ready_steps ready steps from li2sao.min_steps on, or at li2sao.max_steps. Then one response
per problem for problems_per_step x group_size problems (the same trajectories per update),
LiSAO's GAE with the per-trajectory lambda and absolute return targets. DIS actor loss throughout.

Synchronous by default (each step samples, then trains), so the first step after the gate opens
samples single responses; `async`: a rollout worker thread generates the next batch while a step
trains (rollout.*; rollout.devices local devices per process form its rollout sub-mesh, required
on several processes), and the batch prefetched when the gate opens is still trained as groups, its
leftovers dropped, before single responses follow.

CPU, built-in task, `tiny` model (SFT warm start included):
  python launch/tpu_run.py --config=configs/li2sao.py --workdir=/tmp/li2sao_run
Expected: the validation score at the end above the SFT starting score, the switch by step 40
(`li2sao/switch_step` in metrics.jsonl). Measured over 20 steps only (one seed, from the seed-0 warm
start, 2 cores at load 5-7; BENCHMARKS.md): 0.482 -> 0.581, median step 24 s, no switch by step 20
(EMAs of explained variance 0.03 and ranking accuracy 0.45 against 0.2 and 0.65), so the switch
itself and the phase after it are not yet measured over a run.
Paper scale (Qwen3-4B; 16 x 8 then 128 x 1, T_min 60, T_max 150, critic lr 5e-6):
  python launch/tpu_run.py --config=configs/li2sao.py:qwen3_4b --workdir=... (flags of
  configs/lisao.py)

Arguments (combinable with commas): `qwen3_4b` (paper scale, defaults.paper_scale), `walk`
(the built-in walk task instead of the chain; ac2_jax/tasks/walk.py), `bench` (the
benchmark setting of launch/compare.py; ac2_jax/train/bench_setting.py), `async` (the
in-flight rollout worker; not run for Li2SAO; for LiSAO on 2 cores it was slower per trained token
than `sync`, see configs/lisao.py).
"""

from ac2_jax.train import defaults

ARGUMENTS = defaults.SHARED_ARGUMENTS + ('async',)


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'li2sao'
  parts = [p for p in arg.split(',') if p]
  unknown = set(parts) - set(ARGUMENTS)
  if unknown:
    raise ValueError(f'unknown Li2SAO config arguments {sorted(unknown)}; known: {ARGUMENTS}')
  c = defaults.apply_shared_arguments(c, parts)
  if 'async' in parts:
    c.rollout.mode = 'async'
  c.value_critic.freeze_attention = True  # MLP blocks, final norm and head train (SAO)
  c.value_critic.updates = 2              # K critic updates per actor minibatch
  c.value_critic.warmup_steps = 0         # the bootstrap needs no critic-only warm-up
  return c
