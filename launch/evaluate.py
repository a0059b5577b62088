"""Evaluates a checkpoint on the validation split: mean@n, best-of-n, pass@k (unbiased estimator).

  python launch/evaluate.py --checkpoint=/tmp/ac2_run                  # a workdir: its latest
  python launch/evaluate.py --checkpoint=/tmp/ac2_run/checkpoints/40   # one checkpoint step
  python launch/evaluate.py --checkpoint=/ckpt/hf_dir --config=configs/ac2.py:bench

A workdir brings its config and its cumulative decoding FLOPs; an HF checkpoint needs `--config`
and builds the built-in task's data under --workdir. Writes --out (default:
WORKDIR/evaluation/step_<N>.json for a workdir, ./evaluate.json otherwise) and prints a table.
"""

import json
import os
import tempfile

from absl import app, flags, logging
from ml_collections import config_flags

from ac2_jax.train import checkpoint_eval, cli, console

_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'A workdir, WORKDIR/checkpoints/<step> or '
                                  'an HF checkpoint directory.')
_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file (configs/*.py[:arg]); '
                                          'needed for an HF checkpoint, overrides a workdir\'s.')
_WORKDIR = flags.DEFINE_string('workdir', os.path.join(tempfile.gettempdir(), 'ac2_evaluate'),
                               'Scratch dir for an HF checkpoint (the built-in data set).')
_NUM_PROBLEMS = flags.DEFINE_integer('num_problems', 128, 'Validation problems (first N).')
_NUM_RESPONSES = flags.DEFINE_integer('num_responses', 16, 'Responses per problem (n).')
_KS = flags.DEFINE_list('k', ['1', '2', '4', '8', '16'], 'pass@k values (those <= n are kept).')
_SEED = flags.DEFINE_integer('seed', 0, 'Sampling seed.')
_OUT = flags.DEFINE_string('out', '', 'Output JSON path.')
flags.mark_flags_as_required(['checkpoint'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  console.quiet_progress_bars()
  source = checkpoint_eval.resolve(_CHECKPOINT.value)
  config = _CONFIG.value
  if source.kind == 'hf' and config is None:
    raise app.UsageError('an HF checkpoint needs --config=configs/<algorithm>.py[:arg]')
  result = checkpoint_eval.evaluate_checkpoint(
      _CHECKPOINT.value, config=config, scratch_dir=_WORKDIR.value,
      num_problems=_NUM_PROBLEMS.value, num_responses=_NUM_RESPONSES.value,
      ks=tuple(int(k) for k in _KS.value), seed=_SEED.value)
  out = _OUT.value or (os.path.join(source.workdir, 'evaluation', f'step_{result["step"]}.json')
                       if source.workdir else 'evaluate.json')
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, 'w') as f:
    json.dump(result, f, indent=2)
  print(checkpoint_eval.table(result))
  print('wrote', out)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
