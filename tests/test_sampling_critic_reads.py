"""Critic reads: greedy short decode and the one-forward readout over value tokens (tiny preset)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax import models
from ac2_jax import sampling
from ac2_jax.learner import rows

CONFIG = models.get_config('tiny')


@pytest.fixture(scope='module')
def params():
  params = models.init_params(CONFIG, jax.random.key(1))
  # A sharper head so greedy choices have clear margins.
  return {**params, 'lm_head': {'kernel': params['lm_head']['kernel'] * 10.0}}


def contexts(lengths, seed=0):
  rng = np.random.RandomState(seed)
  return [rng.randint(0, CONFIG.vocab_size, size=n).astype(np.int32) for n in lengths]


CONTEXTS = contexts([6, 2, 13])


def padded_logits(params, seqs):
  T = max(len(s) for s in seqs)
  tokens = np.zeros((len(seqs), T), np.int32)
  for i, s in enumerate(seqs):
    tokens[i, :len(s)] = s
  return np.asarray(models.logits(CONFIG, params, jnp.asarray(tokens),
                                  jnp.asarray([len(s) for s in seqs])))


def test_greedy_decode_is_argmax_and_stops(params):
  reads = sampling.greedy_decode(CONFIG, params, CONTEXTS, stop_ids=())
  assert [len(r) for r in reads] == [4, 4, 4]
  logits = padded_logits(params, [np.concatenate([c, r]) for c, r in zip(CONTEXTS, reads)])
  for i, (c, r) in enumerate(zip(CONTEXTS, reads)):
    np.testing.assert_array_equal(r, np.argmax(logits[i, len(c) - 1:len(c) + 3], -1))
  # Stopping at row 0's second token ends row 0 there (stop token included).
  stop = int(reads[0][1])
  stopped = sampling.greedy_decode(CONFIG, params, CONTEXTS, stop_ids=(stop,))
  np.testing.assert_array_equal(stopped[0], reads[0][:2])
  for i in (1, 2):
    hits = np.nonzero(reads[i] == stop)[0]
    expected = reads[i][:hits[0] + 1] if hits.size else reads[i]
    np.testing.assert_array_equal(stopped[i], expected)
  with pytest.raises(ValueError, match='max_new_tokens'):
    sampling.greedy_decode(CONFIG, params, CONTEXTS, stop_ids=(), max_new_tokens=5)


def test_token_distribution_matches_forward(params):
  ids = [5, 17, 300, 17 + 256]
  raw = sampling.token_distribution(CONFIG, params, CONTEXTS, ids)
  assert raw.shape == (3, 4) and raw.dtype == np.float32
  logits = padded_logits(params, CONTEXTS)
  for i, c in enumerate(CONTEXTS):
    probs = np.asarray(jax.nn.softmax(logits[i, len(c) - 1]))
    np.testing.assert_allclose(raw[i], probs[ids], rtol=1e-4, atol=1e-7)
  assert np.all(raw.sum(-1) < 1.0)
  # Read a few rows at a time, the same probabilities.
  np.testing.assert_allclose(
      sampling.token_distribution(CONFIG, params, CONTEXTS, ids, max_batch=2), raw, atol=1e-6)
  norm = sampling.token_distribution(CONFIG, params, CONTEXTS, ids, renormalize=True)
  np.testing.assert_allclose(norm.sum(-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(norm, raw / raw.sum(-1, keepdims=True), rtol=1e-5)
  # Longest first, two rows a call, each call padded to its own longest: the rows come back in
  # the callers' order, the same as in the layout before (the given order, coarse buckets).
  mixed = contexts([3, 40, 7, 33, 1, 20], seed=3)
  np.testing.assert_allclose(
      sampling.token_distribution(CONFIG, params, mixed, ids, max_batch=2),
      sampling.token_distribution(CONFIG, params, mixed, ids, max_batch=128,
                                  length_sorted=False), rtol=1e-5, atol=1e-7)
  assert sampling.token_distribution(CONFIG, params, [], ids).shape == (0, 4)
  with pytest.raises(ValueError, match='outside'):
    sampling.token_distribution(CONFIG, params, CONTEXTS, [512])
  with pytest.raises(ValueError, match='empty'):
    sampling.token_distribution(CONFIG, params, CONTEXTS, [])



def test_token_distributions_at_read_every_position_of_one_forward(params):
  """Each requested position reads what `token_distribution` reads on the context cut there."""
  ids = [5, 17, 300]
  positions = [[1, len(c) - 1] for c in CONTEXTS]
  positions[0] = [len(CONTEXTS[0]) - 1]
  got = sampling.token_distributions_at(CONFIG, params, CONTEXTS, positions, ids, max_batch=2)
  for c, at, probs in zip(CONTEXTS, positions, got):
    assert probs.shape == (len(at), len(ids))
    want = sampling.token_distribution(CONFIG, params, [c[:p] for p in at], ids,
                                       renormalize=True)
    np.testing.assert_allclose(probs, want, rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match='outside'):
    sampling.token_distributions_at(CONFIG, params, CONTEXTS[:1], [[len(CONTEXTS[0])]], ids)

VALID = 300  # token ids of a tokenizer whose checkpoint pads the embedding to CONFIG's 512 rows


@pytest.fixture(scope='module')
def padded(params):
  """The padding rows' logits made the largest, so an unmasked read picks one at every step."""
  kernel = params['lm_head']['kernel']
  return {**params, 'lm_head': {'kernel': kernel.at[:, VALID:].add(
      jnp.sign(kernel[:, VALID:]) * 5.0)}}


def test_critic_reads_stay_in_the_tokenizer_vocabulary(padded):
  unmasked = sampling.greedy_decode(CONFIG, padded, CONTEXTS, stop_ids=())
  assert all(np.all(r >= VALID) for r in unmasked)
  reads = sampling.greedy_decode(CONFIG, padded, CONTEXTS, stop_ids=(), valid_vocab_size=VALID)
  logits = padded_logits(padded, [np.concatenate([c, r]) for c, r in zip(CONTEXTS, reads)])
  for i, (c, r) in enumerate(zip(CONTEXTS, reads)):
    assert len(r) == 4
    np.testing.assert_array_equal(r, np.argmax(logits[i, len(c) - 1:len(c) + 3, :VALID], -1))
  # The learner's critic read passes the runtime's support; a tokenizer would reject a padding id.
  decoded = []

  def decode(ids):
    assert max(ids, default=0) < VALID, ids
    decoded.append(list(ids))
    return '0.5'

  rt = types.SimpleNamespace(
      model_config=CONFIG, mesh=None, max_total_len=64, max_sample_batch=None,
      valid_vocab_size=VALID, critic_context=lambda prompt, response, ref: prompt,
      critic_marks='', tokenizer=types.SimpleNamespace(eos_id=VALID - 1, decode=decode))
  values = rows.critic_reads(rt, padded, CONTEXTS, [None] * 3, [None] * 3)
  assert values == [0.5] * 3 and decoded == [r.tolist() for r in reads]
  # The one-forward readout normalises over the same support.
  ids = [5, 17, VALID - 1]
  raw = sampling.token_distribution(CONFIG, padded, CONTEXTS, ids, valid_vocab_size=VALID)
  logits = padded_logits(padded, CONTEXTS)
  for i, c in enumerate(CONTEXTS):
    probs = np.asarray(jax.nn.softmax(logits[i, len(c) - 1, :VALID]))
    np.testing.assert_allclose(raw[i], probs[ids], rtol=1e-4, atol=1e-7)
  with pytest.raises(ValueError, match=f'outside \\[0, {VALID}\\)'):
    sampling.token_distribution(CONFIG, padded, CONTEXTS, [VALID], valid_vocab_size=VALID)
