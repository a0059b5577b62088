"""Dry run of a config: shapes, shardings and memory per device of the full-size model, on any CPU.

`python launch/tpu_run.py --config=... --config.dry_run=True` builds nothing real: the parameters,
both optimizer states and one actor and one critic update exist only as `jax.eval_shape`
abstractions, the mesh is a `jax.sharding.AbstractMesh` of the configured axis sizes (so a laptop
plans a 32-chip pod), and no checkpoint, data set or judge is touched (a checkpoint's config.json
is read when it is there). The report gives bytes per device, by phase:

  state     parameters + actor AdamW moments + critic Adam moments: resident for the whole run.
            With a separate value critic (PPO, PACT): its parameters and AdamW moments instead
            of AC2's critic moments (its frozen attention, if set, holds no moments). With the
            critic adapter (critic.adapter_rank): the adapter, its Adam moments instead of
            the shared weights', and the merged critic weights W + A B that the runtime writes
            once per step for the critic's reads (a second copy of the parameters).
  sampling  the KV cache of one sampler call (`sampling.max_batch` rows at the longest context,
            bucketed as the sampler pads) and the prefill's activations of one layer.
  update    gradients, float32 logits of one micro-batch (the losses take a log-softmax over
            the whole vocabulary; `model.logits_chunk` positions at a time when it is set),
            and the activations the backward pass keeps.
  peak    = state + max(sampling, update)

Activations are estimates (XLA fuses and reuses buffers); the state and the KV cache are exact.
Rows split over the batch axes (data x fsdp) round up: a micro-batch smaller than the batch axes
still occupies one row per device.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType

from ac2_jax import models, sampling, sharding
from ac2_jax.sampling import decode
from ac2_jax.models.config import ModelConfig
from ac2_jax.learner import critic_adapter
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.learner import value_critic
from ac2_jax.models import value as value_model
from ac2_jax.train.sizes import RunSizes

GiB = 1024**3
# The data are not read: prompt lengths are assumed (FineProofs-RL and IMO-ProofBench prompts are
# far shorter than 2,048 tokens; the built-in task's are under 128).
PROMPT_TOKENS = {'builtin': 128, 'walk': 128, 'proofs': 2048}


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a dry run checks: the model, the mesh and the run's sizes (train/experiment.py makes it
  from the config; nothing here reads the config)."""
  model: ModelConfig
  model_source: str
  mesh_shape: tuple[int, int, int]   # (data, fsdp, tensor)
  sizes: RunSizes
  value: value_critic.ValueSettings | None = None  # the separate value critic (PPO, PACT)
  critic_adapter_rank: int = 0       # AC2's critic through W + A B (critic.adapter_rank)


def sampler_shape(plan: Plan, batch_devices: int) -> tuple[int, int, int]:
  """(rows, context P, new tokens C) of the largest sampler call, padded as requests.pack pads."""
  total = plan.sizes.max_total_len
  lengths = []
  for cut in range(0, plan.sizes.max_cut + 1, max(plan.sizes.cut_grid, 1)):
    context = plan.sizes.prompt_tokens + cut
    lengths.append((sampling.bucket(context),
                    sampling.bucket(min(plan.sizes.response_budget - cut, total - context))))
  critic = min(plan.sizes.critic_context, total - sampling.MAX_VALUE_TOKENS)
  lengths.append((sampling.bucket(critic), sampling.bucket(sampling.MAX_VALUE_TOKENS)))
  P, C = max(lengths, key=sum)
  rows = sampling.bucket(min(plan.sizes.max_sample_batch, plan.sizes.rows_per_step), 8)
  return -(-rows // batch_devices) * batch_devices, P, C


def _names(entry) -> tuple:
  return entry if isinstance(entry, tuple) else (entry,)


def _is_spec(x) -> bool:
  return isinstance(x, jax.sharding.PartitionSpec)


def _tree_bytes(tree, specs, mesh_sizes: dict) -> int:
  """Bytes of the shards one device holds."""
  total = 0
  for leaf, spec in zip(jax.tree.leaves(tree), jax.tree.leaves(specs, is_leaf=_is_spec)):
    shape = list(leaf.shape)
    for i, entry in enumerate(spec):
      if entry is not None:
        shape[i] //= math.prod(mesh_sizes[n] for n in _names(entry))
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def _div(n: int, parts: int) -> int:
  """Per-device size of a dimension split `parts` ways (replicated when it does not divide)."""
  return n // parts if n % parts == 0 else n


@dataclasses.dataclass
class Report:
  plan: Plan
  num_params: int
  memory: dict          # phase -> {item: bytes per device}
  notes: list

  @property
  def peak_bytes(self) -> int:
    return self.total('state') + max(self.total('sampling'), self.total('update'))

  def total(self, phase: str) -> int:
    return sum(self.memory[phase].values())

  def as_dict(self) -> dict:
    gib = lambda b: round(b / GiB, 2)
    return {'num_params': self.num_params, 'mesh': list(self.plan.mesh_shape),
            'memory_gib': {p: {k: gib(v) for k, v in items.items()}
                           for p, items in self.memory.items()},
            'peak_gib': gib(self.peak_bytes), 'notes': self.notes}

  def text(self) -> str:
    p, m = self.plan, self.plan.model
    data, fsdp, tensor = p.mesh_shape
    lines = [
        f'dry run: {m.num_layers}-layer Qwen3 decoder from {p.model_source}: '
        f'{self.num_params / 1e9:.3f} B parameters, {m.param_dtype}, attention {m.attention_impl}, '
        f'remat {"on" if m.remat else "off"}',
        f'mesh: data={data} fsdp={fsdp} tensor={tensor} ({data * fsdp * tensor} devices, abstract)',
        f'lengths: prompt <= {p.sizes.prompt_tokens} (assumed), response budget {p.sizes.response_budget}, '
        f'context + new tokens <= {p.sizes.max_total_len}',
        'checked with jax.eval_shape: parameters, actor and critic optimizer states, one actor '
        'and one critic update (state shapes kept), one sampler call',
        'memory per device (GiB):']
    for phase in ('state', 'sampling', 'update'):
      for item, value in self.memory[phase].items():
        lines.append(f'  {phase:8s} {item:40s} {value / GiB:8.2f}')
      lines.append(f'  {phase:8s} {"= total":40s} {self.total(phase) / GiB:8.2f}')
    lines.append(f'  {"peak":8s} {"= state + max(sampling, update)":40s} '
                 f'{self.peak_bytes / GiB:8.2f}')
    lines += [f'note: {n}' for n in self.notes]
    lines.append('dry run summary (JSON): ' + json.dumps(self.as_dict()))
    return '\n'.join(lines)


def run(plan: Plan) -> Report:
  """Checks and estimates a run's plan (`experiment.dry_run_plan(config)`) without loading,
  downloading or writing anything."""
  mesh = AbstractMesh(plan.mesh_shape, sharding.AXES, axis_types=(AxisType.Auto,) * 3)
  notes = []
  state, num_params = _check_shapes(plan, mesh, notes)
  return Report(plan, num_params, _memory(plan, state, mesh, notes), notes)


def _check_shapes(plan: Plan, mesh: AbstractMesh, notes: list):
  """Traces init, one actor and one critic update and one sampler call; returns the train state
  as the run holds it after its first update (ShapeDtypeStructs) and the parameter count."""
  m = plan.model
  # Off accelerators the Pallas kernels trace through their interpreter: the same shapes.
  traced = m.replace(pallas_interpret=m.attention_impl == 'pallas'
                     and jax.default_backend() == 'cpu')
  optim = state_lib.OptimSettings()
  params = jax.eval_shape(lambda: models.init_params(traced, jax.random.key(0)))
  if plan.value is None and plan.critic_adapter_rank:
    state = jax.eval_shape(lambda p: critic_adapter.init_state(
        p, critic_adapter.init_adapter(p, plan.critic_adapter_rank, jax.random.key(0)), optim),
        params)
  elif plan.value is None:
    state = jax.eval_shape(functools.partial(state_lib.init_state, settings=optim), params)
  else:
    state = jax.eval_shape(lambda p: value_critic.init_state(
        p, value_model.init_value_params(traced, p, jax.random.key(0)), optim, plan.value),
        params)
  unsplit = _unsplit_leaves(params, mesh)
  if unsplit:
    notes.append(f'replicated because a dimension does not divide its mesh axes: {unsplit}')

  # The actor traces the micro-batch scan as configured (two micro-batches); the critic one
  # micro-batch: the same forward and backward, and a 36-layer trace costs seconds.
  T_actor = sampling.train_bucket(plan.sizes.prompt_tokens + plan.sizes.response_budget)
  T_critic = sampling.train_bucket(plan.sizes.critic_context + sampling.MAX_VALUE_TOKENS)
  rows = max(plan.sizes.micro_batch, 1)
  actor_batch = updates.ActorBatch(_sds((2 * rows, T_actor), jnp.int32),
                                   *[_sds((2 * rows, T_actor), jnp.float32)] * 3)
  critic_batch = updates.CriticBatch(_sds((rows, T_critic), jnp.int32),
                                     _sds((rows, T_critic), jnp.float32),
                                     _sds((rows,), jnp.float32))
  settings = updates.UpdateSettings(model=traced, optim=optim, micro_batch=plan.sizes.micro_batch,
                                    logits_chunk=plan.sizes.logits_chunk)
  scalar = (_sds((), jnp.float32),)
  steps = [('actor', updates.actor_update, actor_batch, plan.sizes.micro_batch, scalar)]
  if plan.value is None:
    steps.append(('critic', updates.critic_update, critic_batch, 0, scalar))
  else:
    # Li2SAO's ranking term reads four more per-row arrays.
    ranked = ([_sds((2 * rows,), jnp.int32), _sds((2 * rows,), jnp.float32),
               _sds((2 * rows,), jnp.int32), _sds((2 * rows,), jnp.float32)]
              if plan.value.rank_coef > 0 else [])
    value_batch = value_critic.ValueBatch(_sds((2 * rows, T_actor), jnp.int32),
                                          *[_sds((2 * rows, T_actor), jnp.float32)] * 3, *ranked)
    value_step = lambda settings, state, batch: value_critic.value_update(settings, plan.value,
                                                                           state, batch)
    steps.append(('value critic', value_step, value_batch, plan.sizes.micro_batch, ()))
  for name, fn, batch, micro, extra in steps:
    step = functools.partial(fn, dataclasses.replace(settings, micro_batch=micro))
    new_state, _ = jax.eval_shape(step, state, batch, *extra)
    before, after = jax.tree.leaves(state), jax.tree.leaves(new_state)
    if (jax.tree.structure(new_state) != jax.tree.structure(state)
        or any(a.shape != b.shape for a, b in zip(before, after))):
      raise ValueError(f'the {name} update changes the shapes of the train state')
    changed = sorted({f'{a.dtype} -> {b.dtype}' for a, b in zip(before, after)
                      if a.dtype != b.dtype})
    if changed:
      # The run holds the wider dtype from its second step on (and compiles the step again).
      notes.append(f'the {name} update changes dtypes in the train state ({", ".join(changed)}); '
                   f'the memory counts the wider dtype')
      state = jax.tree.map(lambda a, b: a if a.dtype.itemsize >= b.dtype.itemsize else b,
                           state, new_state)

  batch_devices = mesh.shape['data'] * mesh.shape['fsdp']
  B, P, C = sampler_shape(plan, batch_devices)
  decode_call = functools.partial(decode.decode_batch, config=traced,
                                  settings=sampling.SamplingSettings(0.8), stop_ids=(0,),
                                  max_new=C)
  tokens_BxC = jax.eval_shape(decode_call, params, jax.random.key(0), _sds((B, P), jnp.int32),
                              *[_sds((B,), jnp.int32)] * 3)[0]
  if tokens_BxC.shape != (B, C):
    raise ValueError(f'sampler output {tokens_BxC.shape}, expected {(B, C)}')
  if plan.sizes.max_total_len > m.max_position_embeddings:
    notes.append(f'context + new tokens reach {plan.sizes.max_total_len} > the model\'s '
                 f'max_position_embeddings {m.max_position_embeddings} (the preset\'s; a '
                 f'checkpoint such as Qwen3-4B-Thinking-2507 declares 262144)')
  return state, sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def _sds(shape, dtype) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype)


def _memory(plan: Plan, state, mesh: AbstractMesh, notes: list) -> dict:
  """Bytes per device by phase (see the module docstring)."""
  m = plan.model
  sizes = dict(mesh.shape)
  batch_devices = sizes['data'] * sizes['fsdp']
  act = jnp.dtype(m.dtype).itemsize
  heads, kv_heads = _div(m.num_heads, sizes['tensor']), _div(m.num_kv_heads, sizes['tensor'])
  ffn, vocab = _div(m.intermediate_size, sizes['tensor']), _div(m.vocab_size, sizes['tensor'])
  kv_per_token = 2 * m.num_layers * kv_heads * m.head_dim * act
  specs = sharding.param_partition_specs(state, mesh)
  memory = {'state': {
      'parameters': _tree_bytes(state.params, specs.params, sizes),
      'actor optimizer (AdamW mu, nu)': _tree_bytes(state.actor_opt_state,
                                                    specs.actor_opt_state, sizes),
  }}
  if plan.value is None:
    memory['state']['critic optimizer (Adam mu, nu)'] = _tree_bytes(
        state.critic_opt_state, specs.critic_opt_state, sizes)
  if isinstance(state, critic_adapter.AdapterState):
    memory['state']['critic adapter (A, B)'] = _tree_bytes(state.critic_adapter,
                                                          specs.critic_adapter, sizes)
    memory['state']['merged critic weights (W + A B), one per step'] = (
        memory['state']['parameters'])
  if plan.value is not None:
    memory['state']['value critic parameters'] = _tree_bytes(state.value_params,
                                                             specs.value_params, sizes)
    memory['state']['value critic optimizer (AdamW mu, nu)'] = _tree_bytes(
        state.value_opt_state, specs.value_opt_state, sizes)

  B, P, C = sampler_shape(plan, batch_devices)
  rows = B // batch_devices
  memory['sampling'] = {
      f'KV cache: {rows} rows x {P + C} tokens': rows * (P + C) * kv_per_token,
      'prefill MLP, one layer': 3 * rows * P * ffn * act,
  }
  if m.attention_impl == 'xla':  # the cache grows in segments (sampling/decode.py)
    ends = decode.segment_ends(C)
    memory['sampling']['prefill attention scores (xla), one layer'] = (
        rows * heads * P * (P + ends[0]) * 4)
    if len(ends) > 1:
      memory['sampling'][f'KV cache of the last segment but one (xla), while the cache grows: '
                         f'{P + ends[-2]} tokens'] = rows * (P + ends[-2]) * kv_per_token

  T = sampling.train_bucket(max(plan.sizes.prompt_tokens + plan.sizes.response_budget,
                          plan.sizes.critic_context + sampling.MAX_VALUE_TOKENS))
  rows = -(-plan.sizes.update_rows // batch_devices)
  kept_per_token = m.hidden_size if m.remat else 4 * m.hidden_size + 3 * ffn
  logit_positions = min(plan.sizes.logits_chunk, T) if plan.sizes.logits_chunk else T
  memory['update'] = {
      'gradients' + (' + accumulator' if plan.sizes.micro_batch else ''):
          memory['state']['parameters'] * (2 if plan.sizes.micro_batch else 1),
      f'logits f32 x2: {rows} rows x {logit_positions} x {vocab}':
          2 * rows * logit_positions * vocab * 4,
      ('remat checkpoints' if m.remat else 'activations for backward'):
          m.num_layers * rows * T * kept_per_token * act,
  }
  if m.attention_impl == 'xla':
    memory['update']['attention scores (xla), one layer'] = rows * heads * T * T * 4

  if plan.sizes.micro_batch and plan.sizes.micro_batch < batch_devices:
    notes.append(f'actor.micro_batch={plan.sizes.micro_batch} < data*fsdp={batch_devices}: some '
                 f'devices hold padding rows in each micro-batch')
  return memory


def _unsplit_leaves(params, mesh) -> list[str]:
  """Parameters whose rule splits a dimension the mesh cannot split evenly (so it is replicated)."""
  wanted = jax.tree_util.tree_leaves_with_path(sharding.param_partition_specs(params),
                                               is_leaf=_is_spec)
  fitted = jax.tree.leaves(sharding.param_partition_specs(params, mesh), is_leaf=_is_spec)
  names = []
  for (path, want), got in zip(wanted, fitted):
    if any(w is not None and g is None and math.prod(mesh.shape[n] for n in _names(w)) > 1
           for w, g in zip(want, got)):
      names.append(sharding.path_str(path))
  return names

