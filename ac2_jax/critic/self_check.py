"""The critic's self-check: each worked line of the attempt marked with whether the policy itself
would have written its result (a departure from the paper's critic, `critic.self_check`).

Why: on the built-in chain a line is right when its result follows from what it wrote, and the
policy's own forward, at the result's position, predicts that result (greedy 99.4% right on the
`bench` warm start). A critic trained to write that verdict itself stays at the base rate (50%) for
24,000 pairs in every layout tried, inline too, whereas a critic given the verdicts learns the
value from them (corr +0.97: BENCHMARKS.md, "Session 20"). So the check is taken from where it
lives: one forward of the critic prompt (whose attempt is the policy's own context, token for
token) gives the greedy digit at each written result, and a verdict token ('y'/'n', after the
result, before the line break) says whether they agree. The critic then reads the value of the
marked prompt. The verdicts are the host's, never trained: the critic's loss stays the value's.

A line is a worked step 'a op b=c' ending in a line break, between `<think>` and `</think>`;
its result is the tokens between '=' and the break. A line cut before its break is not checked.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ac2_jax import tokenization
from ac2_jax.critic import prompt


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
