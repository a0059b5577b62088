"""Tokenizers and the Qwen3 chat turn format at token level.

Every tokenizer speaks the `Tokenizer` protocol. Special tokens use Qwen3's spellings
(`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`, `<|endoftext|>`), and the built-in task's
SentencePiece model declares the same pieces, so one chat renderer serves both.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence, runtime_checkable

IM_START = '<|im_start|>'
IM_END = '<|im_end|>'
THINK_OPEN = '<think>'
THINK_CLOSE = '</think>'
END_OF_TEXT = '<|endoftext|>'
CHAT_SPECIAL_TOKENS = (IM_START, IM_END, THINK_OPEN, THINK_CLOSE, END_OF_TEXT)


@runtime_checkable
class Tokenizer(Protocol):
  """What the rest of the code base needs of a tokenizer."""

  @property
  def vocab_size(self) -> int: ...

  @property
  def pad_id(self) -> int: ...

  @property
  def eos_id(self) -> int:
    """The token that ends an assistant turn (`<|im_end|>`): sampling stops on it."""
    ...

  def encode(self, text: str) -> list[int]:
    """Plain text to ids; special-token spellings inside `text` are NOT turned into specials."""
    ...

  def decode(self, ids: Sequence[int]) -> str:
    """Ids to text; special tokens are rendered with their spellings."""
    ...

  def token_id(self, piece: str) -> int:
    """The id of a special token; KeyError naming the piece when the vocabulary lacks it."""
    ...


@dataclasses.dataclass(frozen=True)
class Turn:
  role: str  # 'system' | 'user' | 'assistant'
  content: str
  # Assistant turns only: the thinking section. None renders no <think> block at all.
  thinking: str | None = None


def _render_turn(tok: Tokenizer, turn: Turn, close: bool) -> list[int]:
  if turn.role not in ('system', 'user', 'assistant'):
    raise ValueError(f'unknown chat role {turn.role!r}')
  ids = [tok.token_id(IM_START)] + tok.encode(turn.role + '\n')
  if turn.role == 'assistant' and turn.thinking is not None:
    ids += [tok.token_id(THINK_OPEN)] + tok.encode('\n' + turn.thinking + '\n')
    ids += [tok.token_id(THINK_CLOSE)] + tok.encode('\n\n')
  ids += tok.encode(turn.content)
  if close:
    ids += [tok.token_id(IM_END)] + tok.encode('\n')
  return ids


def render_chat(tok: Tokenizer, turns: Sequence[Turn], *, generation_prompt: bool = True,
                open_thinking: bool = True) -> list[int]:
  """Token ids of a conversation in the Qwen3 format.

  With `generation_prompt`, an assistant header follows (and `<think>\\n` when `open_thinking`),
  so that the model's continuation is the response, starting inside its thinking section.
  """
  ids: list[int] = []
  for turn in turns:
    ids += _render_turn(tok, turn, close=True)
  if generation_prompt:
    ids += [tok.token_id(IM_START)] + tok.encode('assistant\n')
    if open_thinking:
      ids += [tok.token_id(THINK_OPEN)] + tok.encode('\n')
  return ids


def render_assistant_prefill(tok: Tokenizer, content: str, *, empty_thinking: bool = True
                             ) -> list[int]:
  """An open assistant turn whose reply starts with `content` (e.g. the critic's 'Q value: ')."""
  ids = [tok.token_id(IM_START)] + tok.encode('assistant\n')
  if empty_thinking:
    ids += [tok.token_id(THINK_OPEN)] + tok.encode('\n\n') + [tok.token_id(THINK_CLOSE)]
    ids += tok.encode('\n\n')
  return ids + tok.encode(content)
