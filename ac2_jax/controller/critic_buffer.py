"""The critic's FIFO of prefix-target pairs and the records of one critic update (AC2 item 9).

A pair points at the trajectory its prefix was cut from (None for an empty cold-start prefix), so
the prefix tokens are a view, not a copy. Each update samples up to N pairs without replacement
(this step's new pairs included), skips pairs whose context does not fit, and expands a pair with a
reference into two records (with and without the reference, weight 1/2 each), a pair without one
into one record (weight 1).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Hashable

import numpy as np

from ac2_jax.controller.replay import Trajectory

_EMPTY_PREFIX = np.zeros((0,), np.int32)
_EMPTY_PREFIX.flags.writeable = False


@dataclasses.dataclass(frozen=True, eq=False)
class CriticPair:
  problem: int
  source: Trajectory | None   # None: an empty prefix with no stored trajectory (cold start)
  cut: int
  target: float
  step: int

  @property
  def prefix_tokens_P(self) -> np.ndarray:
    if self.source is None:
      return _EMPTY_PREFIX
    return self.source.tokens_L[:self.cut]


@dataclasses.dataclass(frozen=True, eq=False)
class CriticRecord:
  """One critic training example: prompt(problem, prefix[, reference]) -> target value tokens."""

  prefix_tokens_P: np.ndarray
  problem_id: Hashable
  target: float
  reference: Any              # None: the plain prompt
  weight: float               # 1 for a lone plain record, 1/2 for each of a with/without pair
  source_trajectory_id: int   # -1 for an empty cold-start prefix


@dataclasses.dataclass(frozen=True, eq=False)
class CriticBatch:
  records: tuple[CriticRecord, ...]
  num_pairs: int              # pairs used
  num_skipped: int            # pairs drawn but skipped for the context limit


# A record fits when the callable says so; an int bounds len(prefix) + len(reference or ()).
ContextLimit = int | Callable[[CriticRecord], bool] | None


def _fits(record: CriticRecord, limit: ContextLimit) -> bool:
  if limit is None:
    return True
  if callable(limit):
    return bool(limit(record))
  reference_length = 0 if record.reference is None else len(record.reference)
  return record.prefix_tokens_P.shape[0] + reference_length <= limit


class CriticBuffer:
  """FIFO of CriticPairs with a fixed capacity."""

  def __init__(self, capacity: int):
    if capacity < 1:
      raise ValueError(f'critic buffer capacity must be >= 1, got {capacity}')
    self.capacity = capacity
    self._pairs: collections.deque[CriticPair] = collections.deque()

  def __len__(self) -> int:
    return len(self._pairs)

  @property
  def pairs(self) -> tuple[CriticPair, ...]:
    """Oldest first."""
    return tuple(self._pairs)

  def add(self, pair: CriticPair) -> None:
    self._pairs.append(pair)
    while len(self._pairs) > self.capacity:
      self._pairs.popleft()

  def sample(self, rng: np.random.Generator, max_pairs: int,
             reference_for: Callable[[CriticPair], Any],
             problem_id_for: Callable[[int], Hashable],
             context_limit: ContextLimit = None) -> CriticBatch:
    """Walks a random permutation of the buffer until `max_pairs` pairs fit (or the buffer ends)."""
    pairs = self.pairs
    records: list[CriticRecord] = []
    used = skipped = 0
    for index in rng.permutation(len(pairs)):
      if used == max_pairs:
        break
      pair = pairs[int(index)]
      reference = reference_for(pair)
      problem_id = problem_id_for(pair.problem)
      prefix_tokens_P = pair.prefix_tokens_P
      source = -1 if pair.source is None else pair.source.trajectory_id
      if reference is None:
        candidates = [CriticRecord(prefix_tokens_P, problem_id, pair.target, None, 1.0, source)]
      else:
        candidates = [
            CriticRecord(prefix_tokens_P, problem_id, pair.target, reference, 0.5, source),
            CriticRecord(prefix_tokens_P, problem_id, pair.target, None, 0.5, source)]
      if all(_fits(r, context_limit) for r in candidates):
        records.extend(candidates)
        used += 1
      else:
        skipped += 1
    return CriticBatch(tuple(records), used, skipped)
