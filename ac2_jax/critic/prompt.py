"""The critic prompt at token level: the policy itself, asked for the value of a partial response.

Context (AC2 paper, Appendix C): problem prompt ids + partial response ids + a closing `</think>`
when the response has none + `<|im_end|>\\n` + a user turn with the instruction + an assistant turn
prefilled with an empty thinking section and "Q value: ". The critic then greedily emits a grid
value and `<|im_end|>`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from ac2_jax import tokenization
from ac2_jax.critic import values

REFERENCE_SLOT = '{reference}'
ANSWER_STEM = 'Q value: '

_ASK = ('Pause here and estimate how much rubric credit this attempt will earn if you continue it '
        'to completion within its remaining token budget: 0 means no credit, 1 means full credit '
        'for a complete and correct proof, and values in between mean partial credit.')
_ANSWER_FORMAT = ("Don't think; answer immediately with a single line and nothing else:\n"
                  'Q value: z\n'
                  'where z is one of 0, 0.1, ..., 1. The first characters of your response must be '
                  '`Q value:`.')

# The proof task's instructions: the AC2 paper's words (Appendix C, "Critic prompt"); the line
# breaks are ours, since the paper's layout does not survive in its text.
PROOF_INSTRUCTION = _ASK + '\n\n' + _ANSWER_FORMAT
PROOF_INSTRUCTION_WITH_REFERENCE = (
    _ASK + '\n\nYou should refer to a reference correct proof here:\n' + REFERENCE_SLOT + '\n\n' +
    _ANSWER_FORMAT)


@dataclasses.dataclass(frozen=True)
class CriticInstructions:
  """The user-turn text of the critic prompt; a task may supply its own."""

  plain: str = PROOF_INSTRUCTION
  # Must contain '{reference}' exactly once; the reference solution's text replaces it.
  with_reference: str = PROOF_INSTRUCTION_WITH_REFERENCE

  def __post_init__(self):
    if self.with_reference.count(REFERENCE_SLOT) != 1:
      raise ValueError(
          f'CriticInstructions.with_reference must contain {REFERENCE_SLOT!r} exactly once')
    if REFERENCE_SLOT in self.plain:
      raise ValueError(f'CriticInstructions.plain must not contain {REFERENCE_SLOT!r}')

  def render(self, reference: str | None) -> str:
    # str.replace rather than str.format: instructions and proofs are full of LaTeX braces.
    if reference is None:
      return self.plain
    return self.with_reference.replace(REFERENCE_SLOT, reference)


PROOF_INSTRUCTIONS = CriticInstructions()


def critic_context_ids(tok: tokenization.Tokenizer, prompt_ids: Sequence[int],
                       response_ids: Sequence[int], *, reference: str | None = None,
                       instructions: CriticInstructions = PROOF_INSTRUCTIONS,
                       instruction_text: str | None = None) -> list[int]:
  """Token ids the critic reads to value the state `prompt_ids + response_ids`.

  `prompt_ids` is the rendered problem (ending in the assistant header, usually `<think>\\n`) and
  `response_ids` the partial response, possibly empty. The user turn is
  `instructions.render(reference)`, or `instruction_text` as given (e.g. a task's
  `critic_instruction(reference)`; then no `reference`).
  """
  if instruction_text is not None and reference is not None:
    raise ValueError('critic_context_ids: pass either instruction_text or reference, not both')
  user_text = instructions.render(reference) if instruction_text is None else instruction_text
  think_close = tok.token_id(tokenization.THINK_CLOSE)
  response_ids = [int(i) for i in response_ids]
  if response_ids and response_ids[-1] == tok.eos_id:
    # A finished response (diagnostics only; training scores those with the judge) is closed once,
    # not twice.
    response_ids = response_ids[:-1]
  ids = [int(i) for i in prompt_ids] + response_ids
  if think_close not in response_ids:
    ids.append(think_close)
  ids += [tok.eos_id] + tok.encode('\n')
  ids += tokenization.render_chat(tok, [tokenization.Turn('user', user_text)],
                                  generation_prompt=False)
  ids += tokenization.render_assistant_prefill(tok, ANSWER_STEM)
  return ids


def value_target_ids(tok: tokenization.Tokenizer, value: float) -> list[int]:
  """The critic's training target after the prefill: the formatted grid value, then `<|im_end|>`."""
  return tok.encode(values.format_value(value)) + [tok.eos_id]


def two_hot_target_ids(tok: tokenization.Tokenizer, value: float) -> tuple[list[int], int, float]:
  """A two-hot target of `value` (`values.two_hot`): (the lower grid value's target ids, the upper
  grid value's token, its weight). Needs each grid value to be one token."""
  lower, upper, weight = values.two_hot(value)
  lower_ids, upper_ids = value_target_ids(tok, lower), value_target_ids(tok, upper)
  if len(lower_ids) != 2 or len(upper_ids) != 2:
    raise ValueError(f'two-hot critic targets need every grid value to be one token; '
                     f'{values.format_value(lower)!r} or {values.format_value(upper)!r} is more '
                     f'in this tokenizer (use critic.target=rounded)')
  return lower_ids, upper_ids[0], weight


# A rationale's verdict per line: the line is right ('y') or wrong ('n'); one token each in the
# built-in tokenizer.
VERDICT_TEXT = {True: 'y', False: 'n'}


def with_rationale(tok: tokenization.Tokenizer, context_ids: Sequence[int],
                   rationale_ids: Sequence[int]) -> tuple[list[int], int]:
  """A critic prompt whose reply writes `rationale_ids` before 'Q value: ' (a thinking critic, a
  departure from the paper's "Don't think"): `context_ids` (from `critic_context_ids`) with the
  rationale inserted before its answer stem. Returns (ids, where the rationale starts)."""
  stem = tok.encode(ANSWER_STEM)
  ids = [int(i) for i in context_ids]
  if ids[-len(stem):] != stem:
    raise ValueError('with_rationale: the context does not end with the critic answer stem')
  start = len(ids) - len(stem)
  return ids[:start] + [int(i) for i in rationale_ids] + stem, start


def verdict_token(tok: tokenization.Tokenizer, verdict: bool) -> int:
  text = VERDICT_TEXT[bool(verdict)]
  ids = tok.encode(text)
  if len(ids) != 1 or tok.decode(ids) != text:
    raise ValueError(f'a verdict {text!r} is not one token of this tokenizer; a verdict '
                     f'rationale needs one')
  return ids[0]


def verdict_rationale(tok: tokenization.Tokenizer, verdicts: Sequence[bool],
                      lines: Sequence[str] | None = None) -> tuple[list[int], list[int]]:
  """A rationale that judges the attempt line by line: (its ids, the offsets of the verdicts in
  it, the tokens the critic writes). Without `lines`, one verdict token per line, then a line
  break ('yyn\n'); with them, each judged line repeated before its verdict ('3+2=5y\n...'): the
  host writes the line, so the critic's verdict sits right after what it judges."""
  ids, offsets = [], []
  for i, verdict in enumerate(verdicts):
    if lines is not None:
      ids += tok.encode(lines[i])
    offsets.append(len(ids))
    ids.append(verdict_token(tok, verdict))
    if lines is not None:
      ids += tok.encode('\n')
  if lines is None:
    ids += tok.encode('\n')
  return ids, offsets
