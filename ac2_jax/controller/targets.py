"""Critic targets: group means rounded onto the value grid {0, 1/n, ..., 1} (ties round down)."""

from __future__ import annotations

import math
from typing import Sequence


def round_to_grid(value: float, grid_points: int) -> float:
  """Nearest grid value to `value`; an exact tie (up to float error) goes to the lower value."""
  if not math.isfinite(value):
    raise ValueError(f'cannot round a non-finite value ({value}) onto the value grid')
  scaled = value * grid_points
  # The 1e-9 turns float noise around a .5 tie (0.25 * 10 = 2.5000000000000004) into a tie.
  index = math.ceil(scaled - 0.5 - 1e-9)
  index = min(max(index, 0), grid_points)
  return round(index / grid_points, 12)


def group_target(values: Sequence[float | None], min_valid: int, grid_points: int) -> float | None:
  """Grid-rounded mean of the valid values; None with fewer than `min_valid` (or no) valid ones."""
  valid = [v for v in values if v is not None]
  if not valid or len(valid) < min_valid:
    return None
  return round_to_grid(math.fsum(valid) / len(valid), grid_points)
