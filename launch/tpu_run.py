"""Trains with a config file (Cloud TPU, GPUs, or a CPU with the built-in task).

  python launch/tpu_run.py --config=configs/ac2.py --workdir=/tmp/ac2_run
  python launch/tpu_run.py --config=configs/ac2.py:qwen3_4b,no_audit --workdir=... --config.seed=1
"""

from absl import app, flags
from ml_collections import config_flags

from ac2_jax.train import loop

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file (configs/*.py[:arg]).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory: checkpoints, metrics, plots.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  summary = loop.train(_CONFIG.value, _WORKDIR.value)
  print(f'validation score: start {summary.start_score:.4f} -> final {summary.final_score:.4f}')
  print('plots:', *summary.plots, sep='\n  ')


if __name__ == '__main__':
  app.run(main)
