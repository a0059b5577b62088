"""The critic's FIFO of prefix-target pairs and the records of one critic update (AC2 item 9).

A pair points at the trajectory its prefix was cut from (None for an empty cold-start prefix), so
the prefix tokens are a view, not a copy. Each update samples up to N pairs without replacement
(this step's new pairs included), skips pairs whose context does not fit, and expands a pair with a
reference into two records (with and without the reference, weight 1/2 each; without its plain twin,
`plain_twin=False`, the one with the reference at weight 1), a pair without one into one record
(weight 1). With `chunk_end_pairs` > 0 a step's judged chunk ends are drawn the same
way into records of their own (`chunk_end_records`), used by that step's update alone.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Hashable

import numpy as np

from ac2_jax.controller.replay import Trajectory
from ac2_jax.controller.targets import group_target

_EMPTY_PREFIX = np.zeros((0,), np.int32)
_EMPTY_PREFIX.flags.writeable = False


@dataclasses.dataclass(frozen=True, eq=False)
class CriticPair:
  problem: int
  source: Trajectory | None   # None: an empty prefix with no stored trajectory (cold start)
  cut: int
  target: float
  step: int
  value: float | None = None  # the unrounded group mean (two-hot targets spread it); None: target

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
  value: float | None = None  # the unrounded target (two-hot targets spread it); None: target


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


def records_of(prefix_tokens_P: np.ndarray, problem_id: Hashable, target: float, reference: Any,
               source: int, value: float | None = None, plain_twin: bool = True
               ) -> list[CriticRecord]:
  """A prefix-target example's records: with and without its reference at weight 1/2 each (AC2
  item 9), the one with it alone at weight 1 (`plain_twin` False), or the plain prompt alone at
  weight 1."""
  if reference is None or not plain_twin:
    return [CriticRecord(prefix_tokens_P, problem_id, target, reference, 1.0, source, value)]
  return [CriticRecord(prefix_tokens_P, problem_id, target, reference, 0.5, source, value),
          CriticRecord(prefix_tokens_P, problem_id, target, None, 0.5, source, value)]


@dataclasses.dataclass(frozen=True)
class ChunkEnd:
  """A judged continuation that ran past the chunk: its state s . c[:b] (tokens after the prompt)
  and its own reward, one Monte Carlo sample of V there (`chunk_end_pairs`)."""
  problem: int
  prefix_tokens_P: np.ndarray
  reward: float


def chunk_end_records(rng: np.random.Generator, chunk_ends: list[ChunkEnd], max_pairs: int,
                      reference_for: Callable[[int], Any],
                      problem_id_for: Callable[[int], Hashable],
                      context_limit: ContextLimit = None, plain_twin: bool = True) -> CriticBatch:
  """Up to `max_pairs` of the step's chunk ends, drawn without replacement, as critic records with
  the grid-rounded reward as the target (those whose context does not fit are skipped)."""
  return _draw(rng, chunk_ends, max_pairs, lambda end: records_of(
      end.prefix_tokens_P, problem_id_for(end.problem), group_target([end.reward], 1),
      reference_for(end.problem), -1, end.reward, plain_twin), context_limit)


def _draw(rng: np.random.Generator, items, max_pairs: int,
          records_for: Callable[[Any], list[CriticRecord]], limit: ContextLimit) -> CriticBatch:
  """Walks a random permutation of `items` until `max_pairs` of them fit (or the items end)."""
  records: list[CriticRecord] = []
  used = skipped = 0
  for index in rng.permutation(len(items)):
    if used == max_pairs:
      break
    candidates = records_for(items[int(index)])
    if all(_fits(r, limit) for r in candidates):
      records.extend(candidates)
      used += 1
    else:
      skipped += 1
  return CriticBatch(tuple(records), used, skipped)


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
             context_limit: ContextLimit = None, plain_twin: bool = True) -> CriticBatch:
    """Walks a random permutation of the buffer until `max_pairs` pairs fit (or the buffer ends)."""

    def records_for(pair: CriticPair) -> list[CriticRecord]:
      source = -1 if pair.source is None else pair.source.trajectory_id
      return records_of(pair.prefix_tokens_P, problem_id_for(pair.problem), pair.target,
                        reference_for(pair), source, pair.value, plain_twin)

    return _draw(rng, self.pairs, max_pairs, records_for, context_limit)
