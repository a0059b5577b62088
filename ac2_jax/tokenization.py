"""Tokenizers and the Qwen3 chat turn format at token level.

Every tokenizer speaks the `Tokenizer` protocol. Special tokens use Qwen3's spellings
(`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`, `<|endoftext|>`), and the built-in task's
SentencePiece model declares the same pieces, so one chat renderer serves both.
"""

from __future__ import annotations

import dataclasses
import io
import os
import tempfile
from typing import Iterable, Protocol, Sequence, runtime_checkable

import sentencepiece as spm
import tokenizers

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


def tokens_within(tok: Tokenizer, ids: Sequence[int], num_chars: int) -> int:
  """The most leading ids whose decoded text is at most `num_chars` characters long: the token
  position of a character offset into `tok.decode(ids)` (rounded down to a token boundary)."""
  ids = [int(i) for i in ids]
  lo, hi = 0, len(ids)  # decode(ids[:lo]) fits; bisect on the prefix length
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if len(tok.decode(ids[:mid])) <= num_chars:
      lo = mid
    else:
      hi = mid - 1
  return lo


def tokens_reaching(tok: Tokenizer, ids: Sequence[int], num_chars: int) -> int:
  """The fewest leading ids whose decoded text is at least `num_chars` characters long (all of
  them when none is): a character offset rounded up to a token boundary."""
  if num_chars <= 0:
    return 0
  return min(len(ids), tokens_within(tok, ids, num_chars - 1) + 1)


def _check_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
  out = [int(i) for i in ids]
  bad = [i for i in out if not 0 <= i < vocab_size]
  if bad:
    raise ValueError(f'token ids {bad[:5]} outside the vocabulary [0, {vocab_size})')
  return out


# SentencePiece spells a space inside a piece as U+2581; callers write plain spaces.
_SP_SPACE = '\u2581'
# Never produced by `encode` from text (control symbols); `decode` writes their spellings.
_SP_CONTROL = (IM_START, IM_END, END_OF_TEXT)
# Always one token, also when they occur in plain text (as in Qwen3, where the thinking tags are
# ordinary added tokens). The newline is one too, so that encoding text in pieces (as the chat
# renderer does) gives the same ids as encoding it whole.
_SP_ALWAYS_SYMBOLS = ('\n', THINK_OPEN, THINK_CLOSE)


class _ChatIds:
  """Padding and end-of-turn ids by their Qwen3 spellings, for tokenizers with `token_id`."""

  @property
  def pad_id(self) -> int:
    return self.token_id(END_OF_TEXT)

  @property
  def eos_id(self) -> int:
    return self.token_id(IM_END)


class SentencePieceTokenizer(_ChatIds):
  """A SentencePiece model with the chat special tokens (the built-in task's tokenizer).

  Models come from `train`, which declares `<|im_start|>`, `<|im_end|>` and `<|endoftext|>` as
  control symbols (never matched in text), and the newline, `<think>`, `</think>` and the caller's
  symbols as user-defined symbols (always one token, matched in text). Normalisation is the
  identity and there is no dummy prefix, and unknown characters fall back to bytes, so
  `decode(encode(text)) == text` for any text.
  """

  def __init__(self, processor):
    self._sp = processor
    for piece in _SP_CONTROL + _SP_ALWAYS_SYMBOLS:
      self.token_id(piece)  # KeyError naming the piece when the model lacks it
    self._control_ids = {self.token_id(p): p for p in _SP_CONTROL}
    self._model_proto = processor.serialized_model_proto()

  @classmethod
  def load(cls, path: str) -> 'SentencePieceTokenizer':
    """Loads a `.model` file written by `train` (or any model declaring the chat specials)."""
    if not os.path.isfile(path):
      raise FileNotFoundError(f'SentencePiece model file not found: {path}')
    return cls(spm.SentencePieceProcessor(model_file=path))

  @classmethod
  def from_serialized(cls, model_proto: bytes) -> 'SentencePieceTokenizer':
    return cls(spm.SentencePieceProcessor(model_proto=model_proto))

  @classmethod
  def train(cls, corpus_iter: Iterable[str], model_prefix: str, vocab_size: int,
            user_defined_symbols: Sequence[str] = (), *, hard_vocab_limit: bool = False
            ) -> 'SentencePieceTokenizer':
    """Trains a BPE model on `corpus_iter` and writes it to `model_prefix + '.model'`.

    Args:
      corpus_iter: texts (each may span several lines).
      model_prefix: path prefix of the model file.
      vocab_size: the vocabulary size; with `hard_vocab_limit=False` an upper bound, so that a
        small synthetic corpus can yield a smaller vocabulary instead of an error.
      user_defined_symbols: pieces that are always one token (task tags, value-grid numbers,
        digits). Spaces inside them are allowed.
      hard_vocab_limit: demand exactly `vocab_size` pieces.
    BPE rather than unigram: on a small synthetic corpus it learns whole words, which keeps
    prompts and critic instructions short. Training is single-threaded and deterministic.
    """
    symbols: list[str] = []
    for s in list(_SP_ALWAYS_SYMBOLS) + list(user_defined_symbols):
      if not s:
        raise ValueError('user_defined_symbols must not contain an empty string')
      if s in _SP_CONTROL:
        raise ValueError(f'{s!r} is a control token already; it cannot be user-defined')
      s = s.replace(' ', _SP_SPACE)
      if s not in symbols:
        symbols.append(s)
    texts = [t for t in corpus_iter if t]
    if not texts:
      raise ValueError('SentencePieceTokenizer.train: the corpus is empty')
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=writer, vocab_size=vocab_size,
        hard_vocab_limit=hard_vocab_limit, model_type='bpe',
        normalization_rule_name='identity', remove_extra_whitespaces=False,
        add_dummy_prefix=False, byte_fallback=True, character_coverage=1.0, split_digits=True,
        allow_whitespace_only_pieces=True, max_sentence_length=1 << 20,
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, control_symbols=list(_SP_CONTROL),
        user_defined_symbols=symbols, num_threads=1, minloglevel=2)
    model_proto = writer.getvalue()
    path = model_prefix + '.model'
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # Write then rename, so a concurrent reader never sees half a model.
    fd, tmp = tempfile.mkstemp(dir=directory, suffix='.model.tmp')
    with os.fdopen(fd, 'wb') as f:
      f.write(model_proto)
    os.replace(tmp, path)
    return cls.from_serialized(model_proto)

  @property
  def serialized_model(self) -> bytes:
    return self._model_proto

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return list(self._sp.encode(text))

  def decode(self, ids: Sequence[int]) -> str:
    ids = _check_ids(ids, self.vocab_size)
    parts: list[str] = []
    run: list[int] = []
    for i in ids:
      if i in self._control_ids:
        if run:
          parts.append(self._sp.decode(run))
          run = []
        parts.append(self._control_ids[i])
      else:
        run.append(i)
    if run:
      parts.append(self._sp.decode(run))
    return ''.join(parts)

  def token_id(self, piece: str) -> int:
    """The id of a single piece (special tokens, user-defined symbols, any vocabulary piece)."""
    sp_piece = piece.replace(' ', _SP_SPACE)
    i = self._sp.piece_to_id(sp_piece)
    if i == self._sp.unk_id() and sp_piece != self._sp.id_to_piece(i):
      raise KeyError(f'piece {piece!r} is not in the SentencePiece vocabulary')
    return i


class HFTokenizer(_ChatIds):
  """A Hugging Face `tokenizer.json` (Qwen3 checkpoints), through the `tokenizers` package.

  Special ids are looked up by spelling. Tokens marked special in the file (`<|im_start|>`,
  `<|im_end|>`, `<|endoftext|>` in Qwen3) are never matched in text passed to `encode`; ordinary
  added tokens (Qwen3's `<think>`, `</think>`) are, as in Hugging Face's own tokenizer.
  """

  def __init__(self, tokenizer):
    self._tok = tokenizer
    self._tok.encode_special_tokens = True
    for piece in (IM_START, IM_END, THINK_OPEN, THINK_CLOSE):
      self.token_id(piece)  # KeyError naming the piece when the file lacks it
    vocab = self._tok.get_vocab(with_added_tokens=True)
    self._vocab_size = max(vocab.values()) + 1

  @classmethod
  def from_file(cls, path: str) -> 'HFTokenizer':
    """Loads `path` (a tokenizer.json, or a checkpoint directory holding one)."""
    if os.path.isdir(path):
      path = os.path.join(path, 'tokenizer.json')
    if not os.path.isfile(path):
      raise FileNotFoundError(f'tokenizer.json not found: {path}')
    return cls(tokenizers.Tokenizer.from_file(path))

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  def encode(self, text: str) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode(_check_ids(ids, self._vocab_size), skip_special_tokens=False)

  def token_id(self, piece: str) -> int:
    i = self._tok.token_to_id(piece)
    if i is None:
      raise KeyError(f'token {piece!r} is not in the tokenizer.json vocabulary')
    return i
