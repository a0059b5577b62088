"""In-flight rollouts beside the training mesh, on one process or several.

The split (config rollout.devices = n): the last n local devices of every process form that
process's rollout sub-mesh (`sharding.rollout_mesh`: rows over 'data', weights replicated); every
other device of every process forms the training mesh. The trainer's state, updates, value reads
and evaluation live on the training mesh only; the worker thread generates on its process's
rollout sub-mesh only. After every update the trainer copies the new weights across
(`rollout_params`): gathered to the host from the training shards of every process, then placed
on the local rollout devices.

Why process-local sub-meshes. Every process runs the same host program (SPMD), and a computation
with cross-process collectives must be issued by every process in the same order. The trainer's
thread does that. The worker thread runs on its own clock, so computations it issued on a mesh
that spans processes would interleave with the trainer's differently on each process, and
collectives issued in different orders by two threads can deadlock under the CPU (gloo) and other
collective backends. On a process-local sub-mesh generation needs no collective with another
process: the worker thread never takes part in the SPMD order. The cross-process work (the weight
gather, the agreement below, the exchange of rollouts) runs on the trainer's thread, at the same
points of every process's program. (JAX's multihost_utils collectives span every device, the
rollout devices included; a generation call running there can delay such a collective, never
block it, since it waits on no other process.)

Why the take is agreed. Each process's worker generates its own share of a batch (rows / P of
them, drawn with its own problem stream and key), and how far it got when the trainer asks for a
batch differs per process. The batch every process trains on must be the same, so a take is
agreed: each process checks, without blocking, whether its share is finished
(`RolloutWorker.poll`; a share once taken is held until the others have theirs); then the
processes gather every process's (finished, failed) flags. The decision is a function of the gathered flags, the same on
every process, so all leave the polling loop at the same round (and all raise when any worker
failed, rather than leaving the others waiting in a collective). Then every process's share is
gathered in process order: each process holds the same batch, tokens, log-probabilities,
entropies, per-token versions and stop reasons; drop counts and FLOPs are summed over the
processes, generation seconds averaged.

What could differ between processes: only when a share was finished, which changes how much
the worker generated ahead (the next batch), never what the trainer trains on. With one process
the agreement is a plain blocking take.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from ac2_jax import device_reads, sampling, sharding
from ac2_jax.controller.inflight import Rollout, Taken

STOP_REASONS = (sampling.STOP_EOS, sampling.STOP_CHUNK_CAP, sampling.STOP_BUDGET)


def rollout_params(params, mesh: Mesh | None):
  """A copy of `params` for the worker, in fresh buffers (the trainer donates its own): on the
  rollout sub-mesh `mesh`, gathered across processes first when the training mesh spans several;
  or in place (None: no sub-mesh)."""
  if mesh is None:
    copy = jax.tree.map(jnp.copy, params)
  else:
    if not all(x.is_fully_addressable for x in jax.tree.leaves(params)):
      with device_reads.allowed('rollout_weights_gather'):
        params = multihost_utils.process_allgather(params, tiled=True)
    copy = jax.device_put(params, sharding.param_shardings(params, mesh))
  return jax.block_until_ready(copy)


@jax.jit
def _square_sum(params) -> jax.Array:
  return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(params))


def square_sum(params) -> float:
  """Sum of the squares of every weight: a fingerprint of the weights the worker holds."""
  return float(device_reads.read('rollout_weights_fingerprint', _square_sum(params)))


def allgather(arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
  """Every process's 1-D `arrays` (the same keys and dtypes on every process, any lengths), in
  process order, on every process. Collectives: call on the trainer's thread, on all processes."""
  if jax.process_count() == 1:
    return [arrays]
  keys = sorted(arrays)
  lengths_PxK = np.asarray(multihost_utils.process_allgather(
      np.array([len(arrays[k]) for k in keys], np.int32)))
  widths = lengths_PxK.max(0)
  padded = {k: np.concatenate([arrays[k], np.zeros(w - len(arrays[k]), arrays[k].dtype)])
            for k, w in zip(keys, widths)}
  gathered = multihost_utils.process_allgather(padded)
  return [{k: np.asarray(gathered[k][p, :lengths_PxK[p, i]]) for i, k in enumerate(keys)}
          for p in range(len(lengths_PxK))]


def _pack(taken: Taken, flops: float, busy: float) -> dict[str, np.ndarray]:
  rollouts = [r for g in taken.groups for r in g]
  ints = lambda xs: np.asarray(xs, np.int32).reshape(-1)
  floats = lambda xs: np.asarray(xs, np.float32).reshape(-1)
  return {
      # per rollout: problem, group id, tokens, stop reason
      'meta': ints([[r.problem_index, r.group, len(r.tokens), STOP_REASONS.index(r.stop_reason)]
                    for r in rollouts]),
      'tokens': ints([t for r in rollouts for t in r.tokens]),
      'versions': ints([v for r in rollouts for v in r.versions]),
      'logprobs': floats([x for r in rollouts for x in r.logprobs]),
      'entropies': floats([x for r in rollouts for x in r.entropies]),
      'counts': ints([taken.dropped_samples, taken.dropped_tokens]),
      'flops_busy': np.asarray([flops, busy], np.float32),
  }


def _unpack(parts: Sequence[dict[str, np.ndarray]], prompts: Sequence[np.ndarray],
            budget: int) -> list[list[Rollout]]:
  groups = []
  for part in parts:
    start, last = 0, None
    for problem, gid, n, stop in part['meta'].reshape(-1, 4).tolist():
      span = slice(start, start + n)
      start += n
      r = Rollout(problem, gid, np.asarray(prompts[problem], np.int32), budget,
                  part['tokens'][span].tolist(), part['logprobs'][span].tolist(),
                  part['entropies'][span].tolist(), part['versions'][span].tolist(),
                  STOP_REASONS[stop])
      if gid != last:
        groups.append([])
        last = gid
      groups[-1].append(r)
  return groups


def agreed_take(worker, rows: int, version: int, next_group_size: int | None,
                prompts: Sequence[np.ndarray], budget: int) -> tuple[Taken, float, float]:
  """The batch of every process's share (`rows` rows each) for policy `version`, the same on
  every process; its FLOPs (summed) and generation seconds (mean over processes). See the module
  docstring; `worker` is an `algorithms.inflight.RolloutWorker`."""
  if jax.process_count() == 1:
    return worker.take(rows, version, next_group_size)
  held, error = None, None
  while True:
    if held is None and error is None:
      try:
        held = worker.poll(rows, version, next_group_size)
      except RuntimeError as e:
        error = e
    flags_Px2 = np.asarray(multihost_utils.process_allgather(
        np.array([held is not None, error is not None], np.int32)))
    if flags_Px2[:, 1].any():
      failed = [int(p) for p in np.flatnonzero(flags_Px2[:, 1])]
      raise RuntimeError(f'the rollout worker of process(es) {failed} failed') from error
    if flags_Px2[:, 0].all():
      break
    worker.wait()
  parts = allgather(_pack(*held))
  counts = np.sum([p['counts'] for p in parts], axis=0)
  flops_busy = np.array([p['flops_busy'] for p in parts])
  taken = Taken(_unpack(parts, prompts, budget), int(counts[0]), int(counts[1]))
  return taken, float(flops_busy[:, 0].sum()), float(flops_busy[:, 1].mean())
