"""Flag parsing for the launch scripts: a bad `--config.key=value` ends the program with one line.

ml_collections reports an override of a key the config does not have as an AttributeError deep
in absl's parser (a traceback ending in `AttributeError: "'foo'"`); the launchers pass
`parse_flags` to `app.run` so that a typo reads as `unknown config key 'sft.stepz' in
--config.sft.stepz=1 (Did you mean "steps" instead of "stepz"?)` instead.
"""

from __future__ import annotations

import ast
import sys

from absl import flags


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


def parse_flags(argv: list[str]) -> list[str]:
  """`app.run(main, flags_parser=parse_flags)`: absl parsing, with unknown config keys reported."""
  try:
    return flags.FLAGS(argv)
  except AttributeError as e:
    sys.exit(f'FATAL Flags parsing error: {_unknown_key_message(e, argv)}')
