"""Trains with a config file (Cloud TPU, GPUs, or a CPU with the built-in task).

  python launch/tpu_run.py --config=configs/ac2.py --workdir=/tmp/ac2_run
  python launch/tpu_run.py --config=configs/ac2.py:qwen3_4b,no_audit --workdir=... --config.seed=1

Multi-process: run the same command on every host. On a Cloud TPU pod (or under SLURM) no extra
flags are needed: `jax.distributed.initialize()` discovers the cluster. Elsewhere give
`--coordinator=HOST:PORT --num_processes=N --process_id=I` (process 0 listens on HOST:PORT).
`--config.dry_run=True` checks shapes, shardings and memory per device of the full-size model
with `jax.eval_shape` on any CPU, without starting the cluster, loading or writing anything.
Exit status: 0 finished; 1 a user error (bad flag or config, a resume with another config, a
checkpoint that does not load or lacks rows for the tokenizer's ids), one line on stderr, nothing
written; 75 (EX_TEMPFAIL) stopped by SIGTERM/SIGINT with a checkpoint saved:
rerun the same command to continue. `--allow_config_change` resumes a workdir with a config that
differs in keys outside `run_record.RESUMABLE_KEYS`.
See docs/tpu.md and docs/gpu.md.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from ac2_jax.train import cli

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file (configs/*.py[:arg]).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory: checkpoints, metrics, plots.')
_COORDINATOR = flags.DEFINE_string('coordinator', None,
                                   'HOST:PORT of process 0 (multi-process runs off TPU pods).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes in the run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process, in [0, num_processes).')
_ALLOW_CHANGE = flags.DEFINE_bool('allow_config_change', False,
                                  'Resume a workdir whose run had a config differing in keys that '
                                  'change the run (algorithm, model, task, seed, ...).')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # tfds logs every shard it writes at INFO
  config = cli.load_config(_CONFIG)
  # Imported after the flags parse (JAX and TensorFlow take seconds): a bad flag fails at once.
  # pylint: disable-next=g-import-not-at-top
  from ac2_jax.train import console, distributed, dry_run, experiment, loop
  console.quiet_progress_bars()  # no tqdm bars in a log file
  if config.dry_run:  # no cluster is started: the mesh is abstract
    print(dry_run.run(experiment.dry_run_plan(config)).text())
    return
  print(distributed.start(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value))
  try:
    summary = loop.train(config, _WORKDIR.value, allow_config_change=_ALLOW_CHANGE.value)
  except loop.USER_ERRORS as e:
    sys.exit(f'FATAL config error: {e}')
  if not summary.finished:
    print(f'stopped at step {summary.last_step} of {summary.num_steps} (checkpoint saved); rerun '
          'the same command to continue')
    sys.exit(cli.EXIT_PREEMPTED)
  if distributed.is_main():
    print(f'validation score: start {summary.start_score:.4f} -> final {summary.final_score:.4f}')
    m = summary.mechanism
    if m:
      first = 'never' if m['first_ready_step'] is None else f'from step {m["first_ready_step"]}'
      second = m['ready_fraction_second_half']
      print(f'critic: {m["ready_problems"]} problems ready ({first}); ready fraction of replay '
            f'slots over the second half {0.0 if second is None else second:.2f}; '
            f'{m["critic_scored_share"] or 0.0:.1%} of rows were critic-scored chunks')
      if m['critic_audit_corr'] is not None:
        trusted = m['critic_trusted_share']
        print(f'audits: critic chunk advantages correlate {m["critic_audit_corr"]:.2f} with '
              f'Monte Carlo ones (mean over steps of the readiness window); the critic scored '
              f'chunks after {0.0 if trusted is None else trusted:.0%} of the steps with a ready '
              'problem')
        scale = m.get('chunk_advantage_scale')
        if scale is not None and scale != 1.0:
          print(f'audits: ready chunks\' critic advantages scaled by {scale:.2f} on average '
                '(controller.audit_scale)')
    print('plots:', *summary.plots, sep='\n  ')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
