"""Device mesh (data, fsdp, tensor), partition rules for every parameter, batches, multi-host.

Axes:
  data    pure data parallelism: parameters replicated, batch split.
  fsdp    batch split, and parameters split along their embedding (hidden) dimension (ZeRO-3 style).
  tensor  attention heads and FFN columns (and the vocabulary) split across devices.

Parameters are matched by explicit regex rules on their '/'-joined tree path. A rule matches a path
suffix, so the same rules shard gradient trees and optimizer states (whose paths end in the
parameter's path, e.g. `0/mu/layers_3/mlp/up_proj/kernel`). Every non-scalar leaf must match a rule
and every non-optional rule must match a leaf; otherwise `param_partition_specs` raises, naming it.

Indivisible dimensions: when a mesh is given, a dimension whose size is not a multiple of the mesh
axes assigned to it is replicated instead (so tiny test configs run on any mesh). Full-size presets
divide evenly on the usual meshes, so nothing is silently replicated there.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

AXES = ('data', 'fsdp', 'tensor')
# The batch dimension is split over both data-parallel axes.
BATCH_AXES = ('data', 'fsdp')


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh axis sizes; exactly one may be -1, meaning 'all remaining devices'."""
  data: int = 1
  fsdp: int = -1
  tensor: int = 1

  def resolve(self, num_devices: int) -> tuple[int, int, int]:
    """Axis sizes (data, fsdp, tensor) for `num_devices` devices."""
    sizes = (self.data, self.fsdp, self.tensor)
    for name, size in zip(AXES, sizes):
      if size == 0 or size < -1:
        raise ValueError(f'MeshConfig.{name}={size}: sizes must be positive or -1 (fill)')
    fills = [n for n, s in zip(AXES, sizes) if s == -1]
    if len(fills) > 1:
      raise ValueError(f'MeshConfig: at most one axis may be -1, got {fills}')
    fixed = math.prod(s for s in sizes if s != -1)
    if fills:
      if num_devices % fixed:
        raise ValueError(f'MeshConfig {sizes}: {num_devices} devices are not divisible by the '
                         f'fixed axes (product {fixed}) to fill axis {fills[0]!r}')
      sizes = tuple(num_devices // fixed if s == -1 else s for s in sizes)
    elif fixed != num_devices:
      raise ValueError(f'MeshConfig {sizes}: product {fixed} != number of devices {num_devices}')
    return sizes


def make_mesh(config: MeshConfig, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A mesh with axes ('data', 'fsdp', 'tensor') over `devices` (default: all global devices)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = config.resolve(len(devices))
  # Auto axes: shardings are hints to the compiler, not part of array types.
  return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def split_rollout_devices(per_process: int) -> tuple[list[jax.Device], list[jax.Device]]:
  """(training devices, this process's rollout devices): the last `per_process` local devices of
  every process (by id) form the rollout sub-mesh of that process; the rest of all processes'
  devices form the training mesh. The same answer on every process; (all devices, []) for 0."""
  by_process: dict[int, list[jax.Device]] = {}
  for d in sorted(jax.devices(), key=lambda d: d.id):
    by_process.setdefault(d.process_index, []).append(d)
  smallest = min(len(ds) for ds in by_process.values())
  if not 0 <= per_process < smallest:
    raise ValueError(f'{per_process} rollout devices per process must leave training devices on '
                     f'every process (each has {smallest}): use 0..{smallest - 1}')
  if not per_process:
    return list(jax.devices()), []
  rollout = {p: ds[len(ds) - per_process:] for p, ds in by_process.items()}
  training = [d for d in jax.devices() if d not in rollout[d.process_index]]
  return training, rollout[jax.process_index()]


def rollout_mesh(devices: Sequence[jax.Device]) -> Mesh:
  """A process-local rollout sub-mesh: rows over 'data', parameters replicated (fsdp = tensor = 1),
  so generating on it needs no collective with another process."""
  return make_mesh(MeshConfig(data=len(devices), fsdp=1, tensor=1), devices)


@dataclasses.dataclass(frozen=True)
class Rule:
  """Leaves whose path ends with `pattern` get `spec` (one entry per array dimension)."""
  pattern: str
  spec: tuple
  # An optional rule may match nothing (e.g. lm_head in a tied model).
  optional: bool = False


# One rule per parameter kind of the Qwen3 decoder (shapes as in models/qwen3.py).
DEFAULT_RULES = (
    Rule(r'embed_tokens/embedding', ('tensor', 'fsdp')),             # [V, E]
    Rule(r'self_attn/[qkv]_proj/kernel', ('fsdp', 'tensor', None)),  # [E, H|K, D]
    Rule(r'self_attn/o_proj/kernel', ('tensor', None, 'fsdp')),      # [H, D, E]
    Rule(r'mlp/(gate|up)_proj/kernel', ('fsdp', 'tensor')),          # [E, F]
    Rule(r'mlp/down_proj/kernel', ('tensor', 'fsdp')),               # [F, E]
    Rule(r'lm_head/kernel', ('fsdp', 'tensor'), optional=True),      # [E, V]
    # The value network's scalar head (models/value.py); its bias is a scalar, replicated.
    Rule(r'value_head/kernel', ('fsdp',), optional=True),            # [E]
    # The critic's low-rank adapter (learner/critic_adapter.py): every leaf 2-D and small.
    Rule(r'lora_[ab]', (None, None), optional=True),
    # RMSNorm scales are tiny: replicate.
    Rule(r'(input_layernorm|post_attention_layernorm|q_norm|k_norm|norm)/scale', (None,)),
)


def path_str(path) -> str:
  """'/'-joined tree path: ('layers_0', 'mlp', ...) -> 'layers_0/mlp/...'."""
  parts = []
  for key in path:
    for attr in ('key', 'name', 'idx'):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return '/'.join(parts)


def _axis_size(mesh: Mesh, entry) -> int:
  names = entry if isinstance(entry, tuple) else (entry,)
  return math.prod(mesh.shape[n] for n in names)


def fit_spec(spec: Sequence, shape: Sequence[int], mesh: Optional[Mesh]) -> P:
  """`spec` with every entry that does not divide its dimension (on `mesh`) replaced by None."""
  if mesh is None:
    return P(*spec)
  return P(*(e if e is None or dim % _axis_size(mesh, e) == 0 else None
             for e, dim in zip(spec, shape)))


def param_partition_specs(tree: Any, mesh: Optional[Mesh] = None,
                          rules: Sequence[Rule] = DEFAULT_RULES) -> Any:
  """A PartitionSpec for every leaf of `tree` (arrays or ShapeDtypeStructs), by `rules`.

  Scalars (e.g. an optimizer step count) are replicated without a rule. With a `mesh`, indivisible
  dimensions fall back to replication (see module docstring).
  """
  compiled = [(rule, re.compile(r'(^|/)(' + rule.pattern + r')$')) for rule in rules]
  used = set()

  def spec_for(path, leaf):
    name = path_str(path)
    shape = np.shape(leaf)
    if not shape:
      return P()
    for i, (rule, regex) in enumerate(compiled):
      if regex.search(name):
        if len(rule.spec) != len(shape):
          raise ValueError(f'partition rule {rule.pattern!r} has {len(rule.spec)} entries but '
                           f'{name} has shape {shape}')
        used.add(i)
        return fit_spec(rule.spec, shape, mesh)
    raise ValueError(f'no partition rule matches parameter {name} (shape {shape})')

  specs = jax.tree_util.tree_map_with_path(spec_for, tree)
  unused = [rule.pattern for i, (rule, _) in enumerate(compiled)
            if i not in used and not rule.optional]
  if unused:
    raise ValueError(f'partition rules match no parameter: {unused}')
  return specs


def param_shardings(tree: Any, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES) -> Any:
  """NamedShardings for every leaf of `tree` (same structure)."""
  specs = param_partition_specs(tree, mesh, rules)
  return jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs,
                                is_leaf=lambda x: isinstance(x, P))


def shard_params(params: Any, mesh: Mesh, rules: Sequence[Rule] = DEFAULT_RULES) -> Any:
  """`params` (host or device arrays) placed on `mesh` by the partition rules, in fresh buffers.

  Donating the result to a jitted step therefore never deletes the caller's `params`.
  """
  leaves, treedef = jax.tree_util.tree_flatten(params)
  shardings = treedef.flatten_up_to(param_shardings(params, mesh, rules))
  out = [None] * len(leaves)
  on_device = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
  # jax.device_put can hand back the caller's own buffer as one shard (even with may_alias=False);
  # a jitted identity always writes new buffers. Host arrays go straight to their shards.
  copied = jax.jit(lambda xs: xs, out_shardings=[shardings[i] for i in on_device])(
      [leaves[i] for i in on_device])
  for i, x in zip(on_device, copied):
    out[i] = x
  for i, x in enumerate(leaves):
    if out[i] is None:
      out[i] = jax.device_put(x, shardings[i])
  return treedef.unflatten(out)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over ('data', 'fsdp'); other dimensions replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def batch_devices(mesh: Mesh) -> int:
  """Devices the batch axes split a batch over (data x fsdp): rows must divide evenly by this."""
  return _axis_size(mesh, BATCH_AXES)


def put_batch(tree: Any, mesh: Mesh) -> Any:
  """Places a host batch that is the same on every process: every leaf's leading dimension over
  (data, fsdp), each device taking its own rows; scalar leaves replicated.

  The one placement rule of the trainer's update batches and the sampler's device inputs.
  """
  devices = batch_devices(mesh)
  replicated = NamedSharding(mesh, P())

  def put(path, leaf):
    array = np.asarray(leaf)
    if array.ndim == 0:
      target = replicated
    elif array.shape[0] % devices:
      raise ValueError(f'batch leaf {path_str(path) or "<root>"}: batch size '
                       f'{array.shape[0]} is not divisible by data*fsdp = {devices}')
    else:
      target = batch_sharding(mesh)
    # global_shape == local shape: every process holds the whole array and keeps its part.
    return jax.make_array_from_process_local_data(target, array, array.shape)

  return jax.tree_util.tree_map_with_path(put, tree)


def initialize_multihost(coordinator: Optional[str] = None, num_processes: Optional[int] = None,
                         process_id: Optional[int] = None) -> None:
  """Starts JAX's multi-process runtime; call before any other JAX call.

  With no arguments JAX detects the cluster itself (TPU pods, SLURM, ...). Otherwise all three
  must be given: coordinator 'host:port', the number of processes and this process's id.
  """
  given = [a is not None for a in (coordinator, num_processes, process_id)]
  if not any(given):
    jax.distributed.initialize()
    return
  if not all(given):
    raise ValueError('initialize_multihost: give all of coordinator, num_processes and process_id '
                     f'or none of them (got coordinator={coordinator!r}, '
                     f'num_processes={num_processes!r}, process_id={process_id!r})')
  if not 0 <= process_id < num_processes:
    raise ValueError(f'initialize_multihost: process_id={process_id} not in [0, {num_processes})')
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                             process_id=process_id)
