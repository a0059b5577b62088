"""Tokenizers (SentencePiece trained here, tokenizer.json built here) and the chat format."""

import os

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from ac2_jax import tokenization as T

_CORPUS = [
    'The quick brown fox jumps over the lazy dog.',
    'Start at 7 and apply modulo 13: +5 *3 -2\nWrite each result.',
    '+5=12\n*3=10\n-2=8',
    'Pause here and estimate the credit. Q value: 0.3',
    'system\nuser\nassistant\n',
] * 20

_TEXTS = [
    '',
    'hello world',
    '  two  spaces and a trailing space ',
    'lines\nand\n\nblank lines\n',
    ' leading space',
    'unicode: é ü 🙂 日本',
    'tags in text: <|im_end|> <|im_start|> <|endoftext|>',
    '<think>\nreasoning\n</think>\n\n<answer>42</answer>',
    'Q value: 0.7',
    'tab\tand\rreturn',
]


@pytest.fixture(scope='module')
def sp_tok(tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp('sp') / 'tok')
  return T.SentencePieceTokenizer.train(
      iter(_CORPUS), prefix, 400,
      user_defined_symbols=['<answer>', '</answer>', 'Q value:', '0.1', '0.3', '0.7'])


@pytest.fixture(scope='module')
def hf_path(tmp_path_factory):
  """A byte-level BPE tokenizer.json laid out like Qwen3's (special and ordinary added tokens)."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_CORPUS, trainer=trainer)
  # As in Qwen3: the chat markers are special; the thinking tags are ordinary added tokens.
  tok.add_special_tokens([T.END_OF_TEXT, T.IM_START, T.IM_END])
  tok.add_tokens([T.THINK_OPEN, T.THINK_CLOSE])
  directory = tmp_path_factory.mktemp('hf')
  tok.save(str(directory / 'tokenizer.json'))
  return str(directory)


@pytest.fixture(scope='module')
def hf_tok(hf_path):
  return T.HFTokenizer.from_file(hf_path)


@pytest.fixture(params=['sp', 'hf'])
def tok(request, sp_tok, hf_tok):
  return {'sp': sp_tok, 'hf': hf_tok}[request.param]


def test_protocol(tok):
  assert isinstance(tok, T.Tokenizer)
  assert tok.eos_id == tok.token_id(T.IM_END)
  assert tok.pad_id == tok.token_id(T.END_OF_TEXT)
  ids = {tok.token_id(p) for p in T.CHAT_SPECIAL_TOKENS}
  assert len(ids) == len(T.CHAT_SPECIAL_TOKENS)
  assert all(0 <= i < tok.vocab_size for i in ids)


@pytest.mark.parametrize('text', _TEXTS)
def test_round_trip(tok, text):
  ids = tok.encode(text)
  assert all(0 <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text


def test_chat_markers_in_text_are_not_specials(tok):
  ids = tok.encode('a <|im_end|> b <|im_start|> c <|endoftext|>')
  for piece in (T.IM_END, T.IM_START, T.END_OF_TEXT):
    assert tok.token_id(piece) not in ids


def test_thinking_tags_are_single_tokens(tok):
  assert tok.encode(T.THINK_OPEN) == [tok.token_id(T.THINK_OPEN)]
  assert tok.encode('x' + T.THINK_CLOSE)[-1] == tok.token_id(T.THINK_CLOSE)


def test_decode_renders_specials(tok):
  ids = [tok.token_id(T.IM_START)] + tok.encode('user\nhi') + [tok.eos_id]
  assert tok.decode(ids) == '<|im_start|>user\nhi<|im_end|>'


def test_unknown_piece_and_bad_ids(tok):
  with pytest.raises(KeyError, match='no_such_piece'):
    tok.token_id('<no_such_piece>')
  with pytest.raises(ValueError, match='outside the vocabulary'):
    tok.decode([tok.vocab_size])
  with pytest.raises(ValueError, match='outside the vocabulary'):
    tok.decode([-1])


def test_render_chat(tok):
  turns = [T.Turn('system', 'Be brief.'), T.Turn('user', 'What is 2+2?'),
           T.Turn('assistant', 'It is 4.', thinking='2+2=4'), T.Turn('user', 'And 3+3?')]
  ids = T.render_chat(tok, turns)
  assert tok.decode(ids) == (
      '<|im_start|>system\nBe brief.<|im_end|>\n'
      '<|im_start|>user\nWhat is 2+2?<|im_end|>\n'
      '<|im_start|>assistant\n<think>\n2+2=4\n</think>\n\nIt is 4.<|im_end|>\n'
      '<|im_start|>user\nAnd 3+3?<|im_end|>\n'
      '<|im_start|>assistant\n<think>\n')
  assert ids.count(tok.token_id(T.IM_START)) == 5
  assert ids.count(tok.eos_id) == 4
  no_think = T.render_chat(tok, turns[:2], open_thinking=False)
  assert tok.decode(no_think).endswith('<|im_start|>assistant\n')
  closed = T.render_chat(tok, turns[:2], generation_prompt=False)
  assert tok.decode(closed).endswith('<|im_end|>\n')
  with pytest.raises(ValueError, match='unknown chat role'):
    T.render_chat(tok, [T.Turn('tool', 'x')])


def test_render_assistant_prefill(tok):
  ids = T.render_assistant_prefill(tok, 'Q value: ')
  assert tok.decode(ids) == '<|im_start|>assistant\n<think>\n\n</think>\n\nQ value: '
  assert tok.token_id(T.THINK_CLOSE) in ids
  bare = T.render_assistant_prefill(tok, 'Q value: ', empty_thinking=False)
  assert tok.decode(bare) == '<|im_start|>assistant\nQ value: '


def test_sentencepiece_user_defined_symbols(sp_tok):
  for piece in ('<answer>', '</answer>', 'Q value:', '0.3', '\n'):
    assert sp_tok.encode(piece) == [sp_tok.token_id(piece)]
  # The critic's prefill ends in a space: the value that follows must tokenize the same way.
  assert (sp_tok.encode('Q value: ') + sp_tok.encode('0.3') == sp_tok.encode('Q value: 0.3'))
  # split_digits: every digit is its own token.
  ids = sp_tok.encode('12345')
  assert len(ids) == 5 and sp_tok.decode(ids) == '12345'
  # Encoding in pieces (as the chat renderer does) equals encoding whole across newlines.
  assert sp_tok.encode('\n+5=12\n') == sp_tok.encode('\n') + sp_tok.encode('+5=12\n')


def test_sentencepiece_train_load_deterministic(sp_tok, tmp_path):
  again = T.SentencePieceTokenizer.train(
      iter(_CORPUS), str(tmp_path / 'again'), 400,
      user_defined_symbols=['<answer>', '</answer>', 'Q value:', '0.1', '0.3', '0.7'])
  assert again.serialized_model == sp_tok.serialized_model
  assert os.path.isfile(tmp_path / 'again.model')
  loaded = T.SentencePieceTokenizer.load(str(tmp_path / 'again.model'))
  assert loaded.vocab_size == sp_tok.vocab_size <= 400
  text = 'Start at 7: +5=12\nQ value: 0.3'
  assert loaded.encode(text) == sp_tok.encode(text)


def test_sentencepiece_train_errors(tmp_path):
  with pytest.raises(ValueError, match='corpus is empty'):
    T.SentencePieceTokenizer.train(iter([]), str(tmp_path / 'x'), 300)
  with pytest.raises(ValueError, match='control token'):
    T.SentencePieceTokenizer.train(iter(_CORPUS), str(tmp_path / 'x'), 300,
                                   user_defined_symbols=[T.IM_END])
  with pytest.raises(FileNotFoundError, match='missing.model'):
    T.SentencePieceTokenizer.load(str(tmp_path / 'missing.model'))


def test_hf_tokenizer_file_errors(tmp_path, hf_path):
  with pytest.raises(FileNotFoundError, match='tokenizer.json'):
    T.HFTokenizer.from_file(str(tmp_path))
  # A tokenizer.json without the chat markers is refused, naming the missing token.
  bare = tokenizers.Tokenizer.from_file(os.path.join(hf_path, 'tokenizer.json'))
  plain = tokenizers.Tokenizer(models.BPE())
  plain.pre_tokenizer = bare.pre_tokenizer
  plain.save(str(tmp_path / 'tokenizer.json'))
  with pytest.raises(KeyError, match='im_start'):
    T.HFTokenizer.from_file(str(tmp_path / 'tokenizer.json'))


def test_hf_ids_match_tokenizers_library(hf_tok, hf_path):
  raw = tokenizers.Tokenizer.from_file(os.path.join(hf_path, 'tokenizer.json'))
  text = 'The quick brown fox </think> jumps'
  assert hf_tok.encode(text) == raw.encode(text, add_special_tokens=False).ids
  assert hf_tok.token_id(T.IM_END) == raw.token_to_id(T.IM_END)
  assert hf_tok.vocab_size == raw.get_vocab_size(with_added_tokens=True)
