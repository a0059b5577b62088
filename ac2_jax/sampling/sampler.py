"""The sampler's host API: generate continuations for a list of ragged requests in batched calls.

    out = generate(config, params, contexts, max_new_tokens=caps, settings=SamplingSettings(0.8),
                   key=jax.random.key(step), stop_ids=(tok.eos_id,), budget_new_tokens=budgets)
    out.tokens(i), out.logprobs(i), out.stop_reason_N[i], out.decode_forwards_N.sum()

Request i draws its t-th token with `fold_in(fold_in(key, row_ids[i]), t)` (row_ids default to
0..N-1), so its tokens do not depend on the other requests, on how they are grouped into batches,
on padding, or on the device mesh.
"""

from __future__ import annotations

from typing import Sequence

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from ac2_jax import device_reads, sharding
from ac2_jax.models.config import ModelConfig
from ac2_jax.sampling import decode
from ac2_jax.sampling import requests
from ac2_jax.sampling.requests import SampleOutput
from ac2_jax.sampling.settings import SamplingSettings


def check_mesh(mesh: Mesh | None) -> int:
  """Number of batch shards of `mesh` (1 without one); a mesh must have the three named axes."""
  if mesh is None:
    return 1
  missing = [a for a in sharding.AXES if a not in mesh.shape]
  if missing:
    raise ValueError(f'mesh: axes {missing} missing; the sampler needs axes {sharding.AXES} '
                     f'(see ac2_jax.sharding), got {tuple(mesh.shape)}')
  return mesh.shape['data'] * mesh.shape['fsdp']


def check_stop_ids(stop_ids: Sequence[int], vocab_size: int) -> tuple[int, ...]:
  """Stop ids as a sorted tuple (a static jit argument: one order, one compilation)."""
  ids = tuple(sorted({int(t) for t in stop_ids}))
  bad = [t for t in ids if not 0 <= t < vocab_size]
  if bad:
    raise ValueError(f'stop_ids {bad} lie outside the vocabulary [0, {vocab_size})')
  return ids


def check_key(key) -> jax.Array:
  if not isinstance(key, jax.Array) or not (
      jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) or key.shape == (2,)):
    raise ValueError(f'key: expected a PRNG key (jax.random.key(seed)), got {key!r}')
  return key


def to_device(array_BxN: np.ndarray, mesh: Mesh | None) -> jax.Array | np.ndarray:
  """Places a host array (the same on every process) with its rows over the batch axes."""
  return array_BxN if mesh is None else sharding.put_batch(array_BxN, mesh)


def to_host(tree, name: str):
  """The arrays of `tree` as numpy, in one read named `name` (`device_reads`): the host waits
  here for the device on purpose. Arrays that span processes are gathered first."""
  with device_reads.allowed(name):
    if all(x.is_fully_addressable for x in jax.tree.leaves(tree)):
      return jax.device_get(tree)
    return jax.tree.map(
        lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)


def generate(config: ModelConfig, params, contexts: Sequence[np.ndarray], max_new_tokens,
             settings: SamplingSettings, key: jax.Array, stop_ids: Sequence[int],
             budget_new_tokens=None, mesh: Mesh | None = None, *, row_ids=None,
             max_total_len: int | None = None, max_batch: int | None = None,
             short_cap: int = 0) -> SampleOutput:
  """Samples a continuation of every context.

  Each context is a prompt plus an optional replayed prefix. A row stops at the first stop token,
  at its own new-token cap, or when context plus new tokens reach `max_total_len`.

  Args:
    config, params: the decoder (params placed/sharded as for training under `mesh`).
    contexts: one 1-D int array per request.
    max_new_tokens: new-token cap per request (list/array) or one int for all.
    settings: temperature, top-p, top-k, greedy.
    key: PRNG key of the call.
    stop_ids: tokens that end a row (e.g. `(tokenizer.eos_id,)`); included in the output.
    budget_new_tokens: remaining response budget per request (>= its cap), None = equal to the
      caps; decides 'chunk_cap' vs 'budget'.
    mesh: a ('data', 'fsdp', 'tensor') mesh: rows over data and fsdp, KV heads over tensor.
    row_ids: per-request key index, default 0..N-1.
    max_total_len: context + new tokens limit, default `config.max_position_embeddings`.
    max_batch: at most this many requests per device call (grouped by context length).
    short_cap: requests whose cap is at most this many tokens (AC2's ready chunks) are generated
      in calls of their own (0: no split). A call decodes every row until its longest one stops,
      so a chunk of b tokens that shares a call with full continuations costs their length; on
      its own it costs b steps. Worth it where a decode step's cost grows with the rows (a CPU);
      on an accelerator a step costs about the same at any batch size and the split adds b
      sequential steps. The tokens are the same either way (per-row keys).

  Returns:
    A `SampleOutput` in request order.
  """
  batch_multiple = check_mesh(mesh)
  stop_ids = check_stop_ids(stop_ids, config.vocab_size)
  key = check_key(key)
  max_total_len = config.max_position_embeddings if max_total_len is None else max_total_len
  n = len(contexts)
  if n == 0:
    raise ValueError('generate: no contexts given')
  caps_N = requests.as_row_ints(max_new_tokens, n, 'max_new_tokens')
  budgets_N = (None if budget_new_tokens is None
               else requests.as_row_ints(budget_new_tokens, n, 'budget_new_tokens'))
  row_ids = np.arange(n) if row_ids is None else requests.as_row_ints(row_ids, n, 'row_ids')
  if max_batch is not None and max_batch < 1:
    raise ValueError(f'max_batch must be >= 1, got {max_batch}')
  if short_cap < 0:
    raise ValueError(f'short_cap must be >= 0, got {short_cap}')
  short_N = caps_N <= short_cap
  parts = [np.flatnonzero(short_N), np.flatnonzero(~short_N)] if short_N.any() else [np.arange(n)]
  groups = []
  for part in (p for p in parts if len(p)):
    if max_batch is None or len(part) <= max_batch:
      groups.append(part)
      continue
    # Similar lengths share a call, so each call pads little.
    order = part[np.argsort([-len(contexts[i]) for i in part], kind='stable')]
    groups += [order[i:i + max_batch] for i in range(0, len(part), max_batch)]

  if mesh is not None and NamedSharding(mesh, P()).is_fully_addressable:
    # Explicitly on every device: the jitted decoder's inputs arrive placed, none moved implicitly.
    # (A mesh over several processes cannot take a device_put of one process's key; there the key
    # goes in as an argument of the jitted call, as the same value on every process.)
    key = jax.device_put(key, NamedSharding(mesh, P()))
  outputs = []
  for rows in groups:
    packed = requests.pack(
        [contexts[i] for i in rows], caps_N[rows],
        None if budgets_N is None else budgets_N[rows], vocab_size=config.vocab_size,
        max_total_len=max_total_len, batch_multiple=batch_multiple,
        row_ids=row_ids[rows])
    device_out = decode.decode_batch(
        params, key, *(to_device(x, mesh) for x in (
            packed.contexts_BxP, packed.context_lengths_B, packed.caps_B, packed.row_ids_B)),
        config=config, settings=settings, stop_ids=stop_ids, max_new=packed.max_new, mesh=mesh)
    outputs.append(requests.unpack(packed, *to_host(device_out, 'sampler_outputs'), stop_ids))
  if len(outputs) == 1:
    return outputs[0]
  return requests.concat(outputs, np.concatenate(groups))
