"""A low-rank critic adapter: the critic is the policy asked by prompt, through weights W + A B.

AC2's critic is the policy itself (ALGORITHMS.md, AC2): its update trains the shared weights, so
every critic step also moves the actor. On the 1.1M-parameter CPU policy that drift is what holds
AC2 back (BENCHMARKS.md, "The walk, session 9": the critic's update moves the policy on the
actor's own rows 27x as far as an actor minibatch does, and AC2 that never routes a chunk to the
critic ends where AC2 does, 0.05 under Prefix GRPO). With `critic.adapter_rank` r > 0 the critic
update trains only a rank-r adapter on the decoder's matrices; generation and the actor update
read the policy's weights W, the critic's reads and update read W + A B. The critic still reads
the policy's own representation (W keeps moving with the actor; the warm start's critic is the
policy's, since B starts at 0); it just no longer writes into it. A departure from the paper,
kept as a setting (0, the default at paper scale, is the paper's shared-weight critic).

Each adapted kernel W of shape (*in, *out) is read as a matrix [prod(in), prod(out)] (the
attention output projection contracts its (heads, head_dim) axes, every other kernel its first
axis): A is [prod(in), r], B is [r, prod(out)], so every adapter leaf is 2-D and replicated
(`sharding.DEFAULT_RULES`: at rank 16 the adapter is a few percent of the weights).
"""

from __future__ import annotations

import math
import re

import flax.struct
import jax
import jax.numpy as jnp

from ac2_jax import sharding
from ac2_jax.learner import state as state_lib

# The decoder's matrices (models/qwen3.py): attention projections, MLP and an untied head.
TARGETS = re.compile(r'(^|/)(self_attn/[qkvo]_proj|mlp/(gate|up|down)_proj|lm_head)/kernel$')
# Kernels whose input is more than their first axis: o_proj [H, D, E] contracts (H, D).
_IN_AXES = {'o_proj': 2}


@flax.struct.dataclass
class AdapterState(state_lib.TrainState):
  """The policy's state with the critic's adapter; `critic_opt_state` holds the adapter's moments."""
  critic_adapter: dict


def _in_axes(name: str) -> int:
  return _IN_AXES.get(name.split('/')[-2], 1)


def init_adapter(params, rank: int, key: jax.Array) -> dict:
  """{path: {'lora_a', 'lora_b'}} nested like `params` over the adapted kernels. B = 0, so the
  adapted critic starts as the policy; A ~ N(0, 1/r), so a unit step of B moves W + A B by about
  a unit per entry: the critic's learning rate means what it means for the shared weights."""
  if rank <= 0:
    raise ValueError(f'critic adapter rank must be > 0, got {rank}')
  adapter = {}
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  for i, (path, w) in enumerate(flat):
    name = sharding.path_str(path)
    if not TARGETS.search(name):
      continue
    k = _in_axes(name)
    fan_in, fan_out = math.prod(w.shape[:k]), math.prod(w.shape[k:])
    a = jax.random.normal(jax.random.fold_in(key, i), (fan_in, rank), jnp.float32)
    node = adapter
    for part in name.split('/')[:-1]:
      node = node.setdefault(part, {})
    node['kernel'] = {'lora_a': a / math.sqrt(rank),
                      'lora_b': jnp.zeros((rank, fan_out), jnp.float32)}
  if not adapter:
    raise ValueError('no decoder matrix matches the critic adapter targets')
  return adapter


def merge(params, adapter: dict):
  """The critic's weights: `params` with W + A B on every adapted kernel (same tree, same dtypes)."""

  def add(path, w):
    node = adapter
    for part in sharding.path_str(path).split('/'):
      node = node.get(part) if isinstance(node, dict) else None
      if node is None:
        return w
    delta = (node['lora_a'] @ node['lora_b']).reshape(w.shape)
    return (w.astype(jnp.float32) + delta).astype(w.dtype)

  return jax.tree_util.tree_map_with_path(add, params)


def init_state(params, adapter: dict, optim: state_lib.OptimSettings) -> AdapterState:
  """The policy's state with the adapter beside it; the critic's Adam moments are the adapter's."""
  return AdapterState(params=params,
                      actor_opt_state=state_lib.actor_optimizer(optim).init(params),
                      critic_opt_state=state_lib.critic_optimizer(optim).init(adapter),
                      step=jnp.zeros((), jnp.int32), critic_adapter=adapter)


def critic_params(state):
  """The weights the critic reads with: the policy's, through the adapter when there is one."""
  if isinstance(state, AdapterState):
    return merge(state.params, state.critic_adapter)
  return state.params


def trained_field(state) -> str:
  """The field of `state` the critic update trains: the adapter, or the shared weights."""
  return 'critic_adapter' if isinstance(state, AdapterState) else 'params'
