"""Multi-process runs: starting JAX's runtime, and what runs on which process.

Every process runs the same program (multi-controller SPMD). Who does what:

  identical on all processes   the controller and the algorithms (deterministic given the seed, the
                               step and the step's results), the sampler's outputs (gathered to
                               every host), the built-in task's deterministic verifier, batches
                               (every host assembles the whole global batch; each device takes its
                               rows: `sharding.put_batch`).
  process 0, then broadcast    judge calls that leave the machine (the HTTP judge): one set of
                               requests, and every process receives the same grades, so the
                               controllers cannot drift apart on a non-deterministic judge.
  process 0 first, then others preparing shared files (tfds data, the SFT warm start): process 0
                               builds them, the others wait and then find them cached.
  process 0 only               metrics.jsonl, audits.jsonl (AC2), TensorBoard, plots, summary.json,
                               config.json.
  agreed by all                stopping early: SIGTERM may reach one host only, so after every step
                               the processes stop if any of them was asked to (`any_process`).
  orbax                        checkpoints: every process writes its own shards; orbax
                               coordinates the directories and the JSON host state.

Cross-process agreement uses small device collectives (`multihost_utils`), so on CPU the
collectives implementation must be set ('gloo', the default in current JAX).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

from ac2_jax import sharding


def start(coordinator: Optional[str] = None, num_processes: Optional[int] = None,
          process_id: Optional[int] = None) -> str:
  """Starts JAX's multi-process runtime if there is one to start; call before any other JAX call.

  With all three arguments: that cluster (any machines, CPU included). With none: whatever
  `jax.distributed.initialize()` discovers (Cloud TPU pods, SLURM, Open MPI, ...); where it finds
  no cluster, the run stays a single process. Returns a line saying which happened.
  """
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if coordinator is None and num_processes is None and process_id is None:
    try:
      jax.distributed.initialize()
    except ValueError as e:
      # JAX raises this exact complaint when no cluster environment was detected.
      if 'coordinator_address' not in str(e):
        raise
      return 'single process (no cluster environment detected)'
  else:
    sharding.initialize_multihost(coordinator, num_processes, process_id)
  return (f'process {jax.process_index()} of {jax.process_count()}: '
          f'{jax.local_device_count()} local of {jax.device_count()} devices')


def is_main() -> bool:
  return jax.process_index() == 0


@contextlib.contextmanager
def main_process_first(name: str):
  """Process 0 runs the block first; the others wait for it, then run the block themselves.

  For blocks that prepare files on a shared file system (a tfds build, the SFT warm start): the
  others then find the results cached instead of writing the same files at the same time.
  """
  if jax.process_count() == 1:
    yield
    return
  barrier = f'ac2_jax main_process_first {name}'
  if not is_main():
    multihost_utils.sync_global_devices(barrier)
  yield
  if is_main():
    multihost_utils.sync_global_devices(barrier)


def any_process(flag: bool) -> bool:
  """True on every process when `flag` is True on any (e.g. one host received SIGTERM)."""
  if jax.process_count() == 1:
    return flag
  return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


def broadcast_json(value: Any) -> Any:
  """Process 0's JSON-able `value`, on every process (others may pass anything, e.g. None)."""
  if jax.process_count() == 1:
    return value
  payload = np.frombuffer(json.dumps(value).encode() if is_main() else b'', np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.int64(payload.size)))
  buffer = payload if is_main() else np.zeros(size, np.uint8)
  received = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
  return json.loads(received.astype(np.uint8).tobytes().decode())


class MainProcessJudge:
  """A judge whose requests are sent by process 0 only; every process gets the same grades."""

  def __init__(self, judge):
    self.judge = judge

  def grade_batch(self, requests: Sequence[Any]) -> list:
    from ac2_jax.judges import grading  # judges/ stays optional for the built-in task

    grades = self.judge.grade_batch(requests) if is_main() else None
    rows = broadcast_json([dataclasses.asdict(g) for g in grades] if is_main() else None)
    return [grading.Grade(**row) for row in rows]

  def close(self) -> None:
    if hasattr(self.judge, 'close'):
      self.judge.close()
