"""Critic targets: group means rounded onto the critic's value grid (critic/values.py)."""

from __future__ import annotations

import math
from typing import Sequence

from ac2_jax.critic.values import round_to_grid


def group_mean(values: Sequence[float | None], min_valid: int) -> float | None:
  """Mean of the valid values; None with fewer than `min_valid` (or no) valid ones."""
  valid = [v for v in values if v is not None]
  if not valid or len(valid) < min_valid:
    return None
  return math.fsum(valid) / len(valid)


def group_target(values: Sequence[float | None], min_valid: int) -> float | None:
  """Grid-rounded `group_mean`: the critic's target and what readiness measures against."""
  mean = group_mean(values, min_valid)
  return None if mean is None else round_to_grid(mean)
