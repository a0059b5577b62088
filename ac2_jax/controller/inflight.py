"""In-flight rollouts: what a rollout worker generates next, and what the trainer may take.

Host bookkeeping, no JAX (the worker thread that calls the sampler is algorithms/inflight.py).
Rollouts come in groups (`group_size` responses to one problem). Generation runs in segments of at
most `segment_tokens` new tokens: a segment continues every unfinished rollout from its prefix
(prompt + tokens so far) under the weights published at that moment, and every token records the
policy version that sampled it and its log-probability then. A weight update therefore lands
between segments: an unfinished rollout pauses at its prefix and resumes under the new weights.

The pipeline keeps at most `capacity` rows in flight or finished-not-taken (one batch ahead of
the trainer). `take(rows, version)` first drops (and counts) every group with a token more than
`max_policy_lag` versions behind `version`, finished or not: versions only grow, so such a group
could never be trained, and it would hold room the worker needs. Then it hands over finished
groups, oldest first, never past an unfinished one. `reset(group_size)` drops every group in
flight or waiting (Li2SAO's switch: leftovers of the old group size). A segment that comes back
for a group dropped while it ran is counted as dropped tokens. Nothing here is checkpointed: a run
saves with the pipeline drained (dropped), and a resumed run starts it empty.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class InflightSettings:
  max_policy_lag: int = 1      # k: samples with a token more than k versions old are dropped
  segment_tokens: int = 16     # new tokens per generation call (the in-flight update granularity)
  response_budget: int = 80

  def __post_init__(self):
    if self.max_policy_lag < 0:
      raise ValueError(f'max_policy_lag must be >= 0, got {self.max_policy_lag}')
    for name in ('segment_tokens', 'response_budget'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')


@dataclasses.dataclass
class Rollout:
  problem_index: int
  group: int                   # id of its group (increasing in request order)
  prompt_P: np.ndarray
  budget: int                  # response tokens at most
  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  entropies: list[float] = dataclasses.field(default_factory=list)
  versions: list[int] = dataclasses.field(default_factory=list)  # policy version per token
  stop_reason: str | None = None  # None while unfinished

  @property
  def context_P(self) -> np.ndarray:
    """Prompt and the tokens so far: where the next segment continues."""
    return np.concatenate([self.prompt_P, np.asarray(self.tokens, np.int32)]).astype(np.int32)

  @property
  def remaining(self) -> int:
    return 0 if self.stop_reason is not None else self.budget - len(self.tokens)


@dataclasses.dataclass
class Segment:
  """One generation call's output for one rollout."""
  tokens: Sequence[int]
  logprobs: Sequence[float]
  entropies: Sequence[float]
  stop_reason: str             # sampling.STOP_EOS / STOP_CHUNK_CAP / STOP_BUDGET


@dataclasses.dataclass
class Taken:
  """What `take` hands the trainer: finished groups, and what was dropped since the last take."""
  groups: list[list[Rollout]]
  dropped_samples: int
  dropped_tokens: int


CONTINUE = 'chunk_cap'  # sampling.STOP_CHUNK_CAP: the segment's cap, with budget left


class InflightPipeline:

  def __init__(self, settings: InflightSettings, prompts: Sequence[np.ndarray],
               draw_problem: Callable[[], int], group_size: int, capacity: int):
    if capacity < group_size:
      raise ValueError(f'capacity {capacity} holds no group of {group_size}')
    self.settings = settings
    self.prompts = prompts
    self.draw_problem = draw_problem
    self.group_size = group_size
    self.capacity = capacity
    self._next_group = 0
    self._groups: collections.OrderedDict[int, list[Rollout]] = collections.OrderedDict()
    self.dropped_samples = 0   # since the last take
    self.dropped_tokens = 0

  def rows_held(self) -> int:
    return sum(len(g) for g in self._groups.values())

  def _add_group(self) -> None:
    problem = int(self.draw_problem())
    gid = self._next_group
    self._next_group += 1
    self._groups[gid] = [Rollout(problem, gid, np.asarray(self.prompts[problem], np.int32),
                                 self.settings.response_budget)
                         for _ in range(self.group_size)]

  def requests(self) -> list[Rollout]:
    """The unfinished rollouts to continue, after topping up to `capacity` rows."""
    while self.rows_held() + self.group_size <= self.capacity:
      self._add_group()
    return [r for g in self._groups.values() for r in g if r.stop_reason is None]

  def accept(self, rollouts: Sequence[Rollout], segments: Sequence[Segment],
             version: int) -> None:
    """Appends each rollout's segment, sampled by policy `version`. The segment of a rollout whose
    group was dropped while it ran is counted as dropped tokens."""
    for r, s in zip(rollouts, segments):
      n = len(s.tokens)
      if r.group not in self._groups:
        self.dropped_tokens += n
        continue
      r.tokens.extend(int(t) for t in s.tokens)
      r.logprobs.extend(float(x) for x in s.logprobs)
      r.entropies.extend(float(x) for x in s.entropies)
      r.versions.extend([version] * n)
      if s.stop_reason != CONTINUE or len(r.tokens) >= r.budget:
        r.stop_reason = s.stop_reason

  def _finished(self, group: list[Rollout]) -> bool:
    return all(r.stop_reason is not None for r in group)

  def lag(self, group: list[Rollout], version: int) -> int:
    """Policy lag of a group at trainer version `version`: that of its oldest token (0 before
    its first token)."""
    versions = [v for r in group for v in r.versions]
    return version - min(versions) if versions else 0

  def take(self, rows: int, version: int) -> Taken | None:
    """Finished groups of `rows` rows in all (oldest first) for the trainer at policy `version`,
    after dropping the over-lag groups; None (nothing taken) while not enough are finished."""
    for gid, group in list(self._groups.items()):
      if self.lag(group, version) > self.settings.max_policy_lag:
        self._drop(self._groups.pop(gid))
    chosen, count = [], 0
    for gid, group in self._groups.items():
      if count >= rows or not self._finished(group):
        break  # in request order: a batch never skips an unfinished group
      chosen.append(gid)
      count += len(group)
    if count < rows:
      return None
    if count > rows:
      raise ValueError(f'groups of {self.group_size} do not make a batch of {rows} rows')
    return Taken([self._groups.pop(gid) for gid in chosen], *self.pop_dropped())

  def pop_dropped(self) -> tuple[int, int]:
    """(samples, tokens) dropped since the last call, and the counts back to 0."""
    out = (self.dropped_samples, self.dropped_tokens)
    self.dropped_samples = self.dropped_tokens = 0
    return out

  def _drop(self, group: list[Rollout]) -> None:
    self.dropped_samples += len(group)
    self.dropped_tokens += sum(len(r.tokens) for r in group)

  def reset(self, group_size: int) -> None:
    """Drops every group in flight or waiting; new groups have `group_size` rollouts."""
    for group in self._groups.values():
      self._drop(group)
    self._groups.clear()
    self.group_size = group_size
