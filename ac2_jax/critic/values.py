"""The critic's value grid: rounding targets onto it, parsing the critic's reply, formatting.

The critic answers with one of {0, 0.1, ..., 1}. Targets (group means) are rounded to the nearest
grid value with ties rounded down; a reply is parsed by its leading number and is invalid when that
number is off the grid.
"""

from __future__ import annotations

import math
import re

import numpy as np

GRID_STEPS = 10
GRID = tuple(i / GRID_STEPS for i in range(GRID_STEPS + 1))
# The most tokens a critic reply may have: a value and <|im_end|> ("0.7<|im_end|>"). Reads decode
# at most this many; the critic loss divides its value-token NLL by it (ALGORITHMS.md, AC2 8-9).
MAX_VALUE_TOKENS = 4

# The leading number of a reply (ALGORITHMS.md, AC2 step 8). Text after it is ignored, unless the
# number runs on past the match ('1.5', '1.05': the pattern alone would read 1): see `_RUNS_ON`.
VALUE_PATTERN = re.compile(r'^\s*(1(?:\.0+)?|0(?:\.\d+)?|\.\d+)')
# What, right after the match, means the number goes on: another digit, or a point and a digit.
_RUNS_ON = re.compile(r'\d|\.\d')

# Group means of g values on a 1/10 or 1/7 lattice sit at least 1/(7 g) grid steps from a tie unless
# they are exactly on it, so this tolerance only absorbs floating-point error (0.15000000000000002
# is a tie), in float64 and in float32 alike.
TIE_TOLERANCE = 1e-5


def round_to_grid_array(x_N, xp=np):
  """Nearest value of `GRID` to each `x` (clamped to [0, 1]); an exact tie rounds down (0.25 ->
  0.2). `xp` is the array module: numpy, or jax.numpy in jitted code (then float32 in, out)."""
  steps = xp.ceil(x_N * GRID_STEPS - 0.5 - TIE_TOLERANCE)
  return xp.clip(steps, 0, GRID_STEPS) / GRID_STEPS


def round_to_grid(x: float) -> float:
  """`round_to_grid_array` of one finite number, as a Python float."""
  x = float(x)
  if not math.isfinite(x):
    raise ValueError(f'round_to_grid: value must be finite, got {x!r}')
  return float(round_to_grid_array(np.float64(x)))


# How a critic target becomes the value tokens it trains: 'rounded' (the paper, Table 4: the nearest
# grid value, one token) | 'two_hot' (`two_hot`: the two grid values around it, weighted so that
# their mean is the target; read with the 'expectation' readout, the critic can then answer any
# value in [0, 1] rather than its cell's centre).
TARGETS = ('rounded', 'two_hot')


def two_hot(x: float) -> tuple[float, float, float]:
  """(lower, upper, upper_weight): the neighbouring grid values of `x` (clamped to [0, 1]) and the
  weight on the upper one, so that (1 - w) lower + w upper = x. On the grid: (x, x, 0).

  0.44 -> (0.4, 0.5, 0.4); 0.4 -> (0.4, 0.4, 0.0); 1.0 -> (1.0, 1.0, 0.0).
  """
  x = float(x)
  if not math.isfinite(x):
    raise ValueError(f'two_hot: value must be finite, got {x!r}')
  steps = min(max(x, 0.0), 1.0) * GRID_STEPS
  low = math.floor(steps + TIE_TOLERANCE)
  weight = steps - low
  if weight <= TIE_TOLERANCE or low >= GRID_STEPS:
    return GRID[min(low, GRID_STEPS)], GRID[min(low, GRID_STEPS)], 0.0
  return GRID[low], GRID[low + 1], weight


def is_on_grid(x: float) -> bool:
  steps = float(x) * GRID_STEPS
  return 0.0 <= float(x) <= 1.0 and abs(steps - round(steps)) < 1e-9


def parse_value(text: str) -> float | None:
  """The grid value a critic reply starts with, or None when there is none or it is off the grid.

  '0.7', ' .7 and more', '1.00', '0.7.' -> 0.7, 0.7, 1.0, 0.7; '0.25', 'Q value: 0.7', '' -> None.
  A number that runs on past the grid value is invalid: '1.5', '1.05', '0.55', '10' -> None.
  """
  if not isinstance(text, str):
    raise TypeError(f'parse_value expects a str, got {type(text).__name__}')
  match = VALUE_PATTERN.match(text)
  if match is None or _RUNS_ON.match(text, match.end()):
    return None
  value = float(match.group(1))
  if not is_on_grid(value):
    return None
  return round(value * GRID_STEPS) / GRID_STEPS


def format_value(value: float) -> str:
  """The text the critic is trained to emit for a grid value: '0', '0.1', ..., '0.9', '1'."""
  if not is_on_grid(value):
    raise ValueError(f'format_value: {value!r} is not on the grid {{0, 0.1, ..., 1}}')
  steps = round(float(value) * GRID_STEPS)
  if steps in (0, GRID_STEPS):
    return str(steps // GRID_STEPS)
  return f'0.{steps}'
