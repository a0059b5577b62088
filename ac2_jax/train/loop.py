"""The host loop: steps, evaluation, metrics, checkpoints, resume and SIGTERM, plots at the end.

A run is a pure function of its config and the step number: every step's PRNG key is derived from
(seed, step), and the host state (controller, schedules, cumulative FLOPs) is saved with the
parameters, so a run resumed from its workdir writes the same later metrics as one never stopped.

Before any work the config is validated (`experiment.validate`) and compared with the run the
workdir already holds (`run_record.check_resume`); a rejected config writes nothing. SIGTERM and
SIGINT (preemption) save at the end of the current step and return `finished=False`; the
launcher then exits with `cli.EXIT_PREEMPTED`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import jax
import ml_collections

from ac2_jax.algorithms import timing
from ac2_jax.train import checkpointing, console, distributed, experiment, metrics as metrics_lib
from ac2_jax.train import compile_cache, plots, run_record
from ac2_jax.train.evaluation import evaluate

# What a user got wrong: the launchers print these in one line and exit with status 1.
USER_ERRORS = (experiment.ConfigError, run_record.ResumeRefused)

PROGRESS_KEYS = ('step', 'reward/judged_mean', 'reward/refill_mean', 'ready_fraction',
                 'critic_error', 'entropy', 'val/mean_score', 'step_time')


@dataclasses.dataclass
class RunSummary:
  workdir: str
  last_step: int
  start_score: float | None
  final_score: float | None
  plots: list[str]
  num_steps: int = 0
  finished: bool = True            # False: stopped early (SIGTERM/SIGINT, stop_after)
  # AC2: how far the critic carried the run (train/metrics.mechanism_summary); {} otherwise.
  mechanism: dict = dataclasses.field(default_factory=dict)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _StopFlag:
  """Turns SIGTERM and SIGINT into a checkpoint at the end of the current step (preemption)."""

  def __init__(self):
    self.stop = False
    self._previous = {}

  def __enter__(self):
    for sig in STOP_SIGNALS:
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: no handler, the run just continues
        pass
    return self

  def _handle(self, signum, frame):
    self.stop = True

  def __exit__(self, *exc):
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)


def _eval(run: experiment.RunSettings, rt, state, step):
  return evaluate(rt, state.params, jax.random.fold_in(jax.random.key(run.seed + 1), step),
                  num_problems=run.eval_problems, num_responses=run.eval_responses,
                  max_new_tokens=run.eval_max_new_tokens)


def train(c: ml_collections.ConfigDict, workdir: str, *, stop_after: int | None = None,
          allow_config_change: bool = False, log=print) -> RunSummary:
  """Trains to `c.num_steps` (or stops after step `stop_after`, checkpointing, for tests).

  Raises one of USER_ERRORS, before writing anything, for a config that cannot run or that
  differs from the run in `workdir` (unless `allow_config_change`); also, after the data build
  and the warm start, for a checkpoint that does not load or whose vocabulary is too small, with
  WORKDIR/config.json not yet (over)written.
  """
  settings = experiment.validate(c)
  run = settings.run
  if run.compilation_cache_dir:  # before the first compile of the process, or it is not used
    compile_cache.enable(run.compilation_cache_dir)
  is_main = jax.process_index() == 0
  quiet = log if is_main else (lambda *_: None)
  run_record.check_resume(workdir, run.config_json, allow_change=allow_config_change, log=quiet)
  rt, algorithm, state = experiment.build(c, workdir, log=quiet, settings=settings)
  # Only a config that built (its checkpoint loads, its vocabulary fits) replaces the stored one.
  os.makedirs(workdir, exist_ok=True)
  if is_main:
    run_record.write_config(workdir, run.config_json)
  ckpt = checkpointing.Checkpointer(os.path.join(workdir, 'checkpoints'),
                                    keep=run.checkpoints_kept)
  logger = metrics_lib.MetricsLogger(workdir, enabled=is_main)
  audit_log = metrics_lib.StepLog(os.path.join(workdir, metrics_lib.AUDITS_FILE), enabled=is_main)
  host = {'flops_cum': 0.0, 'start_score': None, 'last_score': None}
  start = 0
  restored = ckpt.restore_newest_intact(state, log=quiet)
  if restored is not None:
    start, state, saved = restored
    algorithm.load_state_dict(saved['algorithm'])
    host = saved['host']
    logger.truncate_after(start)
    audit_log.truncate_after(start)
    log(f'resumed from step {start} in {workdir}')
  else:
    # A run that stopped before its first checkpoint left records that no state matches.
    logger.truncate_after(-1)
    audit_log.truncate_after(-1)
    scores = _eval(run, rt, state, 0)
    host['start_score'] = host['last_score'] = scores['val/mean_score']
    logger.write(0, {**scores, 'decoding_flops_cum': 0.0})
    log(f'step 0: validation score {scores["val/mean_score"]:.4f} (start of RL)')

  def save(step):
    ckpt.save(step, state, {'algorithm': algorithm.state_dict(), 'host': host,
                            'config': json.loads(run.config_json)})

  last, stopped = start, False
  eta = console.Eta(start + 1, run.num_steps)
  try:
    with _StopFlag() as flag, timing.CompileClock() as compiles:
      for step in range(start + 1, run.num_steps + 1):
        compiles.lap()  # the evaluation's programs are not the step's
        t0 = time.time()
        state, record = algorithm.step(rt, state, step, experiment.step_key(run.seed, step))
        host['flops_cum'] += record['decoding_flops']
        record['decoding_flops_cum'] = host['flops_cum']
        record['step_time'] = time.time() - t0
        # Inside the phases' times: the step without them is step_time - time/compile.
        record['time/compile'] = compiles.lap()
        if step % run.eval_every == 0 or step == run.num_steps:
          scores = _eval(run, rt, state, step)
          host['last_score'] = scores['val/mean_score']
          record.update(scores)
        written = logger.write(step, record)
        audits = algorithm.audited_groups()
        if audits is not None:
          audit_log.write(step, {'groups': audits})
        if step % run.log_every == 0:
          log(metrics_lib.progress_line(written, PROGRESS_KEYS)
              + f' eta={console.format_duration(eta.seconds_left(step))}')
        last = step
        # All processes must save and stop at the same step (SIGTERM may reach one host only).
        stopping = distributed.any_process(flag.stop) or step == stop_after
        if step % run.checkpoint_every == 0 or step == run.num_steps or stopping:
          save(step)
        if stopping:
          stopped = step < run.num_steps
          log(f'stopping after step {step} (checkpoint saved)')
          break
  finally:
    algorithm.close()  # an in-flight rollout worker stops with the run
  logger.close()
  ckpt.close()
  finished = not stopped and last >= run.num_steps
  paths = plots.plot_run(workdir) if is_main and finished else []
  summary = RunSummary(workdir, last, host['start_score'], host['last_score'], paths,
                       num_steps=run.num_steps, finished=finished,
                       mechanism=metrics_lib.mechanism_summary(metrics_lib.read_metrics(
                           logger.path)) if is_main and os.path.exists(logger.path) else {})
  if is_main:
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
      json.dump(dataclasses.asdict(summary), f, indent=2)
  return summary
