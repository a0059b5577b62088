"""The runtime of a run: model, tokenizer, task, mesh and the jitted update steps, built once.

Algorithms receive a `Runtime` and never read the config themselves. The update steps are jitted
here, once, with explicit shardings of the train state and the batch and with the state donated.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ac2_jax import critic, models, sampling, sharding, tokenization
from ac2_jax.tasks import base as task_base
from ac2_jax.train import distributed
from ac2_jax.train import state as state_lib
from ac2_jax.train import updates


@dataclasses.dataclass
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
  critic_readout: str = 'greedy'  # how a critic value is read (algorithms.rollouts.READOUTS)
  actor_step: Callable = None    # (state, ActorBatch, eps_high) -> (state, metrics)
  critic_step: Callable = None   # (state, CriticBatch, lr) -> (state, metrics)
  prompt_ids_by_id: dict = dataclasses.field(default_factory=dict)
  train_prompts: list = dataclasses.field(default_factory=list)
  val_prompts: list = dataclasses.field(default_factory=list)

  def __post_init__(self):
    self.train_prompts = [np.asarray(self.task.prompt_ids(self.tokenizer, r), np.int32)
                          for r in self.train_records]
    self.val_prompts = [np.asarray(self.task.prompt_ids(self.tokenizer, r), np.int32)
                        for r in self.val_records]
    self.prompt_ids_by_id = {r.id: p for r, p in zip(self.train_records, self.train_prompts)}

  @property
  def batch_multiple(self) -> int:
    """Rows of a device batch must divide evenly over the mesh's batch axes."""
    return int(np.prod([self.mesh.shape[a] for a in sharding.BATCH_AXES]))

  def put_batch(self, batch: Any) -> Any:
    # Every process holds the whole host batch (train/distributed.py).
    return distributed.put_global_batch(batch, self.mesh)

  def critic_context(self, prompt_ids, response_ids, reference: str | None) -> list[int]:
    return critic.critic_context_ids(self.tokenizer, prompt_ids, response_ids,
                                     instruction_text=self.task.critic_instruction(reference))


def compile_updates(rt: Runtime, abstract_state: state_lib.TrainState) -> None:
  """Jits the actor and critic steps once, with the state's shardings, donating the state."""
  state_shardings = sharding.param_shardings(abstract_state, rt.mesh)
  batch = sharding.batch_sharding(rt.mesh)
  scalar = NamedSharding(rt.mesh, P())
  for name, fn in (('actor_step', updates.actor_update), ('critic_step', updates.critic_update)):
    jitted = jax.jit(functools.partial(fn, rt.update_settings),
                     in_shardings=(state_shardings, batch, scalar),
                     out_shardings=(state_shardings, scalar), donate_argnums=0)
    setattr(rt, name, jitted)


def place_state(rt: Runtime, state: state_lib.TrainState) -> state_lib.TrainState:
  return sharding.shard_params(state, rt.mesh)
