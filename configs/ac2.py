"""AC2 (Actor-Critic with Action Chunking).

CPU, built-in task, `tiny` model: the README's main command, the `bench` setting (a warm start that scores
0.25-0.34 on seeds 0-2 on the machine it was calibrated on, learning still going at step 80) with the critic
adapter (SFT warm start included; 13 min 20 s on an idle 2-core machine, seed 0; 19 min 0 s on session 13's
slower one, where seed 0's warm start scored 0.46, not 0.26):
  python launch/tpu_run.py --config=configs/ac2.py:bench,adapter --workdir=/tmp/ac2_run
Measured on seeds 0, 1 and 2 (BENCHMARKS.md, "AC2 against GRPO on the `bench` setting"): validation
0.26-0.34 -> 0.67-0.71 in 80 steps; problems ready from step 5, 0.78-0.84 of the second half's replay slots
ready, 41-46% of all rows critic-scored chunks; GRPO from the same warm starts needs 0.95-1.08x AC2's
decoding FLOPs to reach AC2's final score (level), and ends higher (0.73-0.81 in 80 steps, at 1.7x AC2's
FLOPs), as does Prefix GRPO (0.72-0.81). Without `adapter` (the paper's critic, whose update trains the
shared weights) AC2 ends 0.03-0.05 lower on every seed (0.64-0.66) and GRPO needs only 0.64-0.86x its FLOPs.
What the run does not show: a critic that judges. From step 40 it reads about 0.43 (sd under 0.01) for every
prefix and chunk end while the policy scores about 0.65, so ready groups' chunk advantages are about 0. Readiness
still passes, because a ready group's target is the mean of the critic's own chunk-end values (ALGORITHMS.md,
AC2 items 5-6): `critic_error` is 0.12 where the audited error is 0.22 (BENCHMARKS.md, "What the ready critic
does").
With `warmup` (session 18, seed 0, a warm start of 0.46 on that machine) the critic first learns exact
corpus values for 33,000 pairs: it then reads a first line at corr 0.95, 1-4 lines at 0.23, the policy's own
prefixes not at all (0.08); AC2 went 0.46 -> 0.94 (0.93 without the warm-up), ready from step 5, against
Prefix GRPO's 0.97 on the same FLOPs (BENCHMARKS.md, "Session 18"). Since session 19 the variant trains
two-hot targets (critic.target): a first line at 0.99-1.00 (MAE 0.003-0.009) and 1-2 lines at 0.58-0.74
on two draws of prefixes, where rounded targets reach 0.76-0.95 and 0.39-0.47; 1-4 lines 0.36, any cut 0.06,
and the policy's own prefixes still not at all. In the README run two-hot targets alone change nothing
(seed 0: 0.935 against 0.930; BENCHMARKS.md, "Session 19").
With `self_check` (session 21) the critic judges: each worked line of the attempt is marked with whether the
policy's own greedy result there is the one written (critic.self_check), and after its 9,000-pair warm-up it
reads the policy's own prefixes at corr +0.78 and their chunk advantages at +0.50 (a lookup of the lines:
+0.79 and +0.46), where every critic before it stayed near 0. In the run
(`configs/ac2.py:bench,adapter,self_check`; the warm-up took 12 minutes on 2 cores shared with another
run) problems were ready from step 5 on seeds 0 and 1. On seed 0 0.88 of the second half's slots were
ready, 48% of all rows critic-scored chunks, critic error 0.07, no invalid read, and the score is level
with Prefix GRPO per decoding FLOP, not ahead (0.46 -> 0.91; Prefix GRPO 0.97 on 1.5x the FLOPs). On seed 1
the policy reached 0.95 by step 20 and the critic trailed it (error 0.34-0.57 from step 16 to 56), 0.41 of
the second half ready, 0.50 -> 0.99 as Prefix GRPO (BENCHMARKS.md, "Session 21").
Under leading-line credit from a sharper warm start (`--config.task.builtin_scoring=leading
--config.sft.step_mistake_rate=0.3`; seed 0's warm start scores 0.23) the self-checking AC2 led GRPO by
0.98-1.39x per decoding FLOP up to step 50, then stopped at 0.93 while GRPO reached 0.99: late in the run
its chunks are clean and their advantages about a fifth the size of the audited ones (BENCHMARKS.md,
"Session 22").

The default setting (`--config=configs/ac2.py`: K = 8 steps, '+-', step mistakes 0.25) trains fast but its
warm start is on a knife edge between seeds (seed 0 0.48 -> 0.60, seed 2 0.79 -> 1.00, seed 1 starts at
0.003: its SFT never learns the arithmetic in 560 steps; session 4, BENCHMARKS.md).

CPU departures from Table 4 (each a key in ac2_jax/train/defaults.py, with its reason there): the
critic's value read as the expectation over the grid tokens (critic.readout), a short critic
instruction (task.builtin_critic_prompt), cuts at most 0.8 of the response
(controller.max_cut_fraction), a pool of 256 training problems that come back within the run
(task.rl_problems), the reference bank seeded from the data set (controller.bank_from_data), the
critic learning-rate floor, and the scaled token counts; with the `adapter` variant, the critic's
low-rank adapter (critic.adapter_rank: on the 1.1M-parameter policy the critic's updates of the shared
weights slow the actor).

Paper scale (AC2 paper, Table 4): Qwen3-4B on a TPU pod slice (or GPUs), FineProofs-RL training,
IMO-ProofBench validation, an OpenAI-compatible judge; see docs/tpu.md and docs/gpu.md:
  python launch/tpu_run.py --config=configs/ac2.py:qwen3_4b --workdir=gs://.../ac2 \
    --config.model.init_checkpoint=/ckpt/Qwen3-4B-Thinking-2507 \
    --config.task.proofs_train_dir=/data/fineproofs --config.task.proofs_validation_dir=/data/imo \
    --config.judge.base_url=http://judge:8000/v1 --config.judge.model=gpt-oss-120b

The walk (ac2_jax/tasks/walk.py: a built-in task whose prefix value is the state its last line
wrote, so the critic can read it; BENCHMARKS.md, "The walk"): `--config=configs/ac2.py:walk`,
combinable with the variants. Measured on seeds 0, 1 and 2 (sessions 6-7; about 20-40 minutes of RL
after a 20-30 minute SFT on a shared 2-core machine): 0.53 -> 0.87, 0.52 -> 0.84 and 0.60 -> 0.69 (Prefix
GRPO from the same warm starts 0.85, 0.89 and 0.88) with 12-16% fewer decoding FLOPs; problems ready from
step 30-36, ready fraction 0.55-0.79 over the second half; the warm start's critic reads the policy's own
prefixes at corr 0.64 and chunk advantages at 0.41 (launch/bench.py critic). Both methods saturate by
step 20 (the policy's token entropy falls to 0.01-0.04 and 67-79% of replay groups have equal rewards), and
AC2's score falls after step 20 on every seed while its critic trails the sharpening policy. Two levers
for the walk's warm start, off by default (BENCHMARKS.md, "The walk, session 7"):
sft.critic_value_mistake_rate (critic examples valued by a sharper solver; did not make problems ready
sooner) and sft.blind_fraction (the corpus moves at random on a share of the numbers; the warm start
scores 0.35 at 0.4 with step mistakes 0.2, but RL finds those moves within 5-20 steps; in the chain
the same key makes the corpus write a share of the facts x op a at random, BENCHMARKS.md,
"Session 16"). With
`--config.actor.learning_rate=3e-5 --config.sampling.temperature=1.0` (seed 0, BENCHMARKS.md, "The
walk, session 8") problems are ready from step 5, yet AC2 ends at 0.77-0.85 against Prefix GRPO's
0.90: the critic's updates of the shared weights slow the actor (AC2 that is never ready ends where
AC2 does), and at a critic rate low enough not to, the critic falls behind and readiness stalls.

With the adapter and `--config.sampling.temperature=1.0 --config.actor.learning_rate=3e-5
--config.num_steps=60` (session 11, BENCHMARKS.md, "The walk with the critic adapter", seeds 0-2) AC2 learns
step for step with Prefix GRPO (0.47-0.60 -> 0.87-0.90 against 0.87-0.89) on 12-14% fewer decoding FLOPs and
is level with GRPO per FLOP; problems ready from step 5-13, ready fraction 0.34-0.42 over the second half.
Why readiness stalls (session 12, BENCHMARKS.md, seeds 0 and 1): the critic's updates do not make it rank
prefixes better than the warm start did (`launch/bench.py critic_drift`), and on seed 0 neither a 10x rate,
3x the pairs per update nor chunk-end pairs (controller.chunk_end_pairs, off by default) lowered its error on
new prefixes.

Late in the README run the policy sharpens (token entropy 0.03) and, with one critic update a step, the
critic's reads leave its value grid (session 13, seed 0: 778 invalid reads from step 63, audited error 0.76);
`--config.controller.critic_updates=2` kept every read valid (audited error 0.21) at +29% step time;
on seed 1 the reads broke with one update and with two (two shortened it: 277 invalid reads against 353 to
step 33), so it stays off (BENCHMARKS.md, "Session 13").

Benchmark setting (launch/compare.py; calibrated for the warm start and GRPO, see
ac2_jax/train/bench_setting.py; AC2, GRPO and Prefix GRPO on it over 3 seeds above):
`--config=configs/ac2.py:bench`, combinable with the variants.

Variants (config arguments, combinable with commas, e.g. `qwen3_4b,no_audit`):
  no_audit            no audited full rollouts of ready problems (alpha = 0)
  group1              group size 1: single chunks from distinct cuts, A = v - V(s)
  stale_buffer        collect n_refill x 10 rollouts every 10 steps as the whole buffer
  correct_only        only passing rollouts enter the replay buffer
  chunk_small         chunk b and cut grid at 1/5 (2k instead of 10k tokens at paper scale)
  no_local_readiness  every problem becomes ready once the global test passes
  no_reference        the critic never sees a reference solution
  adapter             the critic reads and trains through a rank-16 adapter of the policy's
                      weights (critic.adapter_rank), so its update leaves the actor alone
  revocable           a failed audit makes its problem unready again
                      (controller.readiness_revocable; the spec keeps ready problems forever)
  warmup              before RL the critic learns exact prefix values of the warm-start corpus,
                      cut after 1, 2, 4 lines, then anywhere (critic.warmup, train/critic_warmup.py;
                      at 1e-3 through the adapter, 3e-4 on the shared weights: the rates at which
                      the chain's critic learned its line check, BENCHMARKS.md "Session 17", "Session 18"),
                      on two-hot targets (critic.target: exact values crowd inside one grid cell, and
                      rounded they train one token; two-hot learned the check in 2/3 of the pairs,
                      BENCHMARKS.md "Session 19")
  self_check          the critic reads each worked line marked with the policy's own check, whether
                      its greedy result there is the one written (critic.self_check, a departure:
                      the critic never learned that check from its loss, BENCHMARKS.md "Session 20"),
                      after a warm-up of 9,000 exact prefix values cut anywhere, two-hot
  reference_check     the critic reads each worked line marked with whether it is the reference's
                      line (critic.reference_check, a departure standing in for a critic that can
                      compare an attempt with its reference, which the tiny one never learned:
                      BENCHMARKS.md "Session 13", "Session 20"; where the policy has facts to
                      learn, sft.blind_fraction, its self-check is a guess and this is not), after
                      self_check's warm-up, two-hot
  uncredited          built-in chain under a leading scoring: replayed prefixes end at or before
                      their trajectory's first uncredited line and ready chunks run at least through
                      it (controller.cut_before_uncredited, controller.chunk_through_uncredited;
                      BENCHMARKS.md "Session 26", "Session 27")
  at_uncredited       uncredited, and the prefix ends at that line's start itself, so every
                      continuation begins with the line the stored response's score turned on
                      (controller.cut_at_uncredited; it unlearned the chains on the one seed
                      measured, with a critic and without: BENCHMARKS.md "Session 27")
  audit_gate          ready chunks are critic-scored only while the audits show the critic ranks
                      them (chunk advantages correlated 0.3 or more with the Monte Carlo ones over
                      the last 5 steps of audits); until then every ready slot is audited
                      (controller.audit_gate, a departure: readiness tests accuracy only, which a
                      critic that answers one value per problem passes: BENCHMARKS.md "Session 28")
  judged_pairs        the critic trains only on judge-valued targets (unready groups, audits), not
                      on ready groups' means of its own chunk-end values
                      (controller.critic_judged_only, a departure; on seed 2 it kept the critic's
                      ranking at 0.24-0.55 where the paper's fell below 0, and the run from falling:
                      0.406 against 0.350 at step 60, BENCHMARKS.md "Session 29")
  audit_scale         ready chunks' critic advantages times the audits' slope of Monte Carlo on
                      critic advantages, in [1, 3] (controller.audit_scale, a departure: the
                      critic that ranks chunks moves its values about half as far as the rewards
                      move; with judged_pairs and audit_gate, peaks 0.428-0.497 on seeds 0-2
                      against the gate's 0.444-0.526: no gain, BENCHMARKS.md "Session 29")
  trained_refills     refills of problems whose chunks the critic scores now (ready, the gate open
                      under audit_gate) also train the actor, single, on r - V(s0)
                      (controller.train_refills, a departure: the paper never trains refills,
                      a sixth of AC2's decoded tokens here; with audit_gate, peaks 0.470 / 0.622 /
                      0.409 on seeds 0-2 against the gate's 0.477 / 0.526 / 0.444: it helps where
                      the critic ranks and hurts where it does not, BENCHMARKS.md "Session 30")
  no_plain_twin       a critic pair with a reference trains that record alone, not also a twin
                      without it (controller.critic_plain_twin off, a departure: every read here has
                      a reference, and the twins are half the critic update's rows; the update
                      takes 0.60x the time and AC2's step 1.29x Prefix GRPO's instead of 1.46x; with
                      audit_gate, peaks 0.516 / 0.584 / 0.448 on seeds 0-2 against 0.477 / 0.526 /
                      0.444, BENCHMARKS.md "Session 30"; run on to 87 steps with GRPO, peaks 0.675 /
                      0.662 / 0.505 against GRPO's 0.626 / 0.771 / 0.464, GRPO's peak reached on
                      seeds 0 and 2 at 1.62x / 1.38x fewer decoding FLOPs, BENCHMARKS.md "Session 31")
"""

from ac2_jax.train import defaults

VARIANTS = ('no_audit', 'group1', 'stale_buffer', 'correct_only', 'chunk_small',
            'no_local_readiness', 'no_reference', 'adapter', 'revocable', 'warmup', 'self_check',
            'reference_check', 'uncredited', 'at_uncredited', 'audit_gate', 'judged_pairs',
            'audit_scale', 'trained_refills', 'no_plain_twin')
ADAPTER_RANK = 16
WARMUP_CURRICULUM = '1:9000,2:6000,4:6000,0:12000'
WARMUP_ADAPTER_LR = 1e-3  # a rank-16 adapter learned the one-line check 1.5x faster than 3e-4
# The self-checking critic learns the value of marked lines in 6,000-9,000 exact pairs (corr +0.74
# / +0.95 through the adapter; BENCHMARKS.md, "Session 21").
SELF_CHECK_WARMUP = '0:9000'


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
  elif name == 'adapter':
    c.critic.adapter_rank = ADAPTER_RANK
  elif name == 'revocable':
    c.controller.readiness_revocable = True
  elif name == 'audit_gate':
    c.controller.audit_gate = True
  elif name == 'judged_pairs':
    c.controller.critic_judged_only = True
  elif name == 'audit_scale':
    c.controller.audit_scale = True
  elif name == 'trained_refills':
    c.controller.train_refills = True
  elif name == 'no_plain_twin':
    c.controller.critic_plain_twin = False
  elif name == 'warmup':
    c.critic.warmup = WARMUP_CURRICULUM
    c.critic.target = 'two_hot'
  elif name in ('self_check', 'reference_check'):
    c.critic[name] = True
    c.critic.warmup = SELF_CHECK_WARMUP
    c.critic.target = 'two_hot'
  elif name in defaults.UNCREDITED_ARGUMENTS:
    defaults.apply_uncredited(c, name)
  else:
    raise ValueError(f'unknown AC2 variant {name!r}; known: {", ".join(VARIANTS)}')


def get_config(arg: str = ''):
  c = defaults.base_config()
  c.algorithm = 'ac2'
  parts = [p for p in arg.split(',') if p]
  c = defaults.apply_shared_arguments(c, parts)
  # chunk_small scales from the chosen size, so it applies after qwen3_4b.
  for part in parts:
    if part not in defaults.SHARED_ARGUMENTS:
      apply_variant(c, part)
  if c.critic.warmup and c.critic.adapter_rank:
    c.critic.warmup_learning_rate = WARMUP_ADAPTER_LR  # whatever the variants' order
  return c
