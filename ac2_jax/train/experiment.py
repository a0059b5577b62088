"""Builds a run from its config: task, tokenizer, model weights, mesh, runtime and algorithm.

This is the only module that reads the ConfigDict; everything else takes typed values: the host
loop its `RunSettings`, a dry run its `dry_run.Plan`, the algorithms their settings and the
learner's `Runtime`.
"""

from __future__ import annotations

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
from ac2_jax.learner import runtime as runtime_lib
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.models.config import ModelConfig
from ac2_jax.tasks import builtin, builtin_sft, builtin_tfds
from ac2_jax.train import distributed, dry_run
from ac2_jax.train import sft as sft_lib
from ac2_jax.train.sizes import RunSizes

ALGORITHMS = ('ac2', 'prefix_grpo', 'grpo')


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
    raise ValueError('config.dry_run=True: call ac2_jax.train.dry_run.run(experiment.dry_run_plan('
                     'config)) instead of train')
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
                   attention_impl=c.model.attention_impl, remat=c.model.remat)
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
                      sizes=run_sizes(c, dry_run.PROMPT_TOKENS[c.task.name]))


def controller_settings(c: ml_collections.ConfigDict) -> ctl.ControllerSettings:
  try:
    return ctl.ControllerSettings(**c.controller.to_dict())
  except TypeError as e:
    raise ValueError(f'config.controller: {e}') from None


def build_task(c: ml_collections.ConfigDict, workdir: str, tokenizer_dir: str | None):
  """(task, tokenizer) for config.task.name."""
  data_dir = c.task.data_dir or os.path.join(workdir, 'data')
  if c.task.name == 'builtin':
    settings = builtin.ChainSettings(steps=c.task.builtin_steps, modulus=c.task.builtin_modulus,
                                     ops=c.task.builtin_ops,
                                     num_train=c.task.builtin_num_train,
                                     num_validation=c.task.builtin_num_validation, seed=c.seed,
                                     scoring=c.task.builtin_scoring,
                                     critic_prompt=c.task.builtin_critic_prompt)
    return builtin_tfds.build_builtin(data_dir, settings, vocab_size=c.task.builtin_vocab_size)
  if c.task.name == 'proofs':
    from ac2_jax import judges  # Only the proof task talks HTTP.
    from ac2_jax.tasks import proofs, proofs_tfds
    if not tokenizer_dir:
      raise ValueError('the proof task needs config.model.init_checkpoint (its tokenizer.json)')
    for key in ('proofs_train_dir', 'proofs_validation_dir'):
      if not c.task[key]:
        raise ValueError(f'the proof task needs config.task.{key}')
    if not c.judge.base_url:
      raise ValueError('the proof task needs config.judge.base_url (an OpenAI-compatible server)')
    skip = c.task.skip_malformed
    data = proofs.ProofDataSettings(
        train_manual_dir=c.task.proofs_train_dir,
        validation_manual_dir=c.task.proofs_validation_dir, data_dir=data_dir,
        train=dataclasses.replace(proofs_tfds.FINEPROOFS_RL, skip_malformed=skip),
        validation=dataclasses.replace(proofs_tfds.IMO_PROOFBENCH, skip_malformed=skip))

    def judge(mode):
      # Process 0 calls the server and broadcasts the grades (see train/distributed.py).
      return distributed.MainProcessJudge(judges.HttpJudge(judges.HttpJudgeSettings(
          base_url=c.judge.base_url, model=c.judge.model, mode=mode,
          api_key_env=c.judge.api_key_env or None, max_concurrency=c.judge.max_concurrency,
          timeout_s=c.judge.timeout_s)))

    task = proofs.make_proof_task(data, train_judge=judge('training'),
                                  validation_judge=judge('validation'))
    return task, tokenization.HFTokenizer.from_file(tokenizer_dir)
  raise ValueError(f"config.task.name must be 'builtin' or 'proofs', got {c.task.name!r}")


def initial_checkpoint(c: ml_collections.ConfigDict, workdir: str, task, tok, log=print) -> str:
  """The HF checkpoint the run starts from: the configured one, or the (cached) SFT warm start."""
  if c.model.init_checkpoint:
    if not os.path.isfile(os.path.join(c.model.init_checkpoint, 'config.json')):
      raise FileNotFoundError(f'config.model.init_checkpoint={c.model.init_checkpoint!r} has no '
                              f'config.json')
    return c.model.init_checkpoint
  if c.task.name != 'builtin':
    raise ValueError('only the built-in task has an SFT warm start; set config.model.init_checkpoint')
  model_config = models.get_config(c.model.preset, vocab_size=tok.vocab_size)
  try:
    settings = sft_lib.SFTSettings(**c.sft.to_dict(), seed=c.seed)
  except TypeError as e:
    raise ValueError(f'config.sft: {e}') from None
  examples = builtin_sft.sft_examples(
      task, tok, mistake_rate=settings.mistake_rate, step_mistake_rate=settings.step_mistake_rate,
      seed=c.seed, epochs=None, clean_first=settings.clean_steps * settings.batch_size)
  critic_examples = builtin_sft.critic_examples(
      task, tok, step_mistake_rate=settings.step_mistake_rate, seed=c.seed + 1)
  return sft_lib.run_sft(model_config, settings, examples, os.path.join(workdir, 'sft'),
                         data_key=task.name + repr(task.settings),
                         critic_examples=critic_examples, log=log)


def build(c: ml_collections.ConfigDict, workdir: str, log=print
          ) -> tuple[runtime_lib.Runtime, algorithm_base.Algorithm, state_lib.TrainState]:
  """Returns (runtime, algorithm, initial train state) for the config."""
  if c.algorithm not in ALGORITHMS:
    raise ValueError(f'config.algorithm must be one of {ALGORITHMS}, got {c.algorithm!r}')
  tokenizer_dir = c.model.init_checkpoint or None
  # Process 0 writes the data set and the warm start; the others then read them (shared files).
  with distributed.main_process_first('build_task'):
    task, tok = build_task(c, workdir, tokenizer_dir)
  with distributed.main_process_first('initial_checkpoint'):
    checkpoint = initial_checkpoint(c, workdir, task, tok, log=log)
  mesh = sharding.make_mesh(sharding.MeshConfig(c.mesh.data, c.mesh.fsdp, c.mesh.tensor))
  model_config, params = models.load_hf_checkpoint(checkpoint, mesh=mesh, dtype=c.model.dtype,
                                                   attention_impl=c.model.attention_impl,
                                                   remat=c.model.remat)
  ctl_settings = controller_settings(c)
  update_settings = updates.UpdateSettings(
      model=model_config,
      optim=state_lib.OptimSettings(actor_lr=c.actor.learning_rate,
                                    actor_weight_decay=c.actor.weight_decay,
                                    actor_grad_clip=c.actor.grad_clip,
                                    critic_grad_clip=c.critic.grad_clip),
      temperature=c.sampling.temperature, eps_low=c.actor.eps_low,
      dual_clip=c.actor.dual_clip or None, micro_batch=c.actor.micro_batch,
      logits_chunk=c.model.logits_chunk)
  longest_prompt = max(len(task.prompt_ids(tok, r))
                       for split in ('train', 'validation') for r in task.records(split))
  sizes = run_sizes(c, longest_prompt)
  state = runtime_lib.place_state(state_lib.init_state(params, update_settings.optim), mesh)
  rt = runtime_lib.build_runtime(
      model_config=model_config, tokenizer=tok, task=task, mesh=mesh,
      update_settings=update_settings,
      train_sampling=sampling.SamplingSettings(temperature=c.sampling.temperature,
                                               top_p=c.sampling.top_p, top_k=c.sampling.top_k),
      eval_sampling=sampling.SamplingSettings(temperature=c.eval.temperature, top_p=c.eval.top_p,
                                              top_k=c.eval.top_k),
      max_total_len=sizes.max_total_len, max_sample_batch=sizes.max_sample_batch,
      actor_minibatches=sizes.actor_minibatches, state=state, critic_readout=c.critic.readout)

  if c.algorithm == 'grpo':
    algorithm = grpo_lib.GRPO(rt, grpo_lib.GRPOSettings(
        problems_per_step=c.grpo.problems_per_step, group_size=c.grpo.group_size,
        normalize_std=c.grpo.normalize_std, response_budget=ctl_settings.response_budget),
        ctl_settings, c.seed)
  else:
    algorithm = ac2_lib.AC2(rt, ctl_settings, c.seed, use_critic=c.algorithm == 'ac2')
  return rt, algorithm, state


def step_key(seed: int, step: int) -> jax.Array:
  """The PRNG key of a step: a pure function of (seed, step), so a resumed run draws the same."""
  return jax.random.fold_in(jax.random.key(seed), step)
