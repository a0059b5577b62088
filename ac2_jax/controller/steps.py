"""The data one AC2 step exchanges between the controller and the trainer.

`Controller.plan(step)` returns a `StepPlan` of `GenerationRequest`s. The trainer generates them,
scores every continuation (critic or judge) and reads the critic at each prefix that asks for it,
then hands back one `RequestResult` per request, in plan order, to
`Controller.observe(step, results)`, which returns a `StepOutcome`.

Advantages are not computed here: the trainer computes them in JAX (rl/) from the same endpoint
values (AC2: v_i - mean_j v_j with the invalid-value rules; group-size-1: v - V(s), dropping rows
whose V(s) is invalid). The controller needs the values only for critic targets and readiness.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Hashable

import numpy as np

from ac2_jax.controller.settings import ControllerSettings


class RequestKind(enum.StrEnum):
  REFILL = 'refill'            # fresh problem, one full rollout; enters the buffer (trained only
                               # under train_refills, against V(s0))
  COLD_START = 'cold_start'    # replay slot while the buffer is empty: fresh problem, empty prefix
  UNREADY = 'unready'          # replayed prefix of an unready problem: g full continuations
  READY_CHUNK = 'ready_chunk'  # replayed prefix of a ready problem: chunks of at most b new tokens
  AUDIT = 'audit'              # replayed prefix of a ready problem picked for audit: g full runs


class ValueSource(enum.StrEnum):
  CRITIC = 'critic'
  JUDGE = 'judge'


@dataclasses.dataclass(frozen=True, eq=False)
class GenerationRequest:
  """One prefix to continue.

  prefix_tokens_P is a read-only view of the stored trajectory's response tokens [0, cut); the
  trainer prepends the problem prompt. Refill and cold-start requests have an empty prefix.
  """

  kind: RequestKind
  problem_id: Hashable
  slot: int                  # replay slot (group-size-1 singles share their slot); -1 for refills
  source_trajectory_id: int  # trajectory the prefix was cut from; -1 for refills and cold starts
  prefix_tokens_P: np.ndarray
  cut: int                   # == len(prefix_tokens_P)
  num_continuations: int     # 1 for refills and group-size-1 singles, g otherwise
  max_new_tokens: int        # chunk b capped by the remaining budget, or the remaining budget
  remaining_budget: int      # response_budget - cut
  # True only for ready chunks: endpoints that hit max_new_tokens with budget left and no complete
  # answer go to the critic, everything else to the judge.
  critic_may_score: bool
  # The critic's V(s) here is needed (readiness error, group-1 baseline, a trained refill's
  # baseline); a refill that carries it is trained (train_refills).
  needs_prefix_value: bool
  # Ready slots (chunks and audits): the new tokens of the slot's chunk before the budget's cap (b,
  # or further with `chunk_through_uncredited`); an audit's chunk-end reads stop there. 0 otherwise.
  chunk_tokens: int = 0

  @property
  def empty_prefix(self) -> bool:
    """Rows of requests with an empty prefix feed the entropy controller's H."""
    return self.cut == 0

  @property
  def trained(self) -> bool:
    return self.kind != RequestKind.REFILL or self.needs_prefix_value


@dataclasses.dataclass(frozen=True, eq=False)
class StepPlan:
  step: int
  requests: tuple[GenerationRequest, ...]
  num_ready_slots: int       # replay slots whose problem was ready at planning time
  num_replay_slots: int      # n_batch (cold-start slots included)

  @property
  def prefix_value_requests(self) -> tuple[int, ...]:
    """Indices of the requests whose prefix the critic must score before the update."""
    return tuple(i for i, r in enumerate(self.requests) if r.needs_prefix_value)

  def count(self, kind: RequestKind) -> int:
    return sum(1 for r in self.requests if r.kind == kind)

  @property
  def num_continuations(self) -> int:
    return sum(r.num_continuations for r in self.requests)


@dataclasses.dataclass(frozen=True, eq=False)
class Continuation:
  """One scored continuation of a request.

  value: endpoint value v in [0, 1]; None when invalid (critic output unparseable or off grid, judge
    request failed or unparseable). A response with no answer block is value 0 from the judge side.
  points: judge points in [0, max_points]; None when not graded by the judge (critic endpoint,
    failed judge, or no answer block).
  tokens_N: the new tokens. Required for refills (they enter the replay buffer); optional otherwise.
  reference: what the bank and the critic prompt show as a reference solution (e.g. the solution's
    token ids); required when the continuation passes (points >= pass_points with a complete
    answer). Must be a numpy array or JSON data so the checkpoint can hold it.
  cut_end: refills only, the latest token position a replayed prefix of tokens_N may end at (the
    task's `replay_cut_end`, with `cut_before_uncredited`); None: the cut grid alone decides.
  chunk_end: refills only, the token position a ready chunk from a prefix of tokens_N should reach
    at least (the task's `replay_chunk_end`, with `chunk_through_uncredited`); None: chunk b.
  chunk_end_read / chunk_end_value: audits only, for the audit gate (audit_gate.py): the
    continuation ran past the slot's chunk, so the critic was read where the chunk would have
    ended, and that read (None: unparseable). Not read: the chunk would have been the whole
    continuation, and its value stands in.
  """

  value: float | None
  source: ValueSource
  points: float | None = None
  complete_answer: bool = False
  tokens_N: np.ndarray | None = None
  reference: Any = None
  cut_end: int | None = None
  chunk_end: int | None = None
  chunk_end_read: bool = False
  chunk_end_value: float | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class RequestResult:
  """Results of one request, in plan order. prefix_value: the critic's V(s) read before this step's
  update (None = unparseable); ignored for requests that do not need it."""

  continuations: tuple[Continuation, ...]
  prefix_value: float | None = None


@dataclasses.dataclass(frozen=True)
class StepStats:
  """Per-step statistics for the metrics log (NaN where undefined)."""

  ready_fraction: float          # ready replay slots / replay slots (at planning time)
  critic_error: float            # mean readiness error over this step's prefixes with a target
  critic_error_audited: float    # same, audited prefixes only
  global_window_error: float     # pooled mean over the readiness window (NaN until it has errors)
  global_ready: bool             # the global test holds after this step
  num_ready_problems: int
  num_newly_ready: int
  num_targets: int               # prefixes (or group-1 singles) that produced a target
  num_invalid_predictions: int   # prefixes with a target whose V(s) was unparseable (error 1)
  num_pairs_added: int
  num_dropped_rows: int          # group-size-1 singles dropped for an invalid V(s)
  num_bank_added: int
  bank_size: int
  buffer_size: int
  critic_buffer_size: int
  num_refills: int
  num_cold_start: int
  num_unready: int
  num_ready_chunk: int
  num_audit: int
  num_revoked: int = 0           # ready problems whose audit took readiness back (revocable only)
  # The audit gate (audit_gate.py) after this step: the window's correlation of critic with Monte
  # Carlo chunk advantages (NaN: no audit rows or a constant side, gate or not), and whether the
  # next plan critic-scores ready chunks (always 1 without the gate).
  critic_audit_corr: float = float('nan')
  critic_trusted: bool = True
  # The factor on this step's ready chunks' critic advantages (audit_scale; 1 without it).
  chunk_advantage_scale: float = 1.0

  def as_dict(self) -> dict[str, float]:
    return {k: float(v) for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass(frozen=True, eq=False)
class StepOutcome:
  """What observe() learned. targets_R / errors_R are per request (NaN where none)."""

  step: int
  targets_R: np.ndarray
  errors_R: np.ndarray
  newly_ready: tuple[Hashable, ...]
  stats: StepStats


def passes(c: Continuation, settings: ControllerSettings) -> bool:
  """A passing rollout: >= pass_points judge points with a complete answer (bank, correct-only)."""
  return c.points is not None and c.points >= settings.pass_points and c.complete_answer


_NUMBER = (int, float, np.integer, np.floating)
_SOURCES = frozenset(ValueSource)


def _is_unit_number(v: Any) -> bool:
  return isinstance(v, _NUMBER) and 0.0 <= v <= 1.0


def check_result(i: int, request: GenerationRequest, result: RequestResult,
                 settings: ControllerSettings) -> None:
  """Raises a clear error when result i does not fit its request."""
  where = f'result {i} ({request.kind.value}, problem {request.problem_id!r})'
  if not isinstance(result, RequestResult):
    raise TypeError(f'{where}: expected a RequestResult, got {type(result).__name__}')
  if len(result.continuations) != request.num_continuations:
    raise ValueError(f'{where}: {len(result.continuations)} continuations, the request asked for '
                     f'{request.num_continuations}')
  if request.needs_prefix_value and result.prefix_value is not None:
    if not _is_unit_number(result.prefix_value):
      raise ValueError(f'{where}: prefix_value must be None (unparseable) or in [0, 1], '
                       f'got {result.prefix_value!r}')
  critic_ok = request.critic_may_score
  refill = request.kind == RequestKind.REFILL
  for j, c in enumerate(result.continuations):
    # One cheap test per field; the message is only built on failure.
    if not isinstance(c, Continuation):
      raise TypeError(f'{where}, continuation {j}: expected a Continuation, '
                      f'got {type(c).__name__}')
    bad = None
    if c.source not in _SOURCES:
      bad = f"source must be 'critic' or 'judge', got {c.source!r}"
    elif c.value is not None and not _is_unit_number(c.value):
      bad = f'value must be None (invalid) or in [0, 1], got {c.value!r}'
    elif c.source == ValueSource.CRITIC and not critic_ok:
      bad = f'scored by the critic, but {request.kind.value} requests are judged'
    elif c.points is not None:
      if c.source == ValueSource.CRITIC:
        bad = f'a critic-scored continuation carries judge points ({c.points})'
      elif not (isinstance(c.points, _NUMBER) and 0 <= c.points <= settings.max_points):
        # A judge gives integers; the built-in task's local scoring gives fractions.
        bad = f'points must be None or a number in [0, {settings.max_points}], got {c.points!r}'
      elif c.reference is None and passes(c, settings):
        bad = f'passed ({c.points} points with a complete answer) but carries no reference solution'
    if bad is None and refill and c.tokens_N is None:
      bad = 'refill continuations must carry their response tokens (tokens_N)'
    for name in ('cut_end', 'chunk_end'):
      end = getattr(c, name)
      if bad is None and end is not None:
        if not refill:
          bad = f'only refills carry a {name} (got {end!r}): other continuations are not stored'
        elif not (isinstance(end, (int, np.integer)) and end >= 0):
          bad = f'{name} must be None or an integer >= 0, got {end!r}'
    if bad is None and (c.chunk_end_read or c.chunk_end_value is not None):
      if request.kind != RequestKind.AUDIT:
        bad = 'only audits carry chunk-end reads: other slots are scored as they ran'
      elif not c.chunk_end_read:
        bad = f'a chunk_end_value ({c.chunk_end_value!r}) without chunk_end_read'
      elif c.chunk_end_value is not None and not _is_unit_number(c.chunk_end_value):
        bad = f'chunk_end_value must be None (invalid) or in [0, 1], got {c.chunk_end_value!r}'
    if bad is not None:
      raise ValueError(f'{where}, continuation {j}: {bad}')
