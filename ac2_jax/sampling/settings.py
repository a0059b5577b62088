"""Sampling settings: one frozen (hashable) dataclass, a static argument of the jitted decoder."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """How the next token is drawn from the model's logits.

  The sampling distribution is softmax(logits / temperature) over the first `valid_vocab_size` ids
  (0 = all of the model's vocabulary rows), restricted to the `top_k` most likely
  tokens (0 = no restriction), then to the smallest set of the most likely tokens whose probability
  reaches `top_p` (1.0 = no restriction), and renormalised. `greedy` takes its most likely token
  instead of drawing; the reported log-probabilities and entropies are still those of the same
  distribution, so greedy and sampled rows are accounted for alike.

  Training defaults (ALGORITHMS.md Table 4): temperature 0.8, top_p 1, no top_k.
  Evaluation: temperature 0.8, top_p 0.95, top_k 20.

  `valid_vocab_size` is the tokenizer's vocabulary size when the checkpoint pads its embedding past
  it (official Qwen3: 151,936 rows for 151,669 ids): the padding ids' logits are masked out, so
  they are never drawn, not even greedily (`models.check_vocabulary` checks rows >= ids at load).
  """

  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  greedy: bool = False
  valid_vocab_size: int = 0  # ids >= this are never drawn; 0 = every vocabulary row is a token

  def __post_init__(self):
    if not self.temperature > 0.0:
      raise ValueError(f'SamplingSettings.temperature must be > 0, got {self.temperature!r}')
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f'SamplingSettings.top_p must be in (0, 1], got {self.top_p!r}')
    if int(self.top_k) != self.top_k or self.top_k < 0:
      raise ValueError(f'SamplingSettings.top_k must be an int >= 0 (0 = off), got {self.top_k!r}')
    if int(self.valid_vocab_size) != self.valid_vocab_size or self.valid_vocab_size < 0:
      raise ValueError('SamplingSettings.valid_vocab_size must be an int >= 0 (0 = the whole '
                       f'vocabulary), got {self.valid_vocab_size!r}')

  @classmethod
  def training(cls) -> 'SamplingSettings':
    return cls(temperature=0.8)

  @classmethod
  def evaluation(cls) -> 'SamplingSettings':
    return cls(temperature=0.8, top_p=0.95, top_k=20)

  @classmethod
  def greedy_decoding(cls) -> 'SamplingSettings':
    return cls(greedy=True)
