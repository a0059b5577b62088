"""Warm-starts a model on the built-in task's worked solutions (cached in WORKDIR/sft).

  python launch/sft.py --config=configs/ac2.py --workdir=/tmp/ac2_run

`tpu_run.py` runs this itself when no initial checkpoint is configured; the result is a Hugging Face
checkpoint directory that `--config.model.init_checkpoint` also accepts.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from ac2_jax.train import cli, console, experiment

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file (configs/*.py[:arg]).',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory; the warm start goes to WORKDIR/sft.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # tfds logs every shard it writes at INFO
  config = cli.load_config(_CONFIG)
  console.quiet_progress_bars()  # no tqdm bars in a log file
  try:
    experiment.validate(config)
    task, tok = experiment.build_task(config, _WORKDIR.value, config.model.init_checkpoint or None)
    print(experiment.initial_checkpoint(config, _WORKDIR.value, task, tok))
  except experiment.ConfigError as e:
    sys.exit(f'FATAL config error: {e}')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
