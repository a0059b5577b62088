"""The config read into typed settings, every value checked before any work is done.

`validate(config)` builds every settings object of a run (controller, sampler, SFT, mesh against the
devices, task, judge, algorithm) and raises `ConfigError` naming the key and what it allows; the
launchers call it first, so a bad value ends the run before anything is written. With
`experiment.py` (which builds the run), this is the only module that reads the ConfigDict;
everything else takes typed values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os

import jax
import ml_collections

from ac2_jax import controller as ctl
from ac2_jax import critic as critic_lib
from ac2_jax import models, sampling, sharding
from ac2_jax.algorithms import grpo as grpo_lib
from ac2_jax.algorithms import li2sao as li2sao_lib
from ac2_jax.algorithms import lisao as lisao_lib
from ac2_jax.algorithms import pact as pact_lib
from ac2_jax.algorithms import ppo as ppo_lib
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import value_critic
from ac2_jax.controller.inflight import InflightSettings
from ac2_jax.controller.switch_gate import GateSettings
from ac2_jax.models import value as value_model
from ac2_jax.models.config import ModelConfig
from ac2_jax.tasks import builtin, walk
from ac2_jax.train import critic_warmup, dry_run
from ac2_jax.train import sft as sft_lib
from ac2_jax.train.sizes import RunSizes

ALGORITHMS = ('ac2', 'prefix_grpo', 'grpo', 'ppo', 'pact', 'lisao', 'li2sao')
# Algorithms with a separate value-head critic (learner/value_critic.py), and their config section.
VALUE_ALGORITHMS = ('ppo', 'pact', 'lisao', 'li2sao')
TASKS = ('builtin', 'walk', 'proofs')
# The tasks built on this machine, with a tokenizer and an SFT warm start of their own.
BUILTIN_TASKS = ('builtin', 'walk')
ROLLOUT_MODES = ('sync', 'async')
# Algorithms that can take their batches from the in-flight rollout worker (rollout.mode='async').
ASYNC_ALGORITHMS = ('grpo', 'lisao', 'li2sao')
DTYPES = ('float32', 'bfloat16')
ATTENTION_IMPLS = ('xla', 'pallas')




class ConfigError(ValueError):
  """A config the run cannot start from; the message is one line naming the key and what it allows.

  The launchers print it and exit with status 1 (no traceback): it is the user's error, raised
  before anything is written to the workdir.
  """


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """What the host loop reads of the config."""
  seed: int
  num_steps: int
  checkpoint_every: int
  checkpoints_kept: int
  log_every: int
  eval_every: int
  eval_problems: int
  eval_responses: int
  eval_max_new_tokens: int
  compilation_cache_dir: str         # '' = jax's own setting
  config_json: str                   # written to WORKDIR/config.json


def run_settings(c: ml_collections.ConfigDict) -> RunSettings:
  if c.dry_run:
    raise ConfigError('config.dry_run=True: call ac2_jax.train.dry_run.run(experiment.dry_run_plan('
                      'config)) instead of train')
  for key, value in (('seed', c.seed), ('num_steps', c.num_steps),
                     ('checkpoint_every', c.checkpoint_every),
                     ('checkpoints_kept', c.checkpoints_kept), ('log_every', c.log_every),
                     ('eval.every', c.eval.every), ('eval.num_problems', c.eval.num_problems),
                     ('eval.num_responses', c.eval.num_responses)):
    low = 0 if key == 'seed' else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ConfigError(f'config.{key} must be an integer >= {low}, got {value!r}')
  return RunSettings(seed=c.seed, num_steps=c.num_steps, checkpoint_every=c.checkpoint_every,
                     checkpoints_kept=c.checkpoints_kept, log_every=c.log_every,
                     eval_every=c.eval.every, eval_problems=c.eval.num_problems,
                     eval_responses=c.eval.num_responses,
                     eval_max_new_tokens=c.controller.response_budget,
                     compilation_cache_dir=c.compilation_cache_dir or '',
                     config_json=c.to_json_best_effort(indent=2))


def run_sizes(c: ml_collections.ConfigDict, prompt_tokens: int) -> RunSizes:
  """The run's sizes, for a run (its longest prompt) and a dry run (an assumed one) alike."""
  ctl_c = c.controller
  if c.algorithm == 'grpo':
    rows = c.grpo.problems_per_step * c.grpo.group_size
  elif c.algorithm == 'lisao':
    rows = c.lisao.problems_per_step
  elif c.algorithm == 'li2sao':
    rows = c.li2sao.problems_per_step * c.li2sao.group_size
  elif c.algorithm in VALUE_ALGORITHMS:
    section = c[c.algorithm]
    rows = section.problems_per_step * section.responses_per_problem
  else:
    rows = ctl_c.n_refill + ctl_c.n_batch * ctl_c.group_size
  return RunSizes(
      prompt_tokens=prompt_tokens, response_budget=ctl_c.response_budget,
      cut_grid=ctl_c.cut_grid, max_cut=int(ctl_c.max_cut_fraction * ctl_c.response_budget),
      critic_context=c.critic.max_context, rows_per_step=rows,
      max_sample_batch=c.sampling.max_batch, actor_minibatches=c.actor.minibatches,
      micro_batch=c.actor.micro_batch, logits_chunk=c.model.logits_chunk,
      critic_pairs_per_update=ctl_c.critic_pairs_per_update,
      # Chunks routed to the critic plus one prefix value per replayed group.
      critic_reads_per_step=ctl_c.n_batch * (ctl_c.group_size + 1) if c.algorithm == 'ac2' else 0)


def dry_run_plan(c: ml_collections.ConfigDict, num_devices: int | None = None) -> dry_run.Plan:
  """What `dry_run.run` checks; a -1 mesh axis takes `num_devices` (default: the devices present)
  less the rollout devices."""
  if c.task.name not in dry_run.PROMPT_TOKENS:
    raise ValueError(f'config.task.name must be one of {tuple(dry_run.PROMPT_TOKENS)}, '
                     f'got {c.task.name!r}')
  hf_config = os.path.join(c.model.init_checkpoint, 'config.json')
  overrides = dict(dtype=c.model.dtype, param_dtype=c.model.dtype,
                   attention_impl=c.model.attention_impl,
                   pallas_backend=c.model.pallas_backend or None, remat=c.model.remat)
  if c.model.init_checkpoint and os.path.isfile(hf_config):
    with open(hf_config) as f:
      model = ModelConfig.from_hf_dict(json.load(f), **overrides)
    source = hf_config
  else:
    if c.task.name in BUILTIN_TASKS:
      overrides['vocab_size'] = c.task.builtin_vocab_size
    model = models.get_config(c.model.preset, **overrides)
    source = f'preset {c.model.preset!r}'
    if c.model.init_checkpoint:
      source += f' ({hf_config} is not here)'
  axes = (c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  # The training mesh spans what the rollout sub-meshes leave (sharding.split_rollout_devices).
  rollout = c.rollout.devices * jax.process_count()
  devices = math.prod(axes) if -1 not in axes else (num_devices or jax.device_count()) - rollout
  if devices < 1:
    raise ConfigError(f'config.rollout.devices={c.rollout.devices} leaves no training devices '
                      f'of {num_devices or jax.device_count()}')
  return dry_run.Plan(model=model, model_source=source,
                      mesh_shape=sharding.MeshConfig(*axes).resolve(devices),
                      sizes=run_sizes(c, dry_run.PROMPT_TOKENS[c.task.name]),
                      value=value_settings(c) if c.algorithm in VALUE_ALGORITHMS else None,
                      critic_adapter_rank=c.critic.adapter_rank)


@contextlib.contextmanager
def config_section(name: str):
  """A settings object's own error (ValueError, TypeError) as a ConfigError naming its section."""
  try:
    yield
  except ConfigError:
    raise
  except (ValueError, TypeError) as e:
    raise ConfigError(f'config.{name}: ' + ' '.join(str(e).split())) from None


def check_choice(key: str, value, allowed: tuple) -> None:
  if value not in allowed:
    raise ConfigError(f'config.{key} must be one of {allowed}, got {value!r}')


def controller_settings(c: ml_collections.ConfigDict) -> ctl.ControllerSettings:
  with config_section('controller'):
    return ctl.ControllerSettings(**c.controller.to_dict())


def chain_settings(c: ml_collections.ConfigDict) -> builtin.ChainSettings:
  with config_section('task (builtin_*)'):
    return builtin.ChainSettings(steps=c.task.builtin_steps, modulus=c.task.builtin_modulus,
                                 ops=c.task.builtin_ops, num_train=c.task.builtin_num_train,
                                 num_validation=c.task.builtin_num_validation, seed=c.seed,
                                 scoring=c.task.builtin_scoring, labels=c.task.builtin_labels,
                                 critic_prompt=c.task.builtin_critic_prompt)


def walk_settings(c: ml_collections.ConfigDict) -> walk.WalkSettings:
  with config_section('task (walk_*)'):
    return walk.WalkSettings(goal=c.task.walk_goal, moves=c.task.walk_moves,
                             trap_digit=c.task.walk_trap_digit,
                             min_distance=c.task.walk_min_distance,
                             max_distance=c.task.walk_max_distance, slack=c.task.walk_slack,
                             validation_every=c.task.walk_validation_every,
                             critic_prompt=c.task.builtin_critic_prompt)


def builtin_settings(c: ml_collections.ConfigDict) -> builtin.ChainSettings | walk.WalkSettings:
  """The settings of the built-in task config.task.name names (the chain or the walk)."""
  return walk_settings(c) if c.task.name == 'walk' else chain_settings(c)


def sft_settings(c: ml_collections.ConfigDict) -> sft_lib.SFTSettings:
  with config_section('sft'):
    settings = sft_lib.SFTSettings(**c.sft.to_dict(), seed=c.seed)
  for key in ('steps', 'batch_size', 'seq_len'):
    if getattr(settings, key) < 1:
      raise ConfigError(f'config.sft.{key} must be >= 1, got {getattr(settings, key)!r}')
  if settings.critic_value_mistake_rate > 1:
    raise ConfigError('config.sft.critic_value_mistake_rate must lie in [0, 1] (or be < 0 for '
                      f'the corpus\'s own rate), got {settings.critic_value_mistake_rate!r}')
  if settings.clean_loss_target > 0 and not 0 < settings.clean_steps <= settings.clean_steps_max:
    raise ConfigError('config.sft.clean_loss_target > 0 needs 0 < sft.clean_steps <= '
                      f'sft.clean_steps_max, got {settings.clean_steps} and '
                      f'{settings.clean_steps_max}')
  if settings.noisy_tail_steps < 0:
    raise ConfigError(f'config.sft.noisy_tail_steps must be >= 0, got '
                      f'{settings.noisy_tail_steps!r}')
  if settings.noisy_tail_steps and settings.noisy_tail_learning_rate <= 0:
    raise ConfigError('config.sft.noisy_tail_learning_rate must be > 0 when '
                      f'sft.noisy_tail_steps > 0, got {settings.noisy_tail_learning_rate!r}')
  if not 0.0 <= settings.blind_fraction <= 1.0:
    raise ConfigError(f'config.sft.blind_fraction must lie in [0, 1], got '
                      f'{settings.blind_fraction!r}')
  if settings.blind_fraction and c.task.name not in BUILTIN_TASKS:
    raise ConfigError('config.sft.blind_fraction is a setting of the built-in tasks '
                      f'{BUILTIN_TASKS}')
  if settings.blind_fraction and c.task.name == 'builtin' and settings.mistake_rate:
    raise ConfigError('config.sft.blind_fraction goes with config.sft.step_mistake_rate in the '
                      'chain; set config.sft.mistake_rate=0')
  return settings


def sampling_settings(c: ml_collections.ConfigDict, section: str,
                      valid_vocab_size: int = 0) -> sampling.SamplingSettings:
  node = c[section]
  with config_section(section):
    return sampling.SamplingSettings(temperature=node.temperature, top_p=node.top_p,
                                     top_k=node.top_k, valid_vocab_size=valid_vocab_size)


def grpo_settings(c: ml_collections.ConfigDict) -> grpo_lib.GRPOSettings:
  with config_section('grpo'):
    settings = grpo_lib.GRPOSettings(
        problems_per_step=c.grpo.problems_per_step, group_size=c.grpo.group_size,
        normalize_std=c.grpo.normalize_std, response_budget=c.controller.response_budget,
        inflight=inflight_settings(c))
  if settings.group_size < 2:
    raise ConfigError(f'config.grpo.group_size must be >= 2, got {settings.group_size}: GRPO\'s '
                      'advantage is a reward minus its group\'s mean, so a group of one learns '
                      'nothing')
  return settings


def critic_warmup_settings(c: ml_collections.ConfigDict
                           ) -> critic_warmup.WarmupSettings | None:
  """The critic warm-up (config.critic.warmup*), None when there is none."""
  if not c.critic.warmup:
    return None
  if c.algorithm != 'ac2':
    raise ConfigError(f'config.critic.warmup warms up the prompt critic of algorithm ac2; '
                      f'algorithm {c.algorithm!r} has none (set \'\')')
  if c.task.name not in BUILTIN_TASKS:
    raise ConfigError(f'config.critic.warmup trains on a built-in task\'s corpus values; task '
                      f'{c.task.name!r} has none (set \'\')')
  rate = c.critic.warmup_mistake_rate
  with config_section('critic'):
    return critic_warmup.WarmupSettings(
        curriculum=critic_warmup.parse_curriculum(c.critic.warmup),
        learning_rate=c.critic.warmup_learning_rate,
        pairs_per_update=c.critic.warmup_pairs_per_update,
        mistake_rate=c.sft.step_mistake_rate if rate < 0 else rate,
        blind_fraction=c.sft.blind_fraction, seed=c.seed)


def value_settings(c: ml_collections.ConfigDict) -> value_critic.ValueSettings:
  """The value critic: a sigmoid head with soft BCE for 'pact', else a linear head with the
  clipped loss ('li2sao' adds its ranking term)."""
  v = c.value_critic
  ranking = (dict(rank_coef=c.li2sao.rank_coef, rank_margin=c.li2sao.rank_margin)
             if c.algorithm == 'li2sao' else {})
  with config_section('li2sao' if ranking else 'value_critic'):
    return value_critic.ValueSettings(
        learning_rate=v.learning_rate, weight_decay=v.weight_decay, grad_clip=v.grad_clip,
        freeze_attention=v.freeze_attention,
        loss='soft_bce' if c.algorithm == 'pact' else 'clipped_mse', value_clip=v.value_clip,
        head_std=v.head_std, **ranking)


def _model_config_at(key: str, path: str) -> ModelConfig:
  """The architecture of the Hugging Face checkpoint dir `path` given as config.KEY."""
  file = os.path.join(path, 'config.json')
  if not os.path.isfile(file):
    raise ConfigError(f'config.{key}={path!r} has no config.json (a Hugging Face checkpoint '
                      'directory)')
  try:
    with open(file) as f:
      return ModelConfig.from_hf_dict(json.load(f))
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise ConfigError(f'config.{key}={path!r}: ' + ' '.join(str(e).split())) from None


def check_value_checkpoint(c: ml_collections.ConfigDict, policy: ModelConfig | None = None
                           ) -> None:
  """config.value_critic.init_checkpoint must hold the policy's architecture: `policy` (the loaded
  one, in `build`), else config.model.init_checkpoint's or the preset's. The preset's vocabulary is
  not compared: the SFT warm start takes the tokenizer's, known once the data is built."""
  key, path = 'value_critic.init_checkpoint', c.value_critic.init_checkpoint
  body = _model_config_at(key, path)
  fields = value_model.BODY_FIELDS
  if policy is None and c.model.init_checkpoint:
    policy = _model_config_at('model.init_checkpoint', c.model.init_checkpoint)
  elif policy is None:
    policy = models.get_config(c.model.preset)
    fields = tuple(f for f in fields if f != 'vocab_size')
  differences = value_model.body_differences(policy, body, fields)
  if differences:
    raise ConfigError(f'config.{key}={path!r} is not of the policy\'s architecture: '
                      + '; '.join(differences))


def _rollout_fields(c: ml_collections.ConfigDict) -> dict:
  section = c[c.algorithm]
  if c.algorithm == 'lisao':
    responses = 1
  elif c.algorithm == 'li2sao':
    responses = section.group_size
  else:
    responses = section.responses_per_problem
  return dict(problems_per_step=section.problems_per_step, responses_per_problem=responses,
              response_budget=c.controller.response_budget,
              critic_updates=c.value_critic.updates,
              critic_warmup_steps=c.value_critic.warmup_steps)


def ppo_settings(c: ml_collections.ConfigDict) -> ppo_lib.PPOSettings:
  with config_section('ppo'):
    return ppo_lib.PPOSettings(**_rollout_fields(c), gamma=c.ppo.gamma, lam=c.ppo.lam)


def pact_settings(c: ml_collections.ConfigDict) -> pact_lib.PACTSettings:
  with config_section('pact'):
    return pact_lib.PACTSettings(**_rollout_fields(c), max_ratio=c.pact.max_ratio,
                                 dis_low=c.pact.dis_low, dis_high=c.pact.dis_high)


def rollout_devices(c: ml_collections.ConfigDict, local_devices: int, processes: int) -> int:
  """Local devices per process of the in-flight worker's rollout sub-mesh (0: none), checked
  against the devices each process has and the mode."""
  check_choice('rollout.mode', c.rollout.mode, ROLLOUT_MODES)
  n = c.rollout.devices
  if not (isinstance(n, int) and n >= 0):
    raise ConfigError(f'config.rollout.devices must be an integer >= 0, got {n!r}')
  if n and c.rollout.mode != 'async':
    raise ConfigError(f"config.rollout.devices={n} needs rollout.mode='async': only the in-flight "
                      'worker generates on a rollout sub-mesh')
  if n >= local_devices:
    raise ConfigError(f'config.rollout.devices={n} leaves no training device: each process has '
                      f'{local_devices} devices (use 0..{local_devices - 1})')
  if c.rollout.mode == 'async' and processes > 1 and not n:
    raise ConfigError(f"config.rollout.mode='async' on {processes} processes needs "
                      'config.rollout.devices >= 1: the worker thread must generate on a '
                      "process-local rollout sub-mesh, never on the training mesh's collectives")
  return n


def inflight_settings(c: ml_collections.ConfigDict) -> InflightSettings | None:
  """The in-flight rollout worker's settings (rollout.mode='async'), or None (synchronous)."""
  check_choice('rollout.mode', c.rollout.mode, ROLLOUT_MODES)
  if c.rollout.mode == 'sync':
    return None
  if c.algorithm not in ASYNC_ALGORITHMS:
    raise ConfigError(f"config.rollout.mode='async' needs algorithm in {ASYNC_ALGORITHMS}, got "
                      f'{c.algorithm!r}')
  with config_section('rollout'):
    return InflightSettings(max_policy_lag=c.rollout.max_policy_lag,
                            segment_tokens=c.rollout.segment_tokens,
                            response_budget=c.controller.response_budget)


def _sao_fields(c: ml_collections.ConfigDict) -> dict:
  section = c[c.algorithm]
  return dict(**_rollout_fields(c), gamma=section.gamma, lambda_alpha=section.lambda_alpha,
              dis_low=section.dis_low, dis_high=section.dis_high, inflight=inflight_settings(c))


def lisao_settings(c: ml_collections.ConfigDict) -> lisao_lib.LiSAOSettings:
  with config_section('lisao'):
    return lisao_lib.LiSAOSettings(**_sao_fields(c))


def li2sao_settings(c: ml_collections.ConfigDict) -> li2sao_lib.Li2SAOSettings:
  l2 = c.li2sao
  with config_section('li2sao'):
    gate = GateSettings(ema_beta=l2.ema_beta, min_explained_variance=l2.min_explained_variance,
                        min_ranking_accuracy=l2.min_ranking_accuracy, ready_steps=l2.ready_steps,
                        min_steps=l2.min_steps, max_steps=l2.max_steps)
    return li2sao_lib.Li2SAOSettings(**_sao_fields(c), gate=gate, eps=l2.eps)


def _check_learns(c: ml_collections.ConfigDict, ctl_settings: ctl.ControllerSettings) -> None:
  """Settings under which the algorithm would run and never change the weights."""
  if not c.actor.learning_rate > 0:
    raise ConfigError(f'config.actor.learning_rate must be > 0, got {c.actor.learning_rate!r}')
  if not (isinstance(c.actor.minibatches, int) and c.actor.minibatches >= 1):
    raise ConfigError(f'config.actor.minibatches must be an integer >= 1, '
                      f'got {c.actor.minibatches!r}')
  if c.algorithm == 'grpo' or c.algorithm in VALUE_ALGORITHMS:
    return
  if ctl_settings.n_batch < 1:
    raise ConfigError(f'config.controller.n_batch must be >= 1 for {c.algorithm}, got '
                      f'{ctl_settings.n_batch}: refill rollouts are never trained on, so no '
                      'replay slots means no actor updates')
  if ctl_settings.group_size < 2 and not ctl_settings.group_size_one:
    raise ConfigError(f'config.controller.group_size must be >= 2 for {c.algorithm}, got '
                      f'{ctl_settings.group_size}: the advantage is a value minus its group\'s '
                      'mean, so a group of one learns nothing (controller.group_size_one=True is '
                      'the variant with a critic baseline)')
  if ctl_settings.group_size_one and c.algorithm != 'ac2':
    raise ConfigError('config.controller.group_size_one=True needs algorithm=ac2 (its baseline is '
                      f'the critic\'s value), got {c.algorithm!r}')


def _check_li2sao_groups(c: ml_collections.ConfigDict, s: li2sao_lib.Li2SAOSettings) -> None:
  """A bootstrap group must not straddle an actor/critic minibatch or a critic micro-batch: its
  ranking pairs and divergence mask are read inside one batch."""
  if s.problems_per_step % c.actor.minibatches:
    raise ConfigError(f'config.li2sao.problems_per_step={s.problems_per_step} must be a multiple '
                      f'of config.actor.minibatches={c.actor.minibatches} (whole groups per '
                      'minibatch)')
  if c.actor.micro_batch % s.responses_per_problem:
    raise ConfigError(f'config.actor.micro_batch={c.actor.micro_batch} must be a multiple of '
                      f'config.li2sao.group_size={s.responses_per_problem} (whole groups per '
                      'micro-batch)')


@dataclasses.dataclass(frozen=True)
class Settings:
  """Every settings object of a run, built from the config before any work (`validate`)."""
  run: RunSettings
  controller: ctl.ControllerSettings
  train_sampling: sampling.SamplingSettings
  eval_sampling: sampling.SamplingSettings
  mesh: sharding.MeshConfig
  mesh_shape: tuple[int, int, int]
  rollout_devices: int                      # per process, of the in-flight worker's sub-mesh
  builtin: builtin.ChainSettings | walk.WalkSettings | None  # a built-in task's rules
  sft: sft_lib.SFTSettings | None           # when the run starts from the SFT warm start
  grpo: grpo_lib.GRPOSettings | None
  ppo: ppo_lib.PPOSettings | None
  pact: pact_lib.PACTSettings | None
  lisao: lisao_lib.LiSAOSettings | None
  li2sao: li2sao_lib.Li2SAOSettings | None
  value: value_critic.ValueSettings | None  # the separate value critic (VALUE_ALGORITHMS)
  judges: tuple | None                      # the proof task: (training, validation) settings


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None) -> Settings:
  """Builds every settings object from the config, reading no data and writing nothing.

  Raises ConfigError (one line naming the key and the allowed values) for the first bad key;
  `loop.train` calls it before anything is written to the workdir.
  """
  run = run_settings(c)
  check_choice('algorithm', c.algorithm, ALGORITHMS)
  check_choice('task.name', c.task.name, TASKS)
  check_choice('model.dtype', c.model.dtype, DTYPES)
  check_choice('model.attention_impl', c.model.attention_impl, ATTENTION_IMPLS)
  check_choice('critic.readout', c.critic.readout, rows_lib.READOUTS)
  check_choice('critic.target', c.critic.target, critic_lib.TARGETS)
  if c.critic.target == 'two_hot' and c.critic.readout != 'expectation':
    raise ConfigError(f'config.critic.target=two_hot trains a value distribution whose mean is '
                      f'the target, and config.critic.readout={c.critic.readout!r} reads its mode; '
                      f'set config.critic.readout=expectation')
  for marks in ('self_check', 'reference_check'):
    if c.critic[marks] and (c.task.name != 'builtin' or c.algorithm != 'ac2'):
      raise ConfigError(f'config.critic.{marks} marks the worked lines of the built-in chain '
                        f'(task.name=builtin) for the prompt critic of algorithm ac2; got '
                        f'task.name={c.task.name!r}, algorithm={c.algorithm!r}')
  if c.critic.self_check and c.critic.reference_check:
    raise ConfigError('config.critic.self_check and config.critic.reference_check both mark the '
                      'worked lines; set one')
  if c.controller.cut_before_uncredited and c.task.name != 'builtin':
    raise ConfigError(f'config.controller.cut_before_uncredited cuts before the first line the '
                      f"built-in chain's scoring does not credit (task.name=builtin); got "
                      f'task.name={c.task.name!r}')
  if c.model.init_checkpoint:
    if not os.path.isfile(os.path.join(c.model.init_checkpoint, 'config.json')):
      raise ConfigError(f'config.model.init_checkpoint={c.model.init_checkpoint!r} has no '
                        'config.json (a Hugging Face checkpoint directory)')
  else:
    check_choice('model.preset', c.model.preset, models.PRESET_NAMES)
  for key, value in (('model.logits_chunk', c.model.logits_chunk),
                     ('task.rl_problems', c.task.rl_problems),
                     ('actor.micro_batch', c.actor.micro_batch),
                     ('critic.max_context', c.critic.max_context),
                     ('critic.adapter_rank', c.critic.adapter_rank)):
    if not (isinstance(value, int) and value >= 0):
      raise ConfigError(f'config.{key} must be an integer >= 0, got {value!r}')
  if c.critic.adapter_rank and c.algorithm != 'ac2':
    raise ConfigError(f'config.critic.adapter_rank={c.critic.adapter_rank} adapts the prompt '
                      f'critic of algorithm ac2; algorithm {c.algorithm!r} has none (set 0)')
  critic_warmup_settings(c)  # its refusals, before anything is written
  if not (isinstance(c.sampling.max_batch, int) and c.sampling.max_batch >= 1):
    raise ConfigError(f'config.sampling.max_batch must be an integer >= 1, '
                      f'got {c.sampling.max_batch!r}')
  ctl_settings = controller_settings(c)
  grpo = grpo_settings(c) if c.algorithm == 'grpo' else None
  ppo = ppo_settings(c) if c.algorithm == 'ppo' else None
  pact = pact_settings(c) if c.algorithm == 'pact' else None
  inflight_settings(c)  # rollout.mode, for every algorithm
  lisao = lisao_settings(c) if c.algorithm == 'lisao' else None
  li2sao = li2sao_settings(c) if c.algorithm == 'li2sao' else None
  value = value_settings(c) if c.algorithm in VALUE_ALGORITHMS else None
  if value is not None and c.value_critic.init_checkpoint:
    check_value_checkpoint(c)
  _check_learns(c, ctl_settings)
  if li2sao is not None:
    _check_li2sao_groups(c, li2sao)
  processes = jax.process_count()
  sao = grpo or lisao or li2sao
  if sao is not None and sao.inflight and sao.problems_per_step % processes:
    raise ConfigError(f'config.{c.algorithm}.problems_per_step={sao.problems_per_step} must be a '
                      f"multiple of the {processes} processes with rollout.mode='async' (each "
                      'generates its share of a batch in whole groups)')
  if c.algorithm in ('grpo', 'ppo', 'pact', 'lisao'):
    per_step = c[c.algorithm].problems_per_step
  elif c.algorithm == 'li2sao':
    per_step = li2sao.trajectories  # after the switch: one response per problem
  else:
    per_step = c.controller.n_refill
  if 0 < c.task.rl_problems < per_step:
    raise ConfigError(f'config.task.rl_problems={c.task.rl_problems} is fewer than the '
                      f'{per_step} distinct problems a step draws')
  mesh = sharding.MeshConfig(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  devices = num_devices or jax.device_count()
  rollout = rollout_devices(c, devices // processes, processes)
  devices -= rollout * processes  # the training mesh: what the rollout sub-meshes leave
  with config_section('mesh'):
    try:
      mesh_shape = mesh.resolve(devices)
    except ValueError as e:
      raise ValueError(f'{e} ({devices} training devices'
                       + (f' beside {rollout} rollout devices per process)' if rollout else ')')
                       ) from None
  builtin_task = sft = judge_settings = None
  if c.task.name in BUILTIN_TASKS:
    builtin_task = builtin_settings(c)
    if not (isinstance(c.task.builtin_vocab_size, int) and c.task.builtin_vocab_size >= 1):
      raise ConfigError(f'config.task.builtin_vocab_size must be an integer >= 1, '
                        f'got {c.task.builtin_vocab_size!r}')
    if not c.model.init_checkpoint:
      sft = sft_settings(c)
  else:
    if not c.model.init_checkpoint:
      raise ConfigError('the proof task needs config.model.init_checkpoint (its tokenizer.json); '
                        'only the built-in task has an SFT warm start')
    for key in ('proofs_train_dir', 'proofs_validation_dir'):
      if not c.task[key]:
        raise ConfigError(f'the proof task needs config.task.{key}')
      if not os.path.isdir(c.task[key]):
        raise ConfigError(f'config.task.{key}={c.task[key]!r} is not a directory')
    judge_settings = judge_settings_of(c)
  return Settings(run=run, controller=ctl_settings,
                  train_sampling=sampling_settings(c, 'sampling'),
                  eval_sampling=sampling_settings(c, 'eval'), mesh=mesh, mesh_shape=mesh_shape,
                  rollout_devices=rollout,
                  builtin=builtin_task, sft=sft, grpo=grpo, ppo=ppo, pact=pact, lisao=lisao,
                  li2sao=li2sao, value=value,
                  judges=judge_settings)


def judge_settings_of(c: ml_collections.ConfigDict) -> tuple:
  """(training, validation) HttpJudgeSettings of the proof task."""
  from ac2_jax import judges  # Only the proof task talks HTTP.
  if not c.judge.base_url:
    raise ConfigError('the proof task needs config.judge.base_url (an OpenAI-compatible server)')
  with config_section('judge'):
    return tuple(judges.HttpJudgeSettings(
        base_url=c.judge.base_url, model=c.judge.model, mode=mode,
        api_key_env=c.judge.api_key_env or None, max_concurrency=c.judge.max_concurrency,
        timeout_s=c.judge.timeout_s) for mode in ('training', 'validation'))
