"""The runtime an algorithm is given: model, tokenizer, task, mesh and the jitted update steps.

`build_runtime` makes it in one call from typed values (train/experiment.py reads the config and
calls it); the result is frozen. The update steps are jitted there, once, with explicit shardings of
the train state and the batch and with the state donated.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ac2_jax import critic, models, sampling, sharding, tokenization
from ac2_jax.critic import self_check
from ac2_jax.learner import critic_adapter
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.learner import value_critic
from ac2_jax.tasks import base as task_base


def max_total_len(longest_prompt: int, response_budget: int, critic_context: int) -> int:
  """Longest context + new tokens of any sampler call: a prompt plus the whole response budget,
  or a critic prompt (which may be longer) plus its value tokens."""
  return max(longest_prompt + response_budget, critic_context)


@dataclasses.dataclass(frozen=True)
class CriticStep:
  """(state, a CriticBatch or a sequence of them, lr) -> (state, metrics): one critic update.

  Several batches are one update's records split by length (`learner.rows.critic_records_batch`):
  each is padded to its own length, their gradients are summed, and one optimiser step follows,
  so the split changes only the padding, never the update.
  """
  update: Callable  # (state, CriticBatch, lr): grads and step fused
  grads: Callable   # (state, CriticBatch) -> (loss_sum, records, grads)
  add: Callable     # sums two of grads' outputs (the first donated)
  apply: Callable   # (state, loss_sum, records, grads, lr) -> (state, metrics)

  def __call__(self, state, batch, lr):
    batches = [batch] if isinstance(batch, updates.CriticBatch) else list(batch)
    if len(batches) == 1:
      return self.update(state, batches[0], lr)
    total = self.grads(state, batches[0])
    for b in batches[1:]:
      total = self.add(total, self.grads(state, b))
    return self.apply(state, *total, lr)


@dataclasses.dataclass(frozen=True, eq=False)
class Runtime:
  model_config: models.ModelConfig
  tokenizer: tokenization.Tokenizer
  task: task_base.Task
  mesh: Mesh
  update_settings: updates.UpdateSettings
  train_sampling: sampling.SamplingSettings
  eval_sampling: sampling.SamplingSettings
  max_total_len: int             # longest context + new tokens of any sampler call
  max_sample_batch: int          # rows per sampler device call
  actor_minibatches: int
  train_records: Sequence[task_base.ProblemRecord]
  val_records: Sequence[task_base.ProblemRecord]
  train_prompts: Sequence[np.ndarray]  # prompt token ids per training record
  val_prompts: Sequence[np.ndarray]
  prompt_ids_by_id: dict         # training problem id -> prompt token ids
  actor_step: Callable           # (state, ActorBatch, eps_high) -> (state, metrics)
  critic_step: Callable          # (state, CriticBatch, lr) -> (state, metrics)
  critic_readout: str = 'greedy'  # how a critic value is read (learner.rows.READOUTS)
  critic_target: str = 'rounded'  # how a critic target becomes tokens (critic.TARGETS)
  # How the critic's prompt marks each worked line (critic/self_check.py, MARKS): '' (the
  # paper's prompt), 'self' (the policy's own check), 'reference' (whether it is the reference's).
  critic_marks: str = ''
  # (state) -> the weights the critic reads with: the policy's, or W + A B with an adapter.
  critic_params: Callable = critic_adapter.critic_params
  # The separate value-head critic (learner/value_critic.py), when the state carries one.
  value_settings: value_critic.ValueSettings | None = None
  value_step: Callable | None = None      # (state, ValueBatch) -> (state, metrics)
  # (value_params, tokens_BxT) -> head outputs at V(s_t)'s positions [B, T] (value_critic.link)
  value_logits: Callable | None = None
  policy_logprobs: Callable | None = None  # (params, tokens_BxT) -> log pi(token t) [B, T]
  # The in-flight worker's sub-mesh: this process's rollout devices (sharding.rollout_mesh), none
  # of `mesh`'s; None: the worker generates on `mesh`.
  rollout_mesh: Mesh | None = None

  @property
  def valid_vocab_size(self) -> int:
    """Ids >= this are never drawn nor normalised over (0 = none): one value for the samplers,
    the critic reads and the learner's log-probs (`build_runtime` checks they agree)."""
    return self.update_settings.valid_vocab_size

  @property
  def batch_multiple(self) -> int:
    """Rows of a device batch must divide evenly over the mesh's batch axes."""
    return sharding.batch_devices(self.mesh)

  def put_batch(self, batch: Any) -> Any:
    return sharding.put_batch(batch, self.mesh)

  def critic_context(self, prompt_ids, response_ids, reference: str | None) -> np.ndarray | None:
    """The critic prompt that values `prompt_ids + response_ids`, or None when it and the value
    tokens would not fit in `max_total_len` (such a read is invalid, such a pair skipped)."""
    response = (self.tokenizer.decode([int(i) for i in response_ids])
                if self.task.critic_sees_response else '')
    ids = critic.critic_context_ids(self.tokenizer, prompt_ids, response_ids,
                                    instruction_text=self.task.critic_instruction(reference,
                                                                                  response))
    if len(ids) + sampling.MAX_VALUE_TOKENS > self.max_total_len:
      return None
    return np.asarray(ids, np.int32)


def build_runtime(*, model_config: models.ModelConfig, tokenizer: tokenization.Tokenizer,
                  task: task_base.Task, mesh: Mesh, update_settings: updates.UpdateSettings,
                  train_sampling: sampling.SamplingSettings,
                  eval_sampling: sampling.SamplingSettings, max_total_len: int,
                  max_sample_batch: int, actor_minibatches: int,
                  state: state_lib.TrainState, critic_readout: str = 'greedy',
                  critic_target: str = 'rounded', critic_marks: str = '',
                  value_settings: value_critic.ValueSettings | None = None,
                  train_problems: int = 0, rollout_mesh: Mesh | None = None) -> Runtime:
  """The runtime, with the actor and critic steps jitted for `state`'s shardings; with
  `value_settings` (and an `ActorCriticState`) also the value critic's update and reads.

  `train_problems` > 0 keeps at most the first that many training problems: the pool the RL steps
  draw from (the warm start is built before, from the whole split).
  """
  if critic_marks not in self_check.MARKS:
    raise ValueError(f'critic_marks must be one of {self_check.MARKS}, got {critic_marks!r}')
  supports = {'update_settings': update_settings.valid_vocab_size,
              'train_sampling': train_sampling.valid_vocab_size,
              'eval_sampling': eval_sampling.valid_vocab_size}
  if len(set(supports.values())) > 1:
    # The PPO ratio of an on-policy token is 1 only when learner and sampler share a support.
    raise ValueError(f'build_runtime: valid_vocab_size differs between settings: {supports}')
  train_records, val_records = task.records('train'), task.records('validation')
  if train_problems:
    train_records = train_records[:train_problems]
  prompts = lambda records: [np.asarray(task.prompt_ids(tokenizer, r), np.int32) for r in records]
  train_prompts = prompts(train_records)
  state_shardings = sharding.param_shardings(state, mesh)
  batch = sharding.batch_sharding(mesh)
  scalar = NamedSharding(mesh, P())

  def jit(fn):
    return jax.jit(functools.partial(fn, update_settings),
                   in_shardings=(state_shardings, batch, scalar),
                   out_shardings=(state_shardings, scalar), donate_argnums=0)

  critic_step = make_critic_step(update_settings, state_shardings, batch, scalar)
  critic_params = critic_adapter.critic_params
  if isinstance(state, critic_adapter.AdapterState):  # one merge per step, on the params' shards
    critic_params = jax.jit(critic_adapter.critic_params, in_shardings=(state_shardings,),
                            out_shardings=state_shardings.params)

  value_fns = {}
  if value_settings is not None:
    if not isinstance(state, value_critic.ActorCriticState):
      raise TypeError('value_settings need an ActorCriticState (value_critic.init_state)')
    value_fns['value_step'] = jax.jit(
        functools.partial(value_critic.value_update, update_settings, value_settings),
        in_shardings=(state_shardings, batch), out_shardings=(state_shardings, scalar),
        donate_argnums=0)
    value_fns['value_logits'] = jax.jit(
        functools.partial(value_critic.state_logits, model_config),
        in_shardings=(state_shardings.value_params, batch), out_shardings=batch)
    value_fns['policy_logprobs'] = jax.jit(
        lambda params, tokens_BxT: updates.sequence_logprobs(
            model_config, params, tokens_BxT, update_settings.temperature,
            update_settings.logits_chunk, update_settings.valid_vocab_size),
        in_shardings=(state_shardings.params, batch), out_shardings=batch)

  return Runtime(
      model_config=model_config, tokenizer=tokenizer, task=task, mesh=mesh,
      update_settings=update_settings, train_sampling=train_sampling,
      eval_sampling=eval_sampling, max_total_len=max_total_len,
      max_sample_batch=max_sample_batch, actor_minibatches=actor_minibatches,
      train_records=train_records, val_records=val_records, train_prompts=train_prompts,
      val_prompts=prompts(val_records),
      prompt_ids_by_id={r.id: p for r, p in zip(train_records, train_prompts)},
      actor_step=jit(updates.actor_update), critic_step=critic_step,
      critic_readout=critic_readout, critic_target=critic_target,
      critic_marks=critic_marks, critic_params=critic_params,
      value_settings=value_settings,
      rollout_mesh=rollout_mesh,
      **value_fns)


def make_critic_step(update_settings: updates.UpdateSettings, state_shardings, batch, scalar
                     ) -> CriticStep:
  """The critic update's jitted parts, for the train state's shardings (`state_shardings`), the
  batch's (`batch`) and a replicated scalar's; the state is donated."""
  trained = getattr(state_shardings, critic_adapter.trained_field(state_shardings))
  sums = (scalar, scalar, trained)
  return CriticStep(
      update=jax.jit(functools.partial(updates.critic_update, update_settings),
                     in_shardings=(state_shardings, batch, scalar),
                     out_shardings=(state_shardings, scalar), donate_argnums=0),
      grads=jax.jit(functools.partial(updates.critic_grads, update_settings),
                    in_shardings=(state_shardings, batch), out_shardings=sums),
      add=jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), in_shardings=(sums, sums),
                  out_shardings=sums, donate_argnums=0),
      apply=jax.jit(functools.partial(updates.critic_apply, update_settings),
                    in_shardings=(state_shardings, scalar, scalar, trained, scalar),
                    out_shardings=(state_shardings, scalar), donate_argnums=0))


def place_state(state: state_lib.TrainState, mesh: Mesh) -> state_lib.TrainState:
  return sharding.shard_params(state, mesh)
