"""Grades on the 0..7 olympiad scale and reading the points out of a judge's text.

A `Grade` is either valid (points 0..7: integers from a judge, fractions from the built-in task's
local scoring) or invalid (points None, with a status saying why).
The training loop treats an invalid grade as reward 0 for the actor and leaves it out of critic
targets (ALGORITHMS.md, AC2 item 4), so nothing here ever raises on bad judge output.
"""

from __future__ import annotations

import dataclasses
import re

MAX_POINTS = 7

# Why a grade has the points it has. 'ok' and 'no_answer' are valid; the rest are invalid.
STATUS_OK = 'ok'
STATUS_NO_ANSWER = 'no_answer'          # the response had no answer block: 0 points, no judge call
STATUS_UNPARSEABLE = 'unparseable'      # the judge answered, but no points could be read
STATUS_OUT_OF_RANGE = 'out_of_range'    # the judge gave points outside 0..7 (or not an integer)
STATUS_HTTP_ERROR = 'http_error'        # the server kept failing (5xx, 429) or refused (4xx)
STATUS_BAD_RESPONSE = 'bad_response'    # the body was not an OpenAI-style chat completion
STATUS_TIMEOUT = 'timeout'
STATUS_CONNECTION_ERROR = 'connection_error'
STATUS_INTERNAL_ERROR = 'internal_error'  # anything unforeseen inside the judge client
VALID_STATUSES = (STATUS_OK, STATUS_NO_ANSWER)


@dataclasses.dataclass(frozen=True)
class Grade:
  """The judge's verdict on one response."""

  points: float | None  # 0..MAX_POINTS when valid, None when invalid
  status: str = STATUS_OK
  # Short human-readable reason for an invalid grade (never holds credentials).
  detail: str = ''
  # The judge's reply text when there was one (for logs and audits).
  judge_output: str = ''
  attempts: int = 0  # HTTP requests made for this grade

  def __post_init__(self):
    if self.points is None:
      if self.status in VALID_STATUSES:
        raise ValueError(f'a grade with status {self.status!r} needs points')
    elif not 0 <= self.points <= MAX_POINTS:
      raise ValueError(f'points {self.points} outside 0..{MAX_POINTS}')
    elif self.status not in VALID_STATUSES:
      raise ValueError(f'a grade with status {self.status!r} cannot carry points')

  @property
  def valid(self) -> bool:
    return self.points is not None

  @property
  def reward(self) -> float:
    """Points / 7 in [0, 1]; an invalid grade counts as 0 (the actor-loss rule)."""
    return 0.0 if self.points is None else self.points / MAX_POINTS


def no_answer_grade() -> Grade:
  return Grade(points=0, status=STATUS_NO_ANSWER, detail='response has no answer block')


def invalid_grade(status: str, detail: str, judge_output: str = '', attempts: int = 0) -> Grade:
  return Grade(points=None, status=status, detail=detail, judge_output=judge_output,
               attempts=attempts)


_NUMBER = r'([-+]?\d+(?:\.\d+)?)'
# In priority order: the first form that occurs anywhere decides; within a form the LAST
# occurrence wins, because judges restate the scale early and give their verdict at the end.
_POINTS_PATTERNS = (
    re.compile(r'<points>\s*' + _NUMBER + r'\s*out\s+of\s+7\s*</points>', re.IGNORECASE),
    re.compile(r'<points>\s*' + _NUMBER + r'\s*</points>', re.IGNORECASE),
    re.compile(r'(?<![\w.])' + _NUMBER + r'\s*out\s+of\s+7(?!\d|\.\d)', re.IGNORECASE),
)


def parse_points(text: str) -> tuple[int | None, str]:
  """Reads the awarded points from a judge's reply.

  Forms, in priority order: `<points>N out of 7</points>`, `<points>N</points>`, `N out of 7`.
  Returns (points, status): (N, 'ok') for an integer N in 0..7; (None, 'out_of_range') when the
  deciding form holds a number outside 0..7 or a non-integer; (None, 'unparseable') when no form
  occurs.
  """
  if not isinstance(text, str):
    return None, STATUS_UNPARSEABLE
  for pattern in _POINTS_PATTERNS:
    matches = pattern.findall(text)
    if not matches:
      continue
    raw = matches[-1]
    value = float(raw)
    if value != int(value) or not 0 <= value <= MAX_POINTS:
      return None, STATUS_OUT_OF_RANGE
    return int(value), STATUS_OK
  return None, STATUS_UNPARSEABLE


def grade_from_judge_output(text: str, attempts: int = 0) -> Grade:
  """A `Grade` from the judge's reply text (invalid when no points can be read)."""
  points, status = parse_points(text)
  if points is None:
    detail = ('judge reply holds no points in a known form' if status == STATUS_UNPARSEABLE
              else 'judge reply gives points outside 0..7')
    return invalid_grade(status, detail, judge_output=text, attempts=attempts)
  return Grade(points=points, status=STATUS_OK, judge_output=text, attempts=attempts)
