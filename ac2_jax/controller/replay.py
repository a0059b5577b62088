"""The replay buffer B: a FIFO of complete rollouts (refills), correct or not.

Trajectories are immutable and token-level. The critic buffer keeps references to the trajectories
its pairs were cut from, so a trajectory's tokens live as long as either buffer needs them.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Iterable

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class Trajectory:
  """A stored full response. `problem` indexes the controller's problem list."""

  trajectory_id: int
  problem: int
  tokens_L: np.ndarray          # int32, read-only
  points: float | None          # judge points, None when not graded
  passed: bool                  # points >= pass_points with a complete answer
  reference: Any                # the solution shown to the critic when passed, else None
  step: int                     # step whose refill produced it
  cut_end: int | None = None    # the latest cut a replay may take (Continuation.cut_end)
  chunk_end: int | None = None  # where a ready chunk should reach (Continuation.chunk_end)

  @property
  def length(self) -> int:
    return int(self.tokens_L.shape[0])


def freeze_tokens(tokens: Any) -> np.ndarray:
  """An owned, read-only int32 copy (views handed out as prefixes can then never change)."""
  tokens_L = np.array(tokens, dtype=np.int32, copy=True)
  if tokens_L.ndim != 1:
    raise ValueError(f'response tokens must be one-dimensional, got shape {tokens_L.shape}')
  tokens_L.flags.writeable = False
  return tokens_L


class ReplayBuffer:
  """FIFO of trajectories with a fixed capacity; the oldest leaves first."""

  def __init__(self, capacity: int):
    if capacity < 1:
      raise ValueError(f'replay buffer capacity must be >= 1, got {capacity}')
    self.capacity = capacity
    self._items: collections.deque[Trajectory] = collections.deque()

  def __len__(self) -> int:
    return len(self._items)

  @property
  def trajectories(self) -> tuple[Trajectory, ...]:
    """Oldest first."""
    return tuple(self._items)

  def add(self, trajectory: Trajectory) -> None:
    self._items.append(trajectory)
    while len(self._items) > self.capacity:
      self._items.popleft()

  def replace_all(self, trajectories: Iterable[Trajectory]) -> None:
    """The stale-buffer variant: a new collection becomes the whole buffer."""
    self._items.clear()
    for trajectory in trajectories:
      self.add(trajectory)

  def by_problem(self) -> dict[int, list[Trajectory]]:
    """Problem index -> its stored trajectories, oldest first; keys in ascending order."""
    groups: dict[int, list[Trajectory]] = {}
    for trajectory in self._items:
      groups.setdefault(trajectory.problem, []).append(trajectory)
    return dict(sorted(groups.items()))
