"""The critic's line marks: each worked line of the attempt marked with whether the policy itself
would have written its result (`critic.self_check`), or with whether it is the reference's line
(`critic.reference_check`); both departures from the paper's critic.

Why: on the built-in chain a line is right when its result follows from what it wrote, and the
policy's own forward, at the result's position, predicts that result (greedy 99.4% right on the
`bench` warm start). A critic trained to write that verdict itself stays at the base rate (50%) for
24,000 pairs in every layout tried, inline too, whereas a critic given the verdicts learns the
value from them (corr +0.97: BENCHMARKS.md, "Session 20"). So the check is taken from where it
lives: one forward of the critic prompt (whose attempt is the policy's own context, token for
token) gives the greedy digit at each written result, and a verdict token ('y'/'n', after the
result, before the line break) says whether they agree. The critic then reads the value of the
marked prompt. The verdicts are the host's, never trained: the critic's loss stays the value's.

Why the reference check: the self-check can only be as right as the policy. Where the policy has
facts to learn (the chain's blind facts, `sft.blind_fraction`), its greedy digit at a blind line
is a guess, so the self-check marks a luckily right line wrong exactly where credit matters. The
paper's critic compares the attempt with the reference solution in its prompt; the tiny critic
does not learn that comparison (reads uncorrelated after 24,000-48,000 pairs, with the reference a
whole attempt away or six tokens away: BENCHMARKS.md, "Session 13", "Session 17", "Session 20").
So the host makes the comparison the critic's prompt already allows: the verdict token says
whether the line is the reference's line of the same index. The value the critic reads from the
marked prompt (what the rest of the reply will earn) is still learnt. It stands in for a critic
large enough to compare, and measures what AC2's chunks can save when the critic can.

A line is a worked step 'a op b=c' ending in a line break, between `<think>` and `</think>`;
its result is the tokens between '=' and the break. A line cut before its break is not checked.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ac2_jax import tokenization
from ac2_jax.critic import prompt

MARKS = ('', 'self', 'reference')  # none (the paper's prompt), the policy's check, the reference's


def result_spans(tok: tokenization.Tokenizer, context_ids: Sequence[int]
                 ) -> list[tuple[int, int]]:
  """(first, end) positions of each complete line's result in a critic prompt's attempt: the
  tokens after a line's '=' up to its line break (end = the break's position)."""
  ids = [int(i) for i in context_ids]
  open_id, close_id = tok.token_id(tokenization.THINK_OPEN), tok.token_id(tokenization.THINK_CLOSE)
  equals, line_break = tok.encode('=')[0], tok.encode('\n')[-1]
  start = ids.index(open_id) + 1 if open_id in ids else 0
  stop = ids.index(close_id, start) if close_id in ids[start:] else len(ids)
  spans, first = [], None
  for i in range(start, stop):
    if ids[i] == equals:
      first = i + 1
    elif ids[i] == line_break and first is not None:
      if i > first:
        spans.append((first, i))
      first = None
  return spans


def with_verdicts(tok: tokenization.Tokenizer, context_ids: Sequence[int],
                  spans: Sequence[tuple[int, int]], verdicts: Sequence[bool]
                  ) -> tuple[np.ndarray, list[int]]:
  """The prompt with verdict i's token inserted at spans[i]'s end (after the result, before its
  line break), and the verdicts' positions in it."""
  if len(spans) != len(verdicts):
    raise ValueError(f'{len(verdicts)} verdicts for {len(spans)} lines')
  ids, positions, last = [], [], 0
  for (_, end), verdict in zip(spans, verdicts):
    ids += [int(i) for i in context_ids[last:end]]
    positions.append(len(ids))
    ids.append(prompt.verdict_token(tok, verdict))
    last = end
  ids += [int(i) for i in context_ids[last:]]
  return np.asarray(ids, np.int32), positions


def digit_ids(tok: tokenization.Tokenizer) -> list[int]:
  """The ten digits' tokens: the candidates of a result position (one token each)."""
  ids = [tok.encode(str(d)) for d in range(10)]
  if any(len(i) != 1 for i in ids):
    raise ValueError('critic.self_check needs every digit to be one token of this tokenizer')
  return [i[0] for i in ids]


def verdicts_from(context_ids: Sequence[int], spans: Sequence[tuple[int, int]],
                  predicted: np.ndarray) -> list[bool]:
  """A line is right by the policy's own check when its greedy digit at every result position
  (`predicted`, flat over the spans' positions in order) is the one written."""
  verdicts, k = [], 0
  for first, end in spans:
    written = np.asarray(context_ids[first:end])
    verdicts.append(bool(np.array_equal(predicted[k:k + end - first], written)))
    k += end - first
  return verdicts


def attempt_lines(tok: tokenization.Tokenizer, context_ids: Sequence[int],
                  spans: Sequence[tuple[int, int]]) -> list[tuple[int, str]]:
  """Per result span, its line's index among the attempt's non-empty lines and the line's text up
  to the result's end (the index a scorer reading the thinking's lines gives it)."""
  ids = [int(i) for i in context_ids]
  open_id = tok.token_id(tokenization.THINK_OPEN)
  line_break = tok.encode('\n')[-1]
  begin = ids.index(open_id) + 1 if open_id in ids else 0
  out = []
  for first, end in spans:
    start = first
    while start > begin and ids[start - 1] != line_break:
      start -= 1
    before = tok.decode(ids[begin:start])
    out.append((sum(1 for line in before.split('\n') if line.strip()),
                tok.decode(ids[start:end]).strip()))
  return out


def after_attempt(tok: tokenization.Tokenizer, context_ids: Sequence[int]) -> str:
  """The text of the critic prompt after the attempt's `</think>`: the user turn (instruction and
  reference) and the prefill."""
  ids = [int(i) for i in context_ids]
  close_id = tok.token_id(tokenization.THINK_CLOSE)
  return tok.decode(ids[ids.index(close_id) + 1:]) if close_id in ids else ''
