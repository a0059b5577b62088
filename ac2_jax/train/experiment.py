"""Builds a run from its config: task, tokenizer, model weights, mesh, runtime and algorithm.

With `validation.py` (the config read into typed settings and checked), this is the only module
that reads the ConfigDict; everything else takes typed values: the host loop its `RunSettings`, a
dry run its `dry_run.Plan`, the algorithms their settings and the learner's `Runtime`.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections

from ac2_jax import models, sharding, tokenization
from ac2_jax.algorithms import ac2 as ac2_lib
from ac2_jax.algorithms import base as algorithm_base
from ac2_jax.algorithms import grpo as grpo_lib
from ac2_jax.algorithms import li2sao as li2sao_lib
from ac2_jax.algorithms import lisao as lisao_lib
from ac2_jax.algorithms import pact as pact_lib
from ac2_jax.algorithms import ppo as ppo_lib
from ac2_jax.learner import critic_adapter
from ac2_jax.learner import runtime as runtime_lib
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.learner import value_critic
from ac2_jax.models import value as value_model
from ac2_jax.models.config import ModelConfig
from ac2_jax.tasks import builtin_sft, builtin_tfds
from ac2_jax.train import critic_warmup, distributed
from ac2_jax.train import sft as sft_lib
# The launchers, tests and benchmarks reach the validation half through this module too.
from ac2_jax.train.validation import (  # noqa: F401
    ALGORITHMS, BUILTIN_TASKS, VALUE_ALGORITHMS, ConfigError, RunSettings, Settings, TASKS,
    builtin_settings, chain_settings, critic_warmup_settings,
    check_value_checkpoint, check_choice, controller_settings, dry_run_plan, judge_settings_of,
    run_settings, run_sizes, config_section, sft_settings, validate)

# Folded into the seed's key for the value head's initial weights, and the critic adapter's.
VALUE_HEAD_KEY = 0x7A1E
CRITIC_ADAPTER_KEY = 0xADA7

def build_task(c: ml_collections.ConfigDict, workdir: str, tokenizer_dir: str | None):
  """(task, tokenizer) for config.task.name."""
  data_dir = c.task.data_dir or os.path.join(workdir, 'data')
  check_choice('task.name', c.task.name, TASKS)
  if c.task.name in BUILTIN_TASKS:
    return builtin_tfds.build_builtin(data_dir, builtin_settings(c),
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
  if c.task.name not in BUILTIN_TASKS:
    raise ConfigError('only the built-in tasks have an SFT warm start; set '
                      'config.model.init_checkpoint')
  check_choice('model.preset', c.model.preset, models.PRESET_NAMES)
  model_config = models.get_config(c.model.preset, vocab_size=tok.vocab_size)
  settings = sft_settings(c)
  examples = builtin_sft.sft_examples(
      task, tok, mistake_rate=settings.mistake_rate, step_mistake_rate=settings.step_mistake_rate,
      seed=c.seed, epochs=None, clean_first=settings.clean_steps * settings.batch_size,
      blind_fraction=settings.blind_fraction)
  clean_examples = builtin_sft.sft_examples(task, tok, mistake_rate=0.0, seed=c.seed + 2,
                                            epochs=None, blind_fraction=settings.blind_fraction)
  value_rate = settings.critic_value_mistake_rate
  critic_examples = builtin_sft.critic_examples(
      task, tok, step_mistake_rate=settings.step_mistake_rate, seed=c.seed + 1,
      value_step_mistake_rate=None if value_rate < 0 else value_rate,
      blind_fraction=settings.blind_fraction)
  data_key = task.name + repr(task.settings)
  out_dir = sft_directory(workdir, sft_lib.settings_key(model_config, settings, data_key))
  return sft_lib.run_sft(model_config, settings, examples, out_dir, data_key=data_key,
                         critic_examples=critic_examples, clean_examples=clean_examples, log=log)


def critic_marks(c: ml_collections.ConfigDict) -> str:
  """The runtime's `critic_marks` of the config's critic.self_check / critic.reference_check."""
  return 'self' if c.critic.self_check else 'reference' if c.critic.reference_check else ''


def critic_warmup_key(c: ml_collections.ConfigDict, checkpoint: str) -> str:
  """The cache key of the run's critic warm-up from the HF checkpoint `checkpoint`: its resolved
  settings, the task (prompts, data), the model, and the critic keys its update reads."""
  critic = {k: c.critic[k] for k in ('adapter_rank', 'max_context', 'grad_clip', 'target')}
  if c.critic.self_check:  # marked prompts train another critic (keys from before it unchanged)
    critic['self_check'] = True
  if c.critic.reference_check:
    critic['reference_check'] = True
  return critic_warmup.cache_key(critic_warmup_settings(c), checkpoint, json.dumps(
      [c.task.to_dict(), critic, c.model.to_dict()], sort_keys=True, default=str))


def _policy_loss(s: Settings) -> dict:
  """The UpdateSettings fields of the actor loss: DIS with the algorithm's band, or PPO's clip."""
  dis = s.pact or s.lisao or s.li2sao
  return dict(policy_loss='dis', dis_low=dis.dis_low, dis_high=dis.dis_high) if dis else {}


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
  training_devices, rollout_devices = sharding.split_rollout_devices(s.rollout_devices)
  mesh = sharding.make_mesh(s.mesh, training_devices)
  rollout_mesh = sharding.rollout_mesh(rollout_devices) if rollout_devices else None
  if rollout_mesh is not None:
    log(f'training mesh: {len(training_devices)} devices (ids '
        f'{[d.id for d in training_devices]}); rollout sub-mesh of each process: '
        f'{len(rollout_devices)} local devices (here ids {[d.id for d in rollout_devices]})')
  load = dict(mesh=mesh, dtype=c.model.dtype, attention_impl=c.model.attention_impl,
              pallas_backend=c.model.pallas_backend or None, remat=c.model.remat)
  try:
    model_config, params = models.load_hf_checkpoint(checkpoint, **load)
  except (OSError, ValueError) as e:
    # A truncated or foreign checkpoint is the user's to fix: one line, and the loader's message
    # already names the file (models/checkpoint.py).
    raise ConfigError(f'checkpoint {checkpoint} does not load: ' + ' '.join(str(e).split())
                      ) from None
  with config_section('model'):
    models.check_vocabulary(model_config, tok.vocab_size, where=checkpoint)
  # A checkpoint whose embedding is padded past the tokenizer: the padding ids are never drawn
  # (samplers, critic reads) nor normalised over (the learner's log-probs), one value for all.
  valid_vocab = tok.vocab_size if model_config.vocab_size > tok.vocab_size else 0
  update_settings = update_settings_of(c, model_config, valid_vocab, s)
  longest_prompt = max(len(task.prompt_ids(tok, r))
                       for split in ('train', 'validation') for r in task.records(split))
  sizes = run_sizes(c, longest_prompt)
  if s.value is None and c.critic.adapter_rank:
    adapter = critic_adapter.init_adapter(
        params, c.critic.adapter_rank,
        jax.random.fold_in(jax.random.key(c.seed), CRITIC_ADAPTER_KEY))
    state = critic_adapter.init_state(params, adapter, update_settings.optim)
  elif s.value is None:
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
      critic_target=c.critic.target, critic_marks=critic_marks(c),
      value_settings=s.value, train_problems=c.task.rl_problems, rollout_mesh=rollout_mesh)
  warmup = critic_warmup_settings(c)
  if warmup is not None:
    state = critic_warmup.warm_up(rt, state, warmup, workdir, critic_warmup_key(c, checkpoint),
                                  log=log)

  if c.algorithm == 'grpo':
    algorithm = grpo_lib.GRPO(rt, s.grpo, s.controller, c.seed)
  elif c.algorithm == 'ppo':
    algorithm = ppo_lib.PPO(rt, s.ppo, s.controller, c.seed)
  elif c.algorithm == 'pact':
    algorithm = pact_lib.PACT(rt, s.pact, c.seed)
  elif c.algorithm == 'lisao':
    algorithm = lisao_lib.LiSAO(rt, s.lisao, c.seed)
  elif c.algorithm == 'li2sao':
    algorithm = li2sao_lib.Li2SAO(rt, s.li2sao, c.seed)
  else:
    algorithm = ac2_lib.AC2(rt, s.controller, c.seed, use_critic=c.algorithm == 'ac2')
  return rt, algorithm, state


def update_settings_of(c: ml_collections.ConfigDict, model_config: ModelConfig,
                       valid_vocab_size: int = 0, settings: Settings | None = None
                       ) -> updates.UpdateSettings:
  """The jitted updates' static settings for `model_config`; the actor loss is the algorithm's
  (DIS for PACT, LiSAO and Li2SAO: `settings`, else `validate(c)`)."""
  return updates.UpdateSettings(
      model=model_config,
      optim=state_lib.OptimSettings(actor_lr=c.actor.learning_rate,
                                    actor_weight_decay=c.actor.weight_decay,
                                    actor_grad_clip=c.actor.grad_clip,
                                    critic_grad_clip=c.critic.grad_clip),
      temperature=c.sampling.temperature, eps_low=c.actor.eps_low,
      dual_clip=c.actor.dual_clip or None, micro_batch=c.actor.micro_batch,
      logits_chunk=c.model.logits_chunk, valid_vocab_size=valid_vocab_size,
      **_policy_loss(settings or validate(c)))


def step_key(seed: int, step: int) -> jax.Array:
  """The PRNG key of a step: a pure function of (seed, step), so a resumed run draws the same."""
  return jax.random.fold_in(jax.random.key(seed), step)
