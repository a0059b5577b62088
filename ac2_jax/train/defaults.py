"""Every config key the trainer reads, with its CPU default and a comment: the base of configs/*.py.

The config files in configs/ start from `base_config()` and change what their algorithm or variant
needs. The defaults are the built-in task on a laptop CPU with the `tiny` model: token counts are
scaled down from the paper (budget 50,000 -> 80, chunk 10,000 -> 16), the logic is not.
`paper_scale(config)` applies the AC2 paper's Table 4 for a Qwen3-4B run on a pod.
"""

from __future__ import annotations

import math

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # 'ac2' | 'prefix_grpo' | 'grpo' | 'ppo' | 'pact' | 'lisao' | 'li2sao'
  c.algorithm = 'ac2'
  c.seed = 0
  c.num_steps = 60
  c.checkpoint_every = 20          # steps; also on exit and on SIGTERM
  c.checkpoints_kept = 2
  c.dry_run = False                # build and check shapes/shardings/memory with eval_shape only
  c.log_every = 1
  # A directory for the persistent XLA compilation cache (train/compile_cache.py): later processes
  # load what earlier ones compiled. '' = jax's own setting (JAX_COMPILATION_CACHE_DIR).
  c.compilation_cache_dir = ''

  c.model = ml_collections.ConfigDict()
  c.model.preset = 'tiny'          # ac2_jax.models.get_config name, when no checkpoint is given
  c.model.init_checkpoint = ''     # Hugging Face checkpoint dir; '' = SFT warm start (built-in task)
  c.model.dtype = 'float32'        # compute and parameter dtype: 'float32' | 'bfloat16'
  c.model.attention_impl = 'xla'   # 'xla' | 'pallas'
  c.model.pallas_backend = ''      # Pallas kernels for 'tpu' | 'gpu'; '' = the running backend
  c.model.remat = False
  c.model.logits_chunk = 0         # positions per vocabulary projection in the updates; 0 = all

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1
  c.mesh.fsdp = -1                 # -1: all remaining devices
  c.mesh.tensor = 1

  c.task = ml_collections.ConfigDict()
  c.task.name = 'builtin'          # 'builtin' (the chain) | 'walk' | 'proofs'
  c.task.data_dir = ''             # '' = WORKDIR/data
  c.task.builtin_steps = 8         # K: operations per chain (difficulty)
  c.task.builtin_modulus = 7       # prime modulus (difficulty)
  c.task.builtin_ops = '+-'        # operations drawn from '+-*' (difficulty)
  c.task.builtin_num_train = 20_000
  # Training problems the RL steps draw from: at most the first N of the train split; 0 = all. A
  # problem becomes ready only from its own critic errors, so it must come back within the run:
  # 60 steps of 16 refills over 20,000 problems meet each at most once (ready fraction of the
  # second half's replay slots 0.03), over 256 about 4 times (0.24; 0.84 with bank_from_data).
  # The warm start still learns from all 20,000.
  c.task.rl_problems = 256
  c.task.builtin_num_validation = 256
  c.task.builtin_vocab_size = 512
  c.task.builtin_scoring = 'local'  # one of tasks/builtin.py's SCORINGS (it says why each exists)
  # 'long' | 'short' | 'beside' critic instruction. Short: the long one is 69 of a tiny model's
  # tokens, the short one 7, so the critic's context holds the attempt and the reference (critic
  # reads and updates about 1.5x shorter). Beside (the chain only): the short question with the
  # reference's lines beside the attempt's (about 70 tokens more at K = 12: raise
  # critic.max_context and sft.critic_seq_len; BENCHMARKS.md, "Session 13").
  c.task.builtin_critic_prompt = 'short'
  c.task.builtin_labels = False  # steps marked by letters (tasks/builtin.py ChainSettings.labels)
  # The walk (ac2_jax/tasks/walk.py says why it exists): reach walk_goal from a start with the
  # menu's moves in a budget of the shortest walk plus 0..walk_slack moves, never landing above
  # the goal or on a number ending in walk_trap_digit (-1: no traps).
  c.task.walk_goal = 100
  c.task.walk_moves = '+1 +5 *2'
  c.task.walk_trap_digit = 7
  c.task.walk_min_distance = 2
  c.task.walk_max_distance = 8
  c.task.walk_slack = 2
  c.task.walk_validation_every = 4
  c.task.proofs_train_dir = ''     # manual dir with FineProofs-RL parquet/jsonl files
  c.task.proofs_validation_dir = ''  # manual dir with IMO-ProofBench files
  c.task.skip_malformed = False    # skip (and count) malformed data rows instead of failing

  c.judge = ml_collections.ConfigDict()
  c.judge.base_url = ''            # OpenAI-compatible server for the proof task
  c.judge.model = ''
  c.judge.api_key_env = ''         # name of the environment variable holding the key
  c.judge.max_concurrency = 32
  c.judge.timeout_s = 600.0

  c.sft = ml_collections.ConfigDict()  # warm start on the built-in task's worked solutions
  c.sft.steps = 560
  c.sft.batch_size = 32
  c.sft.seq_len = 112              # a K=8, p=7 prompt + solution is 104 tokens
  c.sft.learning_rate = 3e-3
  c.sft.warmup_steps = 30
  c.sft.mistake_rate = 0.0         # share of worked solutions with one injected mistake
  c.sft.step_mistake_rate = 0.25   # each worked step independently wrong: sets the start accuracy
  c.sft.clean_steps = 420          # correct solutions first: the arithmetic is learned sooner
  # > 0: the clean phase goes on (to at most clean_steps_max) until its mean loss over 20 steps
  # is this. Off: at 0.01 (cap 840) it lifted the bench warm start by about 0.05 on CPUs of both
  # vector widths but left the 0.08 between them, which the short noisy phase makes (a noisy
  # phase run to convergence closes it: BENCHMARKS.md, "Session 14"), and cost up to 420 steps.
  c.sft.clean_loss_target = 0.0
  c.sft.clean_steps_max = 0
  # Steps after the schedule at a constant rate, on the noisy corpus: the warm start goes on
  # toward the corpus's level, which narrows (not closes) its spread between machines
  # (ac2_jax/train/sft.py says why; BENCHMARKS.md, "Session 15").
  c.sft.noisy_tail_steps = 0
  c.sft.noisy_tail_learning_rate = 6e-4
  c.sft.critic_every = 4           # then every 4th step teaches the critic's answer format
  c.sft.critic_from = -1           # the step critic batches start after; < 0: after clean_steps
  c.sft.critic_batch_size = 16
  c.sft.critic_seq_len = 256
  c.sft.critic_value_mistake_rate = -1.0  # critic examples' values: < 0 = the corpus's own rate
  c.sft.blind_fraction = 0.0       # share of walk numbers / chain facts the corpus never shows

  c.controller = ml_collections.ConfigDict()  # ac2_jax.controller.ControllerSettings fields
  c.controller.group_size = 8
  # Table 4's. On the bench setting (gate, no_plain_twin) 0.1 cut audit tokens by 11% and kept
  # the mean score of steps 30-60 on every seed, not the peaks (BENCHMARKS.md, session 31).
  c.controller.audit_fraction = 0.25
  c.controller.n_batch = 16
  c.controller.n_refill = 16
  c.controller.buffer_capacity = 64
  c.controller.response_budget = 80   # a K=8 solution is about 60 tokens
  c.controller.chunk_size = 16        # about 4 chunks per solution
  # Ready chunks decode in calls of their own (same tokens; on a CPU a chunk in a call with full
  # continuations costs their length, not its own; the paper's accelerators keep one call).
  c.controller.chunk_calls = True
  c.controller.cut_grid = 16
  # 0.9 in the paper; 0.8 keeps every cut inside the reasoning of a K=8 solution (48 of its 55
  # tokens), so no replayed prefix already holds every line (measured: those groups all had equal
  # rewards, a quarter of all replay groups at 0.9). On the K=12 bench, 0.9 (a last cut at 64 of 79
  # tokens, so ready chunks reach the last lines) did not help AC2 against Prefix GRPO
  # (BENCHMARKS.md, "Session 22").
  c.controller.max_cut_fraction = 0.8
  # Off: the paper. On: a replayed prefix also ends at or before its trajectory's first line the
  # task's leading scoring no longer credits, where every continuation would tie (the built-in
  # chain; controller/settings.py; BENCHMARKS.md, session 25).
  c.controller.cut_before_uncredited = False
  # Off: the paper. On (with cut_before_uncredited): a ready chunk runs at least through that first
  # uncredited line, the line the score turned on (controller/settings.py; BENCHMARKS.md,
  # session 27: a 16-token chunk ended before it in a quarter of the audited groups).
  c.controller.chunk_through_uncredited = False
  # Off: the paper. On (with cut_before_uncredited): a replayed prefix ends at that line's start
  # itself, not at a grid point below it (controller/settings.py; BENCHMARKS.md, session 27).
  c.controller.cut_at_uncredited = False
  c.controller.critic_buffer_capacity = 160
  # 16 halves the critic update (issue 15 item 4) but costs score: seed 1 of the bench setting
  # peaked at 0.490 against 0.584 (BENCHMARKS.md, session 31).
  c.controller.critic_pairs_per_update = 32
  # Off: the paper. n > 0: up to n judged continuations per step that ran past the chunk also
  # train the critic at their chunk-end state on their own reward (controller/settings.py).
  c.controller.chunk_end_pairs = 0
  # 1: the paper. n > 1: n critic updates a step, each on its own draw (controller/settings.py).
  c.controller.critic_updates = 1
  c.controller.min_valid_per_target = 4
  c.controller.readiness_window = 5
  c.controller.tau_global = 0.20
  c.controller.tau_local = 0.18
  c.controller.no_audit = False
  c.controller.group_size_one = False
  c.controller.stale_buffer = False
  c.controller.stale_period = 10
  c.controller.stale_factor = 10
  c.controller.correct_only = False
  c.controller.no_local_readiness = False
  c.controller.no_reference = False
  # Off: the paper. On: only judge-valued targets measure readiness (controller/settings.py).
  c.controller.readiness_judged_only = False
  # Off: the paper (ready groups' critic-valued targets train the critic too). On (variant
  # judged_pairs): only judge-valued targets enter the critic buffer (controller/settings.py).
  c.controller.critic_judged_only = False
  # Off: the paper (ready forever). On: a failed audit makes its problem unready again.
  c.controller.readiness_revocable = False
  # Off: the spec's readiness. On (variant audit_gate): chunks are critic-scored only while the
  # audits' chunk advantages correlate with their Monte Carlo ones (controller/audit_gate.py).
  c.controller.audit_gate = False
  c.controller.audit_gate_corr = 0.3
  c.controller.audit_gate_rows = 32
  # Off: the paper's chunk advantages. On (variant audit_scale): ready chunks' critic advantages
  # times the audits' slope of Monte Carlo on critic advantages, in [1, audit_scale_max].
  c.controller.audit_scale = False
  c.controller.audit_scale_max = 3.0
  # Off: the paper (refills are never trained). On (variant trained_refills): refills of problems
  # whose chunks the critic scores train the actor on r - V(s0) (controller/settings.py).
  c.controller.train_refills = False
  # On: the paper (a pair with a reference trains with and without it). Off: with it alone, half
  # the critic update's rows; every read here has a reference (bank_from_data).
  c.controller.critic_plain_twin = True
  # Seed the reference bank with the data set's solutions. The paper fills it from passing
  # rollouts only (>= 6 of 7 points); here those are whole right chains, 8% of the tiny policy's
  # rollouts, so readiness condition (c) held back two thirds of the pool (bank 83 of 256 problems
  # at step 55). paper_scale sets False.
  c.controller.bank_from_data = True
  c.controller.critic_lr_init = 2 * math.sqrt(2) * 1e-4
  # On the tiny CPU task the critic's update norm exceeds sqrt(2) x the actor's from the first
  # steps, so the paper's halving rule would take the rate to its floor at once; keep the floor near.
  c.controller.critic_lr_floor = 1e-4
  c.controller.entropy_target = 0.28
  c.controller.entropy_k_init = 0.06
  c.controller.eps_high_base = 0.28

  c.grpo = ml_collections.ConfigDict()
  c.grpo.problems_per_step = 16
  c.grpo.group_size = 8
  c.grpo.normalize_std = False

  c.ppo = ml_collections.ConfigDict()  # PPO with GAE (algorithms/ppo.py); full responses
  c.ppo.problems_per_step = 16
  c.ppo.responses_per_problem = 8  # the rows of a GRPO step, so the two cost the same to sample
  c.ppo.gamma = 1.0
  c.ppo.lam = 0.95                 # GAE lambda; configs/ppo.py:lambda1 sets 1 (A = R - V(s_t))

  c.pact = ml_collections.ConfigDict()  # PACT (algorithms/pact.py); full responses
  c.pact.problems_per_step = 16
  c.pact.responses_per_problem = 8
  c.pact.max_ratio = 6.0           # critic tokens keep 0 <= rho <= max_ratio
  c.pact.dis_low = 0.7             # the actor's DIS band (ALGORITHMS.md, the math setting)
  c.pact.dis_high = 6.0

  # LiSAO (algorithms/lisao.py): one full response per problem, skip-observation GAE, DIS. The
  # critic settings (frozen attention, K = 2, 10 warm-up steps) are configs/lisao.py's.
  c.lisao = ml_collections.ConfigDict()
  c.lisao.problems_per_step = 128  # one response each: the 128 trajectories of a GRPO step
  c.lisao.gamma = 1.0
  c.lisao.lambda_alpha = 1.5       # per trajectory: lambda = clamp(1 - 1 / (1.5 L), 0, 1)
  c.lisao.dis_low = 0.7            # the actor's DIS band (ALGORITHMS.md, the math setting)
  c.lisao.dis_high = 6.0

  # Li2SAO (algorithms/li2sao.py): groups of group_size until the readiness gate opens, then one
  # response per problem for problems_per_step x group_size problems (the same trajectories).
  c.li2sao = ml_collections.ConfigDict()
  c.li2sao.problems_per_step = 16  # bootstrap prompts; x group_size = trajectories per update
  c.li2sao.group_size = 8          # n_b
  c.li2sao.gamma = 1.0             # after the switch, as LiSAO's
  c.li2sao.lambda_alpha = 1.5
  c.li2sao.dis_low = 0.7
  c.li2sao.dis_high = 6.0
  c.li2sao.eps = 1e-6              # actor advantage (R - mu) / (sigma + eps), sigma with n - 1
  c.li2sao.rank_coef = 0.1         # alpha: critic loss = clipped residual + alpha x ranking
  c.li2sao.rank_margin = 0.1       # m in [m - V(s_i+,T) + V(s_i-,T)]_+
  c.li2sao.ema_beta = 0.9          # EMA of the readiness statistics e_k, a_k (both start at 0)
  c.li2sao.min_explained_variance = 0.2  # eta_e
  c.li2sao.min_ranking_accuracy = 0.65   # eta_a
  c.li2sao.ready_steps = 10        # M consecutive ready steps open the gate
  # T_min, T_max: the paper's 60 and 150 are of a 500-step run (paper_scale sets them; its coding
  # run took 30 and 60 of 200). A 60-step CPU run needs them inside it, with steps after the
  # switch: the gate counts from step 20 and opens at step 40 at the latest.
  c.li2sao.min_steps = 20
  c.li2sao.max_steps = 40

  # Where grpo, lisao and li2sao take their batches: 'sync' samples each step's batch, then trains;
  # 'async' runs a rollout worker thread (algorithms/inflight.py) that generates the next batch
  # while a step trains, one segment at a time under the weights published last.
  c.rollout = ml_collections.ConfigDict()
  c.rollout.mode = 'sync'          # 'sync' | 'async'
  c.rollout.max_policy_lag = 1     # k: a sample with a token more than k versions old is dropped
  # New tokens per generation call: an update reaches unfinished rollouts at their next segment.
  c.rollout.segment_tokens = 16
  # Local devices per process that form the worker's rollout sub-mesh (async only): the training
  # mesh (mesh.*) takes the rest, and the weights are copied across after every update. 0: the
  # worker generates on the training mesh (one process only: on several, a process-local sub-mesh
  # keeps the worker thread out of the training mesh's collectives).
  c.rollout.devices = 0

  # The separate value-head critic of the value algorithms (learner/value_critic.py): the policy's
  # architecture and weights (or init_checkpoint's) with a scalar head; its own AdamW.
  c.value_critic = ml_collections.ConfigDict()
  # Hugging Face checkpoint dir whose decoder body starts the critic (of the policy's architecture;
  # its lm_head is dropped, the head starts fresh); '' = the policy's own weights.
  c.value_critic.init_checkpoint = ''
  c.value_critic.learning_rate = 1e-4  # the tiny model's; 5e-6 at paper scale (SAO, PACT)
  c.value_critic.weight_decay = 0.0
  c.value_critic.grad_clip = 1.0
  c.value_critic.freeze_attention = False  # True: only the MLP blocks, final norm and head train
  c.value_critic.updates = 1       # K critic updates per actor minibatch update
  c.value_critic.warmup_steps = 0  # first steps that train the critic only (LiSAO: 10)
  c.value_critic.value_clip = 0.2  # PPO's clipped value loss: V_old +- value_clip
  c.value_critic.head_std = 0.02   # initial head weights (the body: init_checkpoint)

  c.sampling = ml_collections.ConfigDict()  # training rollouts
  c.sampling.temperature = 0.8
  c.sampling.top_p = 1.0
  c.sampling.top_k = 0
  c.sampling.max_batch = 512       # rows per sampler device call

  c.actor = ml_collections.ConfigDict()
  c.actor.learning_rate = 1e-4
  c.actor.weight_decay = 0.01
  c.actor.grad_clip = 0.3
  c.actor.eps_low = 0.2
  c.actor.dual_clip = 3.0
  c.actor.minibatches = 2
  c.actor.micro_batch = 0          # rows per gradient micro-batch; 0 = whole minibatch

  c.critic = ml_collections.ConfigDict()
  c.critic.grad_clip = 0.2
  c.critic.max_context = 320       # critic prompt tokens; longer pairs are skipped and counted
  # 'greedy' (the paper: the reply's value, the mode of the critic's distribution) | 'expectation'
  # (the mean over the grid tokens' probabilities, one forward): the mode of a critic that knows
  # little is the commonest label, its mean at least the mean label (measured with
  # `launch/bench.py critic`), and one forward costs less than a 4-token greedy decode.
  c.critic.readout = 'expectation'
  # 'rounded' (the paper: a target is its nearest grid value's token) | 'two_hot' (the two grid
  # values around it, weighted so that their mean is the target; critic/values.py): where values
  # crowd inside one grid cell (the chain's 0.3-0.6), rounding leaves most prefixes the same token
  # and the critic no gradient between them. Read it with readout 'expectation'.
  c.critic.target = 'rounded'
  # False: the paper's critic prompt. True: each worked line of the attempt carries a verdict
  # token, whether the policy's own greedy result there is the one written (critic/self_check.py;
  # the built-in chain): a departure, since the critic does not learn that check from its loss
  # (BENCHMARKS.md, "Session 20") while the policy's forward holds it.
  c.critic.self_check = False
  # True: each worked line carries a verdict token, whether it is the reference's line (input, step
  # and result; critic/self_check.py): a departure standing in for a critic large enough to compare
  # an attempt with its reference, which the tiny one does not learn (BENCHMARKS.md, "Session 20").
  # Where the policy has facts still to learn, its self-check is a guess there and this is not.
  c.critic.reference_check = False
  # 0: the paper's critic, whose update trains the policy's own weights. r > 0: the critic reads
  # and trains through a rank-r adapter W + A B (learner/critic_adapter.py), so its update no
  # longer moves the actor; a departure, for small policies whose weights have no room for both.
  c.critic.adapter_rank = 0
  # The critic warm-up before RL (train/critic_warmup.py; built-in tasks): stages
  # 'cut_lines:pairs,...' of exact-valued warm-start corpus prefixes through the critic update,
  # at their own rate and batch; '' = none (the paper has none: a departure, measured in
  # BENCHMARKS.md). warmup_mistake_rate < 0: the SFT corpus's sft.step_mistake_rate.
  c.critic.warmup = ''
  c.critic.warmup_learning_rate = 3e-4
  c.critic.warmup_pairs_per_update = 64
  c.critic.warmup_mistake_rate = -1.0

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 20
  c.eval.num_problems = 64
  c.eval.num_responses = 8
  c.eval.temperature = 0.8
  c.eval.top_p = 0.95
  c.eval.top_k = 20
  return c


# The config arguments every config file takes (besides its own): `tiny` and `cpu` name the default.
SHARED_ARGUMENTS = ('qwen3_4b', 'bench', 'walk', 'tiny', 'cpu')
# Replay variants of AC2 and Prefix GRPO on the built-in chain under a leading scoring
# (`apply_uncredited`).
UNCREDITED_ARGUMENTS = ('uncredited', 'at_uncredited')


def apply_uncredited(c: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """`uncredited`: replayed prefixes end at or before their trajectory's first uncredited line and
  ready chunks run at least through it; `at_uncredited`: the prefixes end at that line's start
  itself (controller/settings.py)."""
  if name not in UNCREDITED_ARGUMENTS:
    raise ValueError(f'{name!r} is not one of {UNCREDITED_ARGUMENTS}')
  c.controller.cut_before_uncredited = True
  c.controller.chunk_through_uncredited = True
  c.controller.cut_at_uncredited = name == 'at_uncredited'
  return c


def apply_shared_arguments(c: ml_collections.ConfigDict, parts
                           ) -> ml_collections.ConfigDict:
  """The shared config arguments among `parts`, in this order: `qwen3_4b` (paper scale), `bench`
  (launch/compare.py's setting, bench_setting.py), `walk` (the built-in walk task)."""
  from ac2_jax.train import bench_setting  # a sibling that imports nothing of ours
  if 'qwen3_4b' in parts:
    c = paper_scale(c)
  if 'bench' in parts:
    c = bench_setting.apply_bench(c)
  if 'walk' in parts:
    c = walk_task(c)
  return c


def walk_task(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The `walk` config argument: the built-in walk task (ac2_jax/tasks/walk.py) and the sizes it
  needs (measured with the built-in tokenizer at the default walk settings)."""
  c.task.name = 'walk'
  c.sft.seq_len = 208              # prompt + walk: at most 202 tokens
  c.sft.critic_seq_len = 352       # warm-start critic examples: 324 tokens seen at the longest
  c.sft.step_mistake_rate = 0.3    # the corpus's share of off-plan moves: sets the start score
  # The walk's arithmetic is learned in about 100 steps (loss 0.06), so the noisy walks come in
  # early: with 420 clean steps the warm start kept almost no entropy at its choices (0.07 per
  # token), 50-90% of replay groups had equal rewards and its critic saw 560 examples. Here the
  # policy imitates the noisy solver for 460 steps and every 2nd of them is a critic batch of 32
  # (7,360 critic examples, the size of the policy's own warm-up).
  c.sft.clean_steps = 100
  c.sft.critic_every = 2
  c.sft.critic_batch_size = 32
  c.controller.response_budget = 144  # the longest walk (10 moves) is 130 tokens
  c.critic.max_context = 384       # prompt + reference + instruction + 144 response tokens
  return c


def paper_scale(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The AC2 paper's main run (Table 4): Qwen3-4B on FineProofs-RL / IMO-ProofBench."""
  c.num_steps = 200
  c.checkpoint_every = 5
  c.model.preset = 'qwen3_4b'
  c.model.dtype = 'bfloat16'
  c.model.remat = True
  c.model.attention_impl = 'pallas'
  c.model.logits_chunk = 2048      # float32 logits of 2,048 positions at a time, not of 65,536
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
  c.task.name = 'proofs'
  c.task.rl_problems = 0
  c.controller.group_size = 16
  c.controller.n_batch = 192
  c.controller.n_refill = 192
  c.controller.buffer_capacity = 256
  c.controller.response_budget = 50_000
  c.controller.chunk_size = 10_000
  c.controller.chunk_calls = False
  c.controller.cut_grid = 10_000
  c.controller.max_cut_fraction = 0.9
  c.controller.critic_buffer_capacity = 1_920
  c.controller.bank_from_data = False
  c.controller.critic_pairs_per_update = 768
  c.controller.min_valid_per_target = 8
  c.controller.critic_lr_init = 2 * math.sqrt(2) * 1e-6
  c.controller.critic_lr_floor = 5 * math.sqrt(2) * 1e-7
  c.grpo.problems_per_step = 256
  c.grpo.group_size = 16
  for section in (c.ppo, c.pact):  # the rows of a GRPO step
    section.problems_per_step = 256
    section.responses_per_problem = 16
  # The Li2SAO paper's budget: 128 trajectories per update, 16 x 8 then 128 x 1; its gate window.
  c.lisao.problems_per_step = 128
  c.li2sao.problems_per_step = 16
  c.li2sao.group_size = 8
  c.li2sao.min_steps = 60
  c.li2sao.max_steps = 150
  c.rollout.segment_tokens = 2048
  c.value_critic.learning_rate = 5e-6
  c.sampling.max_batch = 256
  c.actor.learning_rate = 2e-6
  c.actor.micro_batch = 16
  c.critic.max_context = 60_000
  c.critic.readout = 'greedy'
  c.eval.every = 10
  c.eval.num_problems = 60
  c.eval.num_responses = 16
  return c
