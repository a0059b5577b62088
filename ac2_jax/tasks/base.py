"""The Task protocol: what the trainer needs of a problem set, and the answer-block rule.

A task hands out problem records per split, renders a record's prompt with a tokenizer, decides
whether a response holds a complete answer (the routing rule of AC2 item 3: an answer block after
the thinking section), cuts out the text a passing response contributes as a reference solution,
writes the critic instruction, and scores responses to points 0..7 (or an invalid grade).

Scoring never raises: a failure of any kind becomes an invalid `Grade` (ac2_jax/judges/grading.py),
which the trainer treats as reward 0 for the actor and leaves out of critic targets.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

from ac2_jax import tokenization

if TYPE_CHECKING:
  from ac2_jax.judges.grading import Grade

SPLITS = ('train', 'validation')


def check_split(split: str) -> str:
  if split not in SPLITS:
    raise ValueError(f'unknown split {split!r}; expected one of {SPLITS}')
  return split


@dataclasses.dataclass(frozen=True)
class ProblemRecord:
  """One problem, as every task and judge sees it."""

  id: str  # unique within the task, stable across builds
  split: str  # 'train' | 'validation'
  prompt: str  # the user turn's text
  # A correct solution in the form the task's answer takes (the proof task: a proof; the built-in
  # task: the worked steps and the answer block). Empty when the data set has none.
  reference_solution: str = ''
  # Grading guidelines or rubric for the judge (the proof validation set); empty when none.
  guidelines: str = ''

  def __post_init__(self):
    if not self.id:
      raise ValueError('ProblemRecord.id must be non-empty')
    check_split(self.split)
    if not self.prompt:
      raise ValueError(f'ProblemRecord {self.id!r} has an empty prompt')


@runtime_checkable
class Task(Protocol):
  """A problem set with its answer format, critic instruction and scoring."""

  @property
  def name(self) -> str: ...

  def records(self, split: str) -> Sequence[ProblemRecord]:
    """All problems of a split ('train' or 'validation'); the two splits share no problem."""
    ...

  def prompt_ids(self, tok: tokenization.Tokenizer, record: ProblemRecord) -> list[int]:
    """The prompt as token ids: the user turn, then the assistant header opening `<think>`."""
    ...

  def has_complete_answer(self, response_text: str) -> bool:
    """Whether the response holds a complete answer block after its thinking section."""
    ...

  def reference_from_response(self, response_text: str) -> str | None:
    """What a passing response contributes to the reference bank (None: no complete answer)."""
    ...

  @property
  def critic_sees_response(self) -> bool:
    """Whether `critic_instruction` reads the response it values (then callers pass its text)."""
    ...

  def critic_instruction(self, reference: str | None, response: str = '') -> str:
    """The critic's user-turn instruction; with `reference`, the variant that shows it. A task
    whose `critic_sees_response` lays the reference out against `response`, the partial response
    being valued."""
    ...

  def score_batch(self, records: Sequence[ProblemRecord], responses: Sequence[str]
                  ) -> list['Grade']:
    """One grade per (record, response) pair, in order; never raises.

    A response without a complete answer scores 0 points (valid) without calling any judge.
    """
    ...


def render_prompt(tok: tokenization.Tokenizer, prompt: str) -> list[int]:
  """The standard prompt: one user turn, then the assistant header and an open `<think>`."""
  return tokenization.render_chat(tok, [tokenization.Turn('user', prompt)],
                                  generation_prompt=True, open_thinking=True)


def after_thinking(response_text: str) -> str | None:
  """The text after the first `</think>`; None while the thinking section is still open.

  Responses start inside the thinking section (the prompt opened `<think>`), so only the closing
  tag marks where the answer part begins.
  """
  _, sep, rest = response_text.partition(tokenization.THINK_CLOSE)
  return rest if sep else None


def answer_block(response_text: str, open_tag: str, close_tag: str) -> str | None:
  """The inside of the first complete `open_tag ... close_tag` block after the thinking section.

  None when the thinking section never closes, or no block after it is closed.
  """
  rest = after_thinking(response_text)
  if rest is None:
    return None
  start = rest.find(open_tag)
  if start < 0:
    return None
  start += len(open_tag)
  end = rest.find(close_tag, start)
  if end < 0:
    return None
  return rest[start:end]


def unit_hash(text: str) -> float:
  """A number in [0, 1) fixed by `text` alone (the same on every seed, machine and process)."""
  return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 2 ** 32
