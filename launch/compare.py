"""Methods against each other over seeds: one warm start per seed, the same evaluation for all.

  python launch/compare.py --methods=ac2,grpo,prefix_grpo --seeds=0,1,2 --config_arg=bench \
    --root=/tmp/compare
  python launch/compare.py --methods=ac2,ac2:no_local_readiness,ac2:chunk_small --config_arg=bench \
    --root=/tmp/ablations --quick
  python launch/compare.py --methods=grpo,ac2 --config_arg=bench --root=/tmp/compare \
    --set=num_steps=40 --set_for=ac2/critic.warmup=0:4000

A rerun with the same --root skips finished runs and resumes unfinished ones. Writes
ROOT/compare.json and ROOT/plots/*.png and prints the table (ac2_jax/train/compare.py). SIGTERM or
SIGINT stops the comparison after the current run's checkpoint, with exit status 75 (as tpu_run.py).
"""

import ast
import os
import sys

from absl import app, flags, logging

from ac2_jax.train import cli, compare, compile_cache, console

_METHODS = flags.DEFINE_list('methods', ['ac2', 'grpo', 'prefix_grpo'],
                             'configs/<name>.py (ac2, grpo, prefix_grpo, ppo, pact, lisao, '
                             'li2sao), variants after a colon (ac2:no_audit+group1, '
                             'ppo:lambda1).')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds; one warm start each.')
_ROOT = flags.DEFINE_string('root', None, 'Directory of the comparison (warm starts, runs, report).')
_CONFIG_ARG = flags.DEFINE_string('config_arg', '', 'Config argument of every method, e.g. bench.')
_QUICK = flags.DEFINE_bool('quick', False, f'First seed only, at most {compare.QUICK_STEPS} steps, '
                           f'{compare.QUICK_PROBLEMS} evaluation problems.')
_EVAL_EVERY = flags.DEFINE_integer('eval_every', 5, 'Steps between evaluations.')
_EVAL_PROBLEMS = flags.DEFINE_integer('eval_problems', 128, 'Validation problems per evaluation.')
_EVAL_RESPONSES = flags.DEFINE_integer('eval_responses', 8, 'Responses per validation problem.')
_SET = flags.DEFINE_multi_string('set', [], 'KEY=VALUE config override of every run (Python '
                                 'literal values), e.g. --set=num_steps=40.')
_SET_FOR = flags.DEFINE_multi_string('set_for', [], 'METHOD/KEY=VALUE override of the runs of one '
                                     'method: a config name (every variant) or one spec, e.g. '
                                     '--set_for=ac2/critic.warmup=0:4000 or '
                                     '--set_for=ac2:no_audit/num_steps=20.')
flags.mark_flags_as_required(['root'])


def _literal(text):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _method_override(text):
  selector, slash, assignment = text.partition('/')
  key, eq, value = assignment.partition('=')
  if not (slash and eq and selector and key):
    raise app.UsageError(f'--set_for={text!r}: expected METHOD/KEY=VALUE')
  return selector, key, _literal(value)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)
  console.quiet_progress_bars()
  root = os.path.abspath(_ROOT.value)
  # Every run of the comparison (and its warm starts) loads what an earlier one compiled.
  compile_cache.enable(os.path.join(root, 'jax_cache'))
  overrides = tuple((k, _literal(v)) for k, _, v in (s.partition('=') for s in _SET.value))
  report = compare.compare(compare.CompareSettings(
      methods=tuple(_METHODS.value), seeds=tuple(int(s) for s in _SEEDS.value), root=root,
      configs_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'configs'),
      config_arg=_CONFIG_ARG.value, quick=_QUICK.value, eval_every=_EVAL_EVERY.value,
      eval_problems=_EVAL_PROBLEMS.value, eval_responses=_EVAL_RESPONSES.value,
      overrides=overrides, method_overrides=tuple(_method_override(t) for t in _SET_FOR.value)))
  if report.get('stopped'):  # preempted: the stopped run saved its checkpoint
    sys.exit(cli.EXIT_PREEMPTED)


if __name__ == '__main__':
  app.run(main)
