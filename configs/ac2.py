"""AC2 (Actor-Critic with Action Chunking).

CPU, built-in task, `tiny` model (SFT warm start included; measured about 14 minutes on a shared
2-core machine, session 3, seed 0: SFT 325 s, 60 RL steps 509 s at a median 7.3 s, the rest data,
tokenizer, compiles and evaluations):
  python launch/tpu_run.py --config=configs/ac2.py --workdir=/tmp/ac2_run
Expected: the validation score printed at the end is above the SFT starting score (step 0). Measured
on one seed only (seed 0; scores are mean points / 7 under the task's default 'local' scoring):
0.482 -> 0.585 (step 20) -> 0.610 (step 40) -> 0.629 (step 60); Prefix GRPO from the same warm start
0.482 -> 0.579 -> 0.607 -> 0.652. Problems become ready from step 6 (83 by step 60: the critic's
error, 0.07-0.10, is under both thresholds), but a ready problem is rarely replayed again (20,000
training problems, a 64-trajectory buffer refreshed by 16 per step), so only 3% of the replay slots
of the second half were ready and 0.5% of all rows were critic-scored chunks. The critic probe
(`launch/bench.py critic`, BENCHMARKS.md) shows why readiness alone proves little here: the tiny
critic's reads do not discriminate prefixes (chunk-advantage correlation 0.01-0.07 against 0.39
in the paper), while a constant is within tau_local of 96% of the labels.

CPU departures from Table 4 (each a key in ac2_jax/train/defaults.py, with its reason there): the
critic's value read as the expectation over the grid tokens (critic.readout), a short critic
instruction (task.builtin_critic_prompt), cuts at most 0.8 of the response
(controller.max_cut_fraction), the critic learning-rate floor, and the scaled token counts.

Paper scale (AC2 paper, Table 4): Qwen3-4B on a TPU pod slice (or GPUs), FineProofs-RL training,
IMO-ProofBench validation, an OpenAI-compatible judge; see docs/tpu.md and docs/gpu.md:
  python launch/tpu_run.py --config=configs/ac2.py:qwen3_4b --workdir=gs://.../ac2 \
    --config.model.init_checkpoint=/ckpt/Qwen3-4B-Thinking-2507 \
    --config.task.proofs_train_dir=/data/fineproofs --config.task.proofs_validation_dir=/data/imo \
    --config.judge.base_url=http://judge:8000/v1 --config.judge.model=gpt-oss-120b

Benchmark setting (launch/compare.py; UNMEASURED until the lead measures it, see
ac2_jax/train/bench_setting.py): `--config=configs/ac2.py:bench`, combinable with the variants.

Variants (config arguments, combinable with commas, e.g. `qwen3_4b,no_audit`):
  no_audit            no audited full rollouts of ready problems (alpha = 0)
  group1              group size 1: single chunks from distinct cuts, A = v - V(s)
  stale_buffer        collect n_refill x 10 rollouts every 10 steps as the whole buffer
  correct_only        only passing rollouts enter the replay buffer
  chunk_small         chunk b and cut grid at 1/5 (2k instead of 10k tokens at paper scale)
  no_local_readiness  every problem becomes ready once the global test passes
  no_reference        the critic never sees a reference solution
"""

from ac2_jax.train import bench_setting, defaults

VARIANTS = ('no_audit', 'group1', 'stale_buffer', 'correct_only', 'chunk_small',
            'no_local_readiness', 'no_reference')


def apply_variant(c, name: str):
  """Switches one AC2 variant on (shared by the AC2 config arguments)."""
  if name == 'no_audit':
    c.controller.no_audit = True
  elif name == 'group1':
    c.controller.group_size_one = True
  elif name == 'stale_buffer':
    c.controller.stale_buffer = True
  elif name == 'correct_only':
    c.controller.correct_only = True
  elif name == 'chunk_small':
    c.controller.chunk_size = max(1, c.controller.chunk_size // 5)
    c.controller.cut_grid = max(1, c.controller.cut_grid // 5)
  elif name == 'no_local_readiness':
    c.controller.no_local_readiness = True
  elif name == 'no_reference':
    c.controller.no_reference = True
  else:
    raise ValueError(f'unknown AC2 variant {name!r}; known: {", ".join(VARIANTS)}')


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'ac2'
  parts = [p for p in arg.split(',') if p]
  if 'qwen3_4b' in parts:
    c = defaults.paper_scale(c)
    parts.remove('qwen3_4b')
  if 'bench' in parts:
    c = bench_setting.apply_bench(c)
    parts.remove('bench')
  # chunk_small scales from the chosen size, so it applies after qwen3_4b.
  for part in parts:
    if part not in ('', 'tiny', 'cpu'):
      apply_variant(c, part)
  return c
