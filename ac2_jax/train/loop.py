"""The host loop: steps, evaluation, metrics, checkpoints, resume and SIGTERM, plots at the end.

A run is a pure function of its config and the step number: every step's PRNG key is derived from
(seed, step), and the host state (controller, schedules, cumulative FLOPs) is saved with the
parameters, so a run resumed from its workdir writes the same later metrics as one never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import jax
import ml_collections

from ac2_jax.train import checkpointing, console, distributed, experiment, metrics as metrics_lib
from ac2_jax.train import plots
from ac2_jax.train.evaluation import evaluate

PROGRESS_KEYS = ('step', 'reward/judged_mean', 'reward/refill_mean', 'ready_fraction',
                 'critic_error', 'entropy', 'val/mean_score', 'step_time')


@dataclasses.dataclass
class RunSummary:
  workdir: str
  last_step: int
  start_score: float | None
  final_score: float | None
  plots: list[str]


class _StopFlag:
  """Turns SIGTERM into a checkpoint at the end of the current step (preemption)."""

  def __init__(self):
    self.stop = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread: no handler, the run just continues
      self._previous = None
    return self

  def _handle(self, signum, frame):
    self.stop = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def _eval(run: experiment.RunSettings, rt, state, step):
  return evaluate(rt, state.params, jax.random.fold_in(jax.random.key(run.seed + 1), step),
                  num_problems=run.eval_problems, num_responses=run.eval_responses,
                  max_new_tokens=run.eval_max_new_tokens)


def train(c: ml_collections.ConfigDict, workdir: str, *, stop_after: int | None = None,
          log=print) -> RunSummary:
  """Trains to `c.num_steps` (or stops after step `stop_after`, checkpointing, for tests)."""
  run = experiment.run_settings(c)
  os.makedirs(workdir, exist_ok=True)
  is_main = jax.process_index() == 0
  if is_main:
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      f.write(run.config_json)
  rt, algorithm, state = experiment.build(c, workdir, log=log if is_main else (lambda *_: None))
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'),
                                    keep=run.checkpoints_kept)
  logger = metrics_lib.MetricsLogger(workdir, enabled=is_main)
  host = {'flops_cum': 0.0, 'start_score': None, 'last_score': None}
  start = 0
  if ckpt.latest_step() is not None:
    start, state, saved = ckpt.restore(state)
    algorithm.load_state_dict(saved['algorithm'])
    host = saved['host']
    logger.truncate_after(start)
    log(f'resumed from step {start} in {workdir}')
  else:
    # A run that stopped before its first checkpoint left records that no state matches.
    logger.truncate_after(-1)
    scores = _eval(run, rt, state, 0)
    host['start_score'] = host['last_score'] = scores['val/mean_score']
    logger.write(0, {**scores, 'decoding_flops_cum': 0.0})
    log(f'step 0: validation score {scores["val/mean_score"]:.4f} (start of RL)')

  def save(step):
    ckpt.save(step, state, {'algorithm': algorithm.state_dict(), 'host': host})

  last = start
  eta = console.Eta(start + 1, run.num_steps)
  with _StopFlag() as flag:
    for step in range(start + 1, run.num_steps + 1):
      t0 = time.time()
      state, record = algorithm.step(rt, state, step, experiment.step_key(run.seed, step))
      host['flops_cum'] += record['decoding_flops']
      record['decoding_flops_cum'] = host['flops_cum']
      record['step_time'] = time.time() - t0
      if step % run.eval_every == 0 or step == run.num_steps:
        scores = _eval(run, rt, state, step)
        host['last_score'] = scores['val/mean_score']
        record.update(scores)
      written = logger.write(step, record)
      if step % run.log_every == 0:
        log(metrics_lib.progress_line(written, PROGRESS_KEYS)
            + f' eta={console.format_duration(eta.seconds_left(step))}')
      last = step
      # All processes must save and stop at the same step (SIGTERM may reach one host only).
      stopping = distributed.any_process(flag.stop) or step == stop_after
      if step % run.checkpoint_every == 0 or step == run.num_steps or stopping:
        save(step)
      if stopping:
        log(f'stopping after step {step} (checkpoint saved)')
        break
  logger.close()
  ckpt.close()
  paths = plots.plot_run(workdir) if is_main else []
  summary = RunSummary(workdir, last, host['start_score'], host['last_score'], paths)
  if is_main:
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
      json.dump(dataclasses.asdict(summary), f, indent=2)
  return summary
