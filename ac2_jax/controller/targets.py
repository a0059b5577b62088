"""Critic targets: group means rounded onto the critic's value grid (critic/values.py)."""

from __future__ import annotations

import math
from typing import Sequence

from ac2_jax.critic.values import round_to_grid


def group_target(values: Sequence[float | None], min_valid: int) -> float | None:
  """Grid-rounded mean of the valid values; None with fewer than `min_valid` (or no) valid ones."""
  valid = [v for v in values if v is not None]
  if not valid or len(valid) < min_valid:
    return None
  return round_to_grid(math.fsum(valid) / len(valid))
