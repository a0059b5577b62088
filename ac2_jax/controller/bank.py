"""The reference bank: one solution per problem, added once and never replaced (AC2 item 7)."""

from __future__ import annotations

from typing import Any

import numpy as np


class ReferenceBank:
  """Problem index -> reference solution."""

  def __init__(self, num_problems: int):
    self._num_problems = num_problems
    self._references: dict[int, Any] = {}

  def __len__(self) -> int:
    return len(self._references)

  def __contains__(self, problem: int) -> bool:
    return problem in self._references

  def get(self, problem: int) -> Any:
    """The problem's reference, or None."""
    return self._references.get(problem)

  def mask(self) -> np.ndarray:
    """Boolean [P]: which problems hold a reference."""
    has_P = np.zeros((self._num_problems,), bool)
    has_P[list(self._references)] = True
    return has_P

  def add_candidates(self, rng: np.random.Generator,
                     candidates: list[tuple[int, Any]]) -> list[int]:
    """Adds, for each problem without a reference, one of this step's candidates chosen uniformly.

    Returns the problems that gained a reference (ascending).
    """
    by_problem: dict[int, list[Any]] = {}
    for problem, reference in candidates:
      by_problem.setdefault(problem, []).append(reference)
    added = []
    for problem in sorted(by_problem):
      if problem in self._references:
        continue
      options = by_problem[problem]
      self._references[problem] = options[int(rng.integers(len(options)))]
      added.append(problem)
    return added

  def items(self) -> list[tuple[int, Any]]:
    return sorted(self._references.items())

  def load_items(self, items: list[tuple[int, Any]]) -> None:
    self._references = {}
    for problem, reference in items:
      if not 0 <= problem < self._num_problems:
        raise ValueError(f'bank problem index {problem} out of range [0, {self._num_problems})')
      self._references[int(problem)] = reference
