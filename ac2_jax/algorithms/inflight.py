"""In-flight asynchronous rollouts: a worker thread generates while the trainer trains.

The worker loops over `controller/inflight.py`'s pipeline: take the unfinished rollouts, generate
one segment of each (at most `segment_tokens` new tokens, continuing from its prefix) with the
weights published last, hand the segments back tagged with that policy version. The trainer
publishes a copy of its weights after every step (its jitted updates donate the state, so the
worker never holds a buffer the trainer frees); rollouts unfinished at that moment resume from
their prefix under the new weights at the worker's next segment. The trainer's step takes the next
finished batch (over-lag groups dropped by the pipeline), judges it, and trains on it, with the
log-probabilities stored per token for DIS.

Versions: the policy after step k is version k; step k trains at version k - 1, so a token sampled
by version v has lag k - 1 - v (0 in the synchronous mode). Per step the source reports the token
lag histogram, samples whose tokens span several versions (resumed after an update), samples and
tokens dropped, the worker's generation time over the step's wall time (overlap), and the time the
trainer waited for the batch.

With a rollout sub-mesh (config rollout.devices; `Runtime.rollout_mesh`) the worker generates on
its process's own rollout devices and the published weights are copied there; on several
processes each worker generates its share of every batch and the processes agree on each take
(algorithms/inflight_mesh.py says why and how).

`RolloutWorker.run_once` is one loop iteration without the thread: tests drive it step by step.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Sequence

import jax
import numpy as np

from ac2_jax.algorithms import inflight_mesh
from ac2_jax.algorithms import timing
from ac2_jax.algorithms import value_steps
from ac2_jax.controller import rng as rng_lib
from ac2_jax.controller.inflight import (InflightPipeline, InflightSettings, Rollout, Segment,
                                        Taken)
from ac2_jax.learner import rows as rows_lib
from ac2_jax.learner.runtime import Runtime
from ac2_jax.rl import flops as flops_lib

# (params, rollouts, key) -> (one Segment per rollout, decoding FLOPs)
Generate = Callable[[object, Sequence[Rollout], jax.Array], tuple[list[Segment], float]]


def sampler_segments(rt: Runtime, settings: InflightSettings) -> Generate:
  """The real generation call: each rollout continues from prompt + its tokens so far, for at most
  `segment_tokens` new tokens within its remaining budget; on the rollout sub-mesh if any. A
  rollout's segments count the decoding FLOPs of its one whole generation
  (`flops_lib.continuation_flops`)."""
  on = rt if rt.rollout_mesh is None else dataclasses.replace(rt, mesh=rt.rollout_mesh)

  def generate(params, rollouts: Sequence[Rollout], key: jax.Array):
    remaining = [r.remaining for r in rollouts]
    rows, _ = rows_lib.generate_rows(
        on, params, [r.context_P for r in rollouts], [len(r.tokens) for r in rollouts],
        [r.problem_index for r in rollouts], [min(settings.segment_tokens, n) for n in remaining],
        remaining, key, rt.train_sampling)
    cost = flops_lib.continuation_flops(
        rt.model_config, np.array([len(r.prompt_P) for r in rollouts]),
        np.array([len(r.tokens) for r in rollouts]), np.array([len(row.new_N) for row in rows]))
    return ([Segment(r.new_N, r.logprobs_N, r.entropies_N, r.stop_reason) for r in rows],
            float(np.sum(cost)))
  return generate


class RolloutWorker:
  """The pipeline behind a lock, the published weights, and the thread that generates."""

  def __init__(self, pipeline: InflightPipeline, generate: Generate, key: jax.Array,
               rollout_mesh=None):
    self.pipeline = pipeline
    self._generate = generate
    self.rollout_mesh = rollout_mesh  # where published weights go (None: a copy in place)
    self._key = key
    self._calls = 0
    self._cond = threading.Condition()
    self._params = None
    self.version = -1
    self._thread: threading.Thread | None = None
    self._stop = False
    self._error: BaseException | None = None
    self.flops = 0.0     # decoding FLOPs since the last take (dropped rollouts included)
    self.busy_s = 0.0    # generation seconds since the last take

  def publish(self, params, version: int):
    """Weights of policy `version` for the next segments (a copy: the trainer donates its own),
    on the rollout sub-mesh if any; returns the copy."""
    copy = inflight_mesh.rollout_params(params, self.rollout_mesh)
    with self._cond:
      self._params, self.version = copy, version
      self._cond.notify_all()
    return copy

  def run_once(self) -> bool:
    """One segment of every unfinished rollout; False when there was nothing to generate."""
    with self._cond:
      rollouts = self.pipeline.requests()
      params, version = self._params, self.version
      key = jax.random.fold_in(self._key, self._calls)
      self._calls += 1
    if not rollouts or params is None:
      return False
    start = time.perf_counter()
    segments, flops = self._generate(params, rollouts, key)
    with self._cond:
      self.pipeline.accept(rollouts, segments, version)
      self.flops += flops
      self.busy_s += time.perf_counter() - start
      self._cond.notify_all()
    return True

  def _loop(self) -> None:
    try:
      while not self._stop:
        if not self.run_once():
          with self._cond:  # full: wait until a take frees room (or close)
            self._cond.wait(timeout=0.05)
    except BaseException as e:  # handed to the trainer at its next take
      with self._cond:
        self._error = e
        self._cond.notify_all()

  def start(self) -> None:
    self._thread = threading.Thread(target=self._loop, name='rollout-worker', daemon=True)
    self._thread.start()

  def take(self, rows: int, version: int, next_group_size: int | None = None
           ) -> tuple[Taken, float, float]:
    """Blocks until `rows` finished rows are there; returns (taken, FLOPs, generation seconds)
    since the last take. With `next_group_size` the pipeline is reset to it in the same critical
    section (Li2SAO's switch: no group of the old size starts in between)."""
    while True:
      out = self.poll(rows, version, next_group_size)
      if out is not None:
        return out
      self.wait()

  def wait(self) -> None:
    """Until the worker accepts a segment (or 0.05 s pass)."""
    with self._cond:
      if self._thread is None:
        raise RuntimeError('take: not enough finished rollouts and no worker thread running')
      self._cond.wait(timeout=0.05)

  def poll(self, rows: int, version: int, next_group_size: int | None = None
           ) -> tuple[Taken, float, float] | None:
    """`take` without blocking: None while `rows` finished rows are not there."""
    with self._cond:
      if self._error is not None:
        raise RuntimeError('the rollout worker failed') from self._error
      taken = self.pipeline.take(rows, version)
      if taken is None:
        return None
      if next_group_size is not None and next_group_size != self.pipeline.group_size:
        self.pipeline.reset(next_group_size)
        samples, tokens = self.pipeline.pop_dropped()  # the leftovers, counted in this step
        taken.dropped_samples += samples
        taken.dropped_tokens += tokens
      flops, busy = self.flops, self.busy_s
      self.flops = self.busy_s = 0.0
      self._cond.notify_all()
    return taken, flops, busy

  def close(self) -> None:
    with self._cond:
      self._stop = True
      self._cond.notify_all()
    if self._thread is not None:
      self._thread.join()
      self._thread = None


def lag_metrics(rows: Sequence[rows_lib.Row], version: int, max_lag: int) -> dict:
  """Token lag histogram (fractions for lags 0..max_lag), mean lag, and the share of samples whose
  tokens come from more than one policy version."""
  lags = np.concatenate([version - r.versions_N for r in rows])
  out = {f'rollout/lag/{k}': float(np.mean(lags == k)) for k in range(max_lag + 1)}
  out['rollout/lag_mean'] = float(lags.mean())
  out['rollout/resumed_samples'] = float(np.mean([len(set(r.versions_N.tolist())) > 1
                                                  for r in rows]))
  return out


class InflightSource:
  """Batches from the worker for an algorithm's steps: judged `value_steps.Rollouts`."""

  def __init__(self, rt: Runtime, settings: InflightSettings, seed: int, group_size: int,
               rows: int, generate: Generate | None = None):
    processes = jax.process_count()
    if rows % (processes * group_size):
      raise ValueError(f'in-flight rollouts on {processes} processes: each generates its share '
                       f'of a batch in whole groups, so {rows} rows must split into groups of '
                       f'{group_size} per process')
    self.rt, self.settings, self.seed = rt, settings, seed
    self.rows = rows
    self.share = rows // processes  # this process's rows of each batch
    self.group_size = group_size
    self._generate = generate or sampler_segments(rt, settings)
    self.worker: RolloutWorker | None = None
    self._last_take = None

  def _start(self, params, step: int, group_size: int) -> None:
    # A resumed run draws anew; each process draws its own problems and tokens.
    process = jax.process_index()
    rng = rng_lib.generator(self.seed, 'inflight_problems', step, process)
    pipeline = InflightPipeline(self.settings, self.rt.train_prompts,
                                lambda: rng.integers(len(self.rt.train_records)),
                                group_size, capacity=self.share)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), 0x1F1F + step),
                             process)
    mesh = self.rt.rollout_mesh
    if mesh is not None:  # the worker thread's own computations stay on its devices
      key = jax.device_put(key, mesh.devices.flat[0])
    self.worker = RolloutWorker(pipeline, self._generate, key, mesh)
    self.worker.publish(params, step - 1)
    self.worker.start()
    self._last_take = time.perf_counter()

  def take(self, state, step: int, timer: timing.PhaseTimer,
           next_group_size: int | None = None) -> tuple[value_steps.Rollouts, int, dict]:
    """The next batch for step `step` (trainer version step - 1), judged; its group size; and the
    rollout metrics. `next_group_size` changes the size of the groups requested from now on."""
    if self.worker is None:  # the first step of a run, or of a resumed one
      self._start(state.params, step, next_group_size or self.group_size)
    version = step - 1
    with timer('wait_rollouts'):
      taken, flops, busy = inflight_mesh.agreed_take(
          self.worker, self.share, version, next_group_size, self.rt.train_prompts,
          self.settings.response_budget)
    now = time.perf_counter()
    window, self._last_take = now - self._last_take, now
    n = len(taken.groups[0])
    self.group_size = self.worker.pipeline.group_size
    rows = [rows_lib.Row(r.problem_index, r.prompt_P, 0, np.asarray(r.tokens, np.int32),
                         np.asarray(r.logprobs, np.float32), np.asarray(r.entropies, np.float32),
                         r.stop_reason, weight=1.0, versions_N=np.asarray(r.versions, np.int32))
            for group in taken.groups for r in group]
    texts = rows_lib.response_texts(self.rt, rows)
    with timer('judge'):
      grades = self.rt.task.score_batch([self.rt.train_records[r.problem_index] for r in rows],
                                        texts)
    rewards_R = np.array([g.reward for g in grades], np.float32)
    data = value_steps.Rollouts(rows, rewards_R, sum(not g.valid for g in grades), flops)
    metrics = {**lag_metrics(rows, version, self.settings.max_policy_lag),
               'rollout/dropped_samples': taken.dropped_samples,
               'rollout/dropped_tokens': taken.dropped_tokens,
               'rollout/overlap': min(busy / window, 1.0) if window > 0 else None}
    return data, n, metrics

  def publish(self, state, step: int, timer: timing.PhaseTimer) -> dict:
    """The weights after step `step` (policy version `step`) for the worker's next segments;
    returns their fingerprint as the worker holds them (`inflight_mesh.square_sum`)."""
    with timer('publish_weights'):
      copy = self.worker.publish(state.params, step)
    return {'rollout/weights_square_sum': inflight_mesh.square_sum(copy)}

  def close(self) -> None:
    if self.worker is not None:
      self.worker.close()
      self.worker = None
