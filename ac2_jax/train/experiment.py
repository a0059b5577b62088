"""Builds a run from its config: task, tokenizer, model weights, mesh, runtime and algorithm.

This is the only module that reads the ConfigDict; everything else takes typed values: the host
loop its `RunSettings`, a dry run its `dry_run.Plan`, the algorithms their settings and the
learner's `Runtime`.
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
from ac2_jax import models, sampling, sharding, tokenization
from ac2_jax.algorithms import ac2 as ac2_lib
from ac2_jax.algorithms import base as algorithm_base
from ac2_jax.algorithms import grpo as grpo_lib
from ac2_jax.algorithms import pact as pact_lib
from ac2_jax.algorithms import ppo as ppo_lib
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner import runtime as runtime_lib
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.learner import value_critic
from ac2_jax.models import value as value_model
from ac2_jax.models.config import ModelConfig
from ac2_jax.tasks import builtin, builtin_sft, builtin_tfds
from ac2_jax.train import distributed, dry_run
from ac2_jax.train import sft as sft_lib
from ac2_jax.train.sizes import RunSizes

ALGORITHMS = ('ac2', 'prefix_grpo', 'grpo', 'ppo', 'pact')
# Algorithms with a separate value-head critic (learner/value_critic.py), and their config section.
VALUE_ALGORITHMS = ('ppo', 'pact')
TASKS = ('builtin', 'proofs')
DTYPES = ('float32', 'bfloat16')
ATTENTION_IMPLS = ('xla', 'pallas')


# Folded into the seed's key for the value head's initial weights.
VALUE_HEAD_KEY = 0x7A1E


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
                     config_json=c.to_json_best_effort(indent=2))


def run_sizes(c: ml_collections.ConfigDict, prompt_tokens: int) -> RunSizes:
  """The run's sizes, for a run (its longest prompt) and a dry run (an assumed one) alike."""
  ctl_c = c.controller
  if c.algorithm == 'grpo':
    rows = c.grpo.problems_per_step * c.grpo.group_size
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
  """What `dry_run.run` checks; a -1 mesh axis takes `num_devices` (default: the devices present)."""
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
    if c.task.name == 'builtin':
      overrides['vocab_size'] = c.task.builtin_vocab_size
    model = models.get_config(c.model.preset, **overrides)
    source = f'preset {c.model.preset!r}'
    if c.model.init_checkpoint:
      source += f' ({hf_config} is not here)'
  axes = (c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  devices = math.prod(axes) if -1 not in axes else (num_devices or jax.device_count())
  return dry_run.Plan(model=model, model_source=source,
                      mesh_shape=sharding.MeshConfig(*axes).resolve(devices),
                      sizes=run_sizes(c, dry_run.PROMPT_TOKENS[c.task.name]),
                      value=value_settings(c) if c.algorithm in VALUE_ALGORITHMS else None)


@contextlib.contextmanager
def _section(name: str):
  """A settings object's own error (ValueError, TypeError) as a ConfigError naming its section."""
  try:
    yield
  except ConfigError:
    raise
  except (ValueError, TypeError) as e:
    raise ConfigError(f'config.{name}: ' + ' '.join(str(e).split())) from None


def _choice(key: str, value, allowed: tuple) -> None:
  if value not in allowed:
    raise ConfigError(f'config.{key} must be one of {allowed}, got {value!r}')


def controller_settings(c: ml_collections.ConfigDict) -> ctl.ControllerSettings:
  with _section('controller'):
    return ctl.ControllerSettings(**c.controller.to_dict())


def chain_settings(c: ml_collections.ConfigDict) -> builtin.ChainSettings:
  with _section('task (builtin_*)'):
    return builtin.ChainSettings(steps=c.task.builtin_steps, modulus=c.task.builtin_modulus,
                                 ops=c.task.builtin_ops, num_train=c.task.builtin_num_train,
                                 num_validation=c.task.builtin_num_validation, seed=c.seed,
                                 scoring=c.task.builtin_scoring,
                                 critic_prompt=c.task.builtin_critic_prompt)


def sft_settings(c: ml_collections.ConfigDict) -> sft_lib.SFTSettings:
  with _section('sft'):
    settings = sft_lib.SFTSettings(**c.sft.to_dict(), seed=c.seed)
  for key in ('steps', 'batch_size', 'seq_len'):
    if getattr(settings, key) < 1:
      raise ConfigError(f'config.sft.{key} must be >= 1, got {getattr(settings, key)!r}')
  return settings


def sampling_settings(c: ml_collections.ConfigDict, section: str,
                      valid_vocab_size: int = 0) -> sampling.SamplingSettings:
  node = c[section]
  with _section(section):
    return sampling.SamplingSettings(temperature=node.temperature, top_p=node.top_p,
                                     top_k=node.top_k, valid_vocab_size=valid_vocab_size)


def grpo_settings(c: ml_collections.ConfigDict) -> grpo_lib.GRPOSettings:
  with _section('grpo'):
    settings = grpo_lib.GRPOSettings(
        problems_per_step=c.grpo.problems_per_step, group_size=c.grpo.group_size,
        normalize_std=c.grpo.normalize_std, response_budget=c.controller.response_budget)
  if settings.group_size < 2:
    raise ConfigError(f'config.grpo.group_size must be >= 2, got {settings.group_size}: GRPO\'s '
                      'advantage is a reward minus its group\'s mean, so a group of one learns '
                      'nothing')
  return settings


def value_settings(c: ml_collections.ConfigDict) -> value_critic.ValueSettings:
  """The value critic of 'ppo' (linear head, clipped MSE) or 'pact' (sigmoid head, soft BCE)."""
  v = c.value_critic
  with _section('value_critic'):
    return value_critic.ValueSettings(
        learning_rate=v.learning_rate, weight_decay=v.weight_decay, grad_clip=v.grad_clip,
        freeze_attention=v.freeze_attention,
        loss='soft_bce' if c.algorithm == 'pact' else 'clipped_mse', value_clip=v.value_clip,
        head_std=v.head_std)


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
  return dict(problems_per_step=section.problems_per_step,
              responses_per_problem=section.responses_per_problem,
              response_budget=c.controller.response_budget,
              critic_updates=c.value_critic.updates,
              critic_warmup_steps=c.value_critic.warmup_steps)


def ppo_settings(c: ml_collections.ConfigDict) -> ppo_lib.PPOSettings:
  with _section('ppo'):
    return ppo_lib.PPOSettings(**_rollout_fields(c), gamma=c.ppo.gamma, lam=c.ppo.lam)


def pact_settings(c: ml_collections.ConfigDict) -> pact_lib.PACTSettings:
  with _section('pact'):
    return pact_lib.PACTSettings(**_rollout_fields(c), max_ratio=c.pact.max_ratio,
                                 dis_low=c.pact.dis_low, dis_high=c.pact.dis_high)


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


@dataclasses.dataclass(frozen=True)
class Settings:
  """Every settings object of a run, built from the config before any work (`validate`)."""
  run: RunSettings
  controller: ctl.ControllerSettings
  train_sampling: sampling.SamplingSettings
  eval_sampling: sampling.SamplingSettings
  mesh: sharding.MeshConfig
  mesh_shape: tuple[int, int, int]
  chain: builtin.ChainSettings | None       # the built-in task
  sft: sft_lib.SFTSettings | None           # when the run starts from the SFT warm start
  grpo: grpo_lib.GRPOSettings | None
  ppo: ppo_lib.PPOSettings | None
  pact: pact_lib.PACTSettings | None
  value: value_critic.ValueSettings | None  # the separate value critic (VALUE_ALGORITHMS)
  judges: tuple | None                      # the proof task: (training, validation) settings


def validate(c: ml_collections.ConfigDict, num_devices: int | None = None) -> Settings:
  """Builds every settings object from the config, reading no data and writing nothing.

  Raises ConfigError (one line naming the key and the allowed values) for the first bad key;
  `loop.train` calls it before anything is written to the workdir.
  """
  run = run_settings(c)
  _choice('algorithm', c.algorithm, ALGORITHMS)
  _choice('task.name', c.task.name, TASKS)
  _choice('model.dtype', c.model.dtype, DTYPES)
  _choice('model.attention_impl', c.model.attention_impl, ATTENTION_IMPLS)
  _choice('critic.readout', c.critic.readout, rows_lib.READOUTS)
  if c.model.init_checkpoint:
    if not os.path.isfile(os.path.join(c.model.init_checkpoint, 'config.json')):
      raise ConfigError(f'config.model.init_checkpoint={c.model.init_checkpoint!r} has no '
                        'config.json (a Hugging Face checkpoint directory)')
  else:
    _choice('model.preset', c.model.preset, models.PRESET_NAMES)
  for key, value in (('model.logits_chunk', c.model.logits_chunk),
                     ('task.rl_problems', c.task.rl_problems),
                     ('actor.micro_batch', c.actor.micro_batch),
                     ('critic.max_context', c.critic.max_context)):
    if not (isinstance(value, int) and value >= 0):
      raise ConfigError(f'config.{key} must be an integer >= 0, got {value!r}')
  if not (isinstance(c.sampling.max_batch, int) and c.sampling.max_batch >= 1):
    raise ConfigError(f'config.sampling.max_batch must be an integer >= 1, '
                      f'got {c.sampling.max_batch!r}')
  ctl_settings = controller_settings(c)
  grpo = grpo_settings(c) if c.algorithm == 'grpo' else None
  ppo = ppo_settings(c) if c.algorithm == 'ppo' else None
  pact = pact_settings(c) if c.algorithm == 'pact' else None
  value = value_settings(c) if c.algorithm in VALUE_ALGORITHMS else None
  if value is not None and c.value_critic.init_checkpoint:
    check_value_checkpoint(c)
  _check_learns(c, ctl_settings)
  per_step = (c[c.algorithm].problems_per_step if c.algorithm in ('grpo', 'ppo', 'pact')
              else c.controller.n_refill)
  if 0 < c.task.rl_problems < per_step:
    raise ConfigError(f'config.task.rl_problems={c.task.rl_problems} is fewer than the '
                      f'{per_step} distinct problems a step draws')
  mesh = sharding.MeshConfig(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)
  devices = num_devices or jax.device_count()
  with _section('mesh'):
    try:
      mesh_shape = mesh.resolve(devices)
    except ValueError as e:
      raise ValueError(f'{e} (this process sees {devices} devices)') from None
  chain = sft = judge_settings = None
  if c.task.name == 'builtin':
    chain = chain_settings(c)
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
                  chain=chain, sft=sft, grpo=grpo, ppo=ppo, pact=pact, value=value,
                  judges=judge_settings)


def judge_settings_of(c: ml_collections.ConfigDict) -> tuple:
  """(training, validation) HttpJudgeSettings of the proof task."""
  from ac2_jax import judges  # Only the proof task talks HTTP.
  if not c.judge.base_url:
    raise ConfigError('the proof task needs config.judge.base_url (an OpenAI-compatible server)')
  with _section('judge'):
    return tuple(judges.HttpJudgeSettings(
        base_url=c.judge.base_url, model=c.judge.model, mode=mode,
        api_key_env=c.judge.api_key_env or None, max_concurrency=c.judge.max_concurrency,
        timeout_s=c.judge.timeout_s) for mode in ('training', 'validation'))


def build_task(c: ml_collections.ConfigDict, workdir: str, tokenizer_dir: str | None):
  """(task, tokenizer) for config.task.name."""
  data_dir = c.task.data_dir or os.path.join(workdir, 'data')
  _choice('task.name', c.task.name, TASKS)
  if c.task.name == 'builtin':
    return builtin_tfds.build_builtin(data_dir, chain_settings(c),
                                      vocab_size=c.task.builtin_vocab_size)
  from ac2_jax import judges  # Only the proof task talks HTTP.
  from ac2_jax.tasks import proofs, proofs_tfds
  if not tokenizer_dir:
    raise ConfigError('the proof task needs config.model.init_checkpoint (its tokenizer.json)')
  for key in ('proofs_train_dir', 'proofs_validation_dir'):
    if not c.task[key]:
      raise ConfigError(f'the proof task needs config.task.{key}')
  training, validation = judge_settings_of(c)
  skip = c.task.skip_malformed
  data = proofs.ProofDataSettings(
      train_manual_dir=c.task.proofs_train_dir,
      validation_manual_dir=c.task.proofs_validation_dir, data_dir=data_dir,
      train=dataclasses.replace(proofs_tfds.FINEPROOFS_RL, skip_malformed=skip),
      validation=dataclasses.replace(proofs_tfds.IMO_PROOFBENCH, skip_malformed=skip))
  try:
    tok = tokenization.HFTokenizer.from_file(tokenizer_dir)
    # Process 0 calls the server and broadcasts the grades (see train/distributed.py).
    task = proofs.make_proof_task(
        data, train_judge=distributed.MainProcessJudge(judges.HttpJudge(training)),
        validation_judge=distributed.MainProcessJudge(judges.HttpJudge(validation)),
        tokenizer=tok)
  except (OSError, ValueError) as e:
    # A bad data file or tokenizer.json is the user's to fix: one line, and the message already
    # names the file (and row) (tasks/proofs_files.py, tokenization.py).
    raise ConfigError(' '.join(str(e).split())) from None
  return task, tok


def sft_directory(workdir: str, key: str) -> str:
  """WORKDIR/sft, or WORKDIR/sft_KEY when WORKDIR/sft holds a finished warm start of other settings
  (so a warm start of one set of settings never overwrites another's)."""
  default = os.path.join(workdir, 'sft')
  done = os.path.join(default, sft_lib.DONE_FILE)
  if not os.path.exists(done) or sft_lib.done_key(default) == key:
    return default
  return os.path.join(workdir, f'sft_{key}')


def initial_checkpoint(c: ml_collections.ConfigDict, workdir: str, task, tok, log=print) -> str:
  """The HF checkpoint the run starts from: the configured one, or the (cached) SFT warm start."""
  if c.model.init_checkpoint:
    if not os.path.isfile(os.path.join(c.model.init_checkpoint, 'config.json')):
      raise ConfigError(f'config.model.init_checkpoint={c.model.init_checkpoint!r} has no '
                        f'config.json')
    return c.model.init_checkpoint
  if c.task.name != 'builtin':
    raise ConfigError('only the built-in task has an SFT warm start; set '
                      'config.model.init_checkpoint')
  _choice('model.preset', c.model.preset, models.PRESET_NAMES)
  model_config = models.get_config(c.model.preset, vocab_size=tok.vocab_size)
  settings = sft_settings(c)
  examples = builtin_sft.sft_examples(
      task, tok, mistake_rate=settings.mistake_rate, step_mistake_rate=settings.step_mistake_rate,
      seed=c.seed, epochs=None, clean_first=settings.clean_steps * settings.batch_size)
  critic_examples = builtin_sft.critic_examples(
      task, tok, step_mistake_rate=settings.step_mistake_rate, seed=c.seed + 1)
  data_key = task.name + repr(task.settings)
  out_dir = sft_directory(workdir, sft_lib.settings_key(model_config, settings, data_key))
  return sft_lib.run_sft(model_config, settings, examples, out_dir, data_key=data_key,
                         critic_examples=critic_examples, log=log)


def build(c: ml_collections.ConfigDict, workdir: str, log=print, settings: Settings | None = None
          ) -> tuple[runtime_lib.Runtime, algorithm_base.Algorithm, state_lib.TrainState]:
  """Returns (runtime, algorithm, initial train state) for the config (`validate`d first)."""
  s = settings or validate(c)
  tokenizer_dir = c.model.init_checkpoint or None
  # Process 0 writes the data set and the warm start; the others then read them (shared files).
  with distributed.main_process_first('build_task'):
    task, tok = build_task(c, workdir, tokenizer_dir)
  with distributed.main_process_first('initial_checkpoint'):
    checkpoint = initial_checkpoint(c, workdir, task, tok, log=log)
  mesh = sharding.make_mesh(s.mesh)
  load = dict(mesh=mesh, dtype=c.model.dtype, attention_impl=c.model.attention_impl,
              pallas_backend=c.model.pallas_backend or None, remat=c.model.remat)
  try:
    model_config, params = models.load_hf_checkpoint(checkpoint, **load)
  except (OSError, ValueError) as e:
    # A truncated or foreign checkpoint is the user's to fix: one line, and the loader's message
    # already names the file (models/checkpoint.py).
    raise ConfigError(f'checkpoint {checkpoint} does not load: ' + ' '.join(str(e).split())
                      ) from None
  with _section('model'):
    models.check_vocabulary(model_config, tok.vocab_size, where=checkpoint)
  # A checkpoint whose embedding is padded past the tokenizer: the padding ids are never drawn
  # (samplers, critic reads) nor normalised over (the learner's log-probs), one value for all.
  valid_vocab = tok.vocab_size if model_config.vocab_size > tok.vocab_size else 0
  update_settings = update_settings_of(c, model_config, valid_vocab, s.pact)
  longest_prompt = max(len(task.prompt_ids(tok, r))
                       for split in ('train', 'validation') for r in task.records(split))
  sizes = run_sizes(c, longest_prompt)
  if s.value is None:
    state = state_lib.init_state(params, update_settings.optim)
  else:
    body = params
    if c.value_critic.init_checkpoint:
      check_value_checkpoint(c, model_config)  # the vocabulary too, now that it is known
      body = models.load_hf_checkpoint(c.value_critic.init_checkpoint, **load)[1]
    value_params = value_model.init_value_params(
        model_config, body, jax.random.fold_in(jax.random.key(c.seed), VALUE_HEAD_KEY),
        head_std=s.value.head_std)
    del body  # a loaded checkpoint's tree was copied into value_params: free it now
    state = value_critic.init_state(params, value_params, update_settings.optim, s.value)
  state = runtime_lib.place_state(state, mesh)
  rt = runtime_lib.build_runtime(
      model_config=model_config, tokenizer=tok, task=task, mesh=mesh,
      update_settings=update_settings,
      train_sampling=dataclasses.replace(s.train_sampling, valid_vocab_size=valid_vocab),
      eval_sampling=dataclasses.replace(s.eval_sampling, valid_vocab_size=valid_vocab),
      max_total_len=sizes.max_total_len, max_sample_batch=sizes.max_sample_batch,
      actor_minibatches=sizes.actor_minibatches, state=state, critic_readout=c.critic.readout,
      value_settings=s.value, train_problems=c.task.rl_problems)

  if c.algorithm == 'grpo':
    algorithm = grpo_lib.GRPO(rt, s.grpo, s.controller, c.seed)
  elif c.algorithm == 'ppo':
    algorithm = ppo_lib.PPO(rt, s.ppo, s.controller, c.seed)
  elif c.algorithm == 'pact':
    algorithm = pact_lib.PACT(rt, s.pact, c.seed)
  else:
    algorithm = ac2_lib.AC2(rt, s.controller, c.seed, use_critic=c.algorithm == 'ac2')
  return rt, algorithm, state


def update_settings_of(c: ml_collections.ConfigDict, model_config: ModelConfig,
                       valid_vocab_size: int = 0,
                       pact: pact_lib.PACTSettings | None = None) -> updates.UpdateSettings:
  """The jitted updates' static settings for `model_config` (PACT's DIS actor loss with `pact`)."""
  return updates.UpdateSettings(
      model=model_config,
      optim=state_lib.OptimSettings(actor_lr=c.actor.learning_rate,
                                    actor_weight_decay=c.actor.weight_decay,
                                    actor_grad_clip=c.actor.grad_clip,
                                    critic_grad_clip=c.critic.grad_clip),
      temperature=c.sampling.temperature, eps_low=c.actor.eps_low,
      dual_clip=c.actor.dual_clip or None, micro_batch=c.actor.micro_batch,
      logits_chunk=c.model.logits_chunk, valid_vocab_size=valid_vocab_size,
      **(dict(policy_loss='dis', dis_low=pact.dis_low, dis_high=pact.dis_high) if pact else {}))


def step_key(seed: int, step: int) -> jax.Array:
  """The PRNG key of a step: a pure function of (seed, step), so a resumed run draws the same."""
  return jax.random.fold_in(jax.random.key(seed), step)
