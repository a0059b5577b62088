"""Builds a run from its config: task, tokenizer, model weights, mesh, runtime and algorithm.

This is the only module that reads the ConfigDict; everything below it takes typed values.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import ml_collections

from ac2_jax import controller as ctl
from ac2_jax import models, sampling, sharding, tokenization
from ac2_jax.algorithms import ac2 as ac2_lib
from ac2_jax.algorithms import grpo as grpo_lib
from ac2_jax.tasks import builtin, builtin_sft, builtin_tfds
from ac2_jax.train import distributed
from ac2_jax.train import runtime as runtime_lib
from ac2_jax.train import sft as sft_lib
from ac2_jax.train import state as state_lib
from ac2_jax.train import updates

ALGORITHMS = ('ac2', 'prefix_grpo', 'grpo')


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


def build(c: ml_collections.ConfigDict, workdir: str, log=print):
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
  # Contexts are the prompt plus at most the response budget; critic prompts may be longer.
  longest_prompt = max(len(task.prompt_ids(tok, r))
                       for split in ('train', 'validation') for r in task.records(split))
  max_total_len = max(longest_prompt + ctl_settings.response_budget, c.critic.max_context)
  rt = runtime_lib.Runtime(
      model_config=model_config, tokenizer=tok, task=task, mesh=mesh,
      update_settings=update_settings,
      train_sampling=sampling.SamplingSettings(temperature=c.sampling.temperature,
                                               top_p=c.sampling.top_p, top_k=c.sampling.top_k),
      eval_sampling=sampling.SamplingSettings(temperature=c.eval.temperature, top_p=c.eval.top_p,
                                              top_k=c.eval.top_k),
      max_total_len=max_total_len, max_sample_batch=c.sampling.max_batch,
      actor_minibatches=c.actor.minibatches, critic_readout=c.critic.readout,
      train_records=task.records('train'), val_records=task.records('validation'))
  state = state_lib.init_state(params, update_settings.optim)
  state = runtime_lib.place_state(rt, state)
  runtime_lib.compile_updates(rt, state)

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
