"""Flag parsing for the launch scripts: a user error ends the program with one line, no traceback.

ml_collections reports an override of a key the config does not have as an AttributeError deep
in absl's parser (a traceback ending in `AttributeError: "'foo'"`); the launchers pass
`parse_flags` to `app.run` so that a typo reads as `unknown config key 'sft.stepz' in
--config.sft.stepz=1 (Did you mean "steps" instead of "stepz"?)` instead. A value of the wrong
type (`--config.num_steps=abc`) and a missing required flag end the same way, and `load_config`
turns a config file that does not load (missing file, unknown variant) into one line too.

Exit statuses of the launchers (documented in README.md):
  0   finished
  1   a user error (bad flag, bad config, refused resume): one line on stderr, nothing written
  75  stopped by SIGTERM/SIGINT after saving a checkpoint (EX_TEMPFAIL: rerun the same command)
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Sequence

from absl import flags

EXIT_PREEMPTED = 75  # os.EX_TEMPFAIL: a scheduler may requeue the same command


def _unknown_key_message(error: AttributeError, argv: list[str]) -> str:
  text = str(error)
  try:  # ml_collections wraps a KeyError, whose str() is the repr of its message
    text = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    pass
  name, _, hint = str(text).partition('\n')
  name = name.strip('\'"')
  overrides = [a for a in argv if a.startswith('--config.')]
  culprit = next((a for a in overrides if a.split('=', 1)[0].rsplit('.', 1)[-1] == name), None)
  where = f' in {culprit}' if culprit else ''
  key = culprit.split('=', 1)[0][len('--config.'):] if culprit else name
  return f'unknown config key {key!r}{where}' + (f' ({hint.strip()})' if hint.strip() else '')


def _one_line(text: str) -> str:
  """A message in one line; of an error text that embeds a traceback, its last line."""
  text = str(text)
  if 'Traceback (most recent call last)' in text:
    head = text.split(': ', 1)[0]
    lines = [line for line in text.splitlines() if line.strip()]
    text = f'{head}: {lines[-1].strip()}'
  return ' '.join(text.split())


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """`app.run(main, flags_parser=parse_flags)`: absl parsing, every flag error in one line."""
  try:
    return flag_values(argv)
  except AttributeError as e:
    sys.exit(f'FATAL Flags parsing error: {_unknown_key_message(e, argv)}')
  except flags.Error as e:  # a value of the wrong type, a missing required flag
    sys.exit(f'FATAL Flags parsing error: {_one_line(e)}')


def load_config(holder, name: str = 'config', flag_values: flags.FlagValues = flags.FLAGS):
  """`holder.value` of a `config_flags.DEFINE_config_file` flag, or exit with one line.

  ml_collections loads the file lazily and reports a failure as a chained multi-line error.
  """
  try:
    config = holder.value
    config.keys()  # a file that failed to load gives a stand-in that raises on any access
    return config
  except Exception as e:  # noqa: BLE001 - any error of the user's config file ends here
    spec = str(getattr(flag_values[name], 'config_filename', '') or '')
    path = spec.split(':', 1)[0]
    if path and not os.path.isfile(path):
      sys.exit(f'FATAL config error: --{name}={spec}: no such file {path!r}')
    inner = e
    while inner.__cause__ is not None or inner.__context__ is not None:
      inner = inner.__cause__ or inner.__context__
    message = _one_line(str(inner).split('\n', 1)[0] or type(inner).__name__)
    sys.exit(f'FATAL config error: --{name}={spec}: {message}')


def config_from_args(config_arg: str, overrides: Sequence[str] = ()):
  """The config `--config=config_arg` with `KEY=VALUE` overrides, parsed as a launcher parses
  `--config.KEY=VALUE` (typed by the key; a bad key, value or file ends with one line): for
  scripts such as the benchmarks that take their own arguments."""
  from ml_collections import config_flags
  argv = ['script', f'--config={config_arg}'] + [f'--config.{item}' for item in overrides]
  flag_values = flags.FlagValues()
  # The override flags are defined from `sys_argv` (by default the process's own arguments).
  holder = config_flags.DEFINE_config_file('config', None, 'config file', flag_values=flag_values,
                                           lock_config=True, sys_argv=argv)
  parse_flags(argv, flag_values)
  return load_config(holder, flag_values=flag_values)
