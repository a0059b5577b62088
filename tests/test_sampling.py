"""Sampler: settings, the sampling distribution, bucketing, and generation on the tiny preset.

Generation is checked against a teacher-forced forward pass of the plain model (log-probabilities,
entropies, greedy choices), against itself (same key, neighbours, grouping, prefix continuation),
and for stop reasons and compilation counts.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax import models
from ac2_jax import sampling
from ac2_jax.sampling import distribution, requests

CONFIG = models.get_config('tiny')
PLAIN = sampling.SamplingSettings(temperature=1.0)
SHARP = sampling.SamplingSettings(temperature=0.7, top_k=40, top_p=0.9)
GREEDY = sampling.SamplingSettings.greedy_decoding()
KEY = jax.random.key(7)
CAP = 12


@pytest.fixture(scope='module')
def params():
  params = models.init_params(CONFIG, jax.random.key(0))
  # A sharper head (entropy ~4 nats instead of ~log 512) so greedy choices have clear margins.
  return {**params, 'lm_head': {'kernel': params['lm_head']['kernel'] * 10.0}}


def make_contexts(lengths, seed=0):
  rng = np.random.RandomState(seed)
  return [rng.randint(0, CONFIG.vocab_size, size=n).astype(np.int32) for n in lengths]


CONTEXTS = make_contexts([3, 8, 15, 5, 11])


def teacher_forced(params, contexts, new_tokens, settings):
  """Per-token log-probs and entropies of `new_tokens` from one plain forward over each sequence."""
  seqs = [np.concatenate([c, t]) for c, t in zip(contexts, new_tokens)]
  T = max(len(s) for s in seqs)
  tokens_BxT = np.zeros((len(seqs), T), np.int32)
  for i, s in enumerate(seqs):
    tokens_BxT[i, :len(s)] = s
  lengths_B = jnp.asarray([len(s) for s in seqs])
  logits_BxTxV = models.logits(CONFIG, params, jnp.asarray(tokens_BxT), lengths_B)
  out = []
  for i, (c, t) in enumerate(zip(contexts, new_tokens)):
    rows = logits_BxTxV[i, len(c) - 1:len(c) - 1 + len(t)]
    log_probs = sampling.sampling_log_probs(rows, settings)
    out.append((np.asarray(distribution.token_log_probs(log_probs, jnp.asarray(t))),
                np.asarray(sampling.entropy(log_probs)), np.asarray(rows)))
  return out


@pytest.fixture(scope='module')
def plain_run(params):
  return sampling.generate(CONFIG, params, CONTEXTS, CAP, PLAIN, KEY, stop_ids=())


# --- settings and distribution -------------------------------------------------------------------

@pytest.mark.parametrize('kwargs, message', [
    (dict(temperature=0.0), 'temperature'), (dict(top_p=0.0), 'top_p'),
    (dict(top_p=1.5), 'top_p'), (dict(top_k=-1), 'top_k'), (dict(top_k=2.5), 'top_k'),
    (dict(valid_vocab_size=-1), 'valid_vocab_size'), (dict(valid_vocab_size=2.5), 'valid_vocab')])
def test_settings_reject_bad_values(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sampling.SamplingSettings(**kwargs)


def test_settings_presets_and_hashable():
  assert sampling.SamplingSettings.training() == sampling.SamplingSettings(temperature=0.8)
  ev = sampling.SamplingSettings.evaluation()
  assert (ev.temperature, ev.top_p, ev.top_k, ev.greedy) == (0.8, 0.95, 20, False)
  assert len({PLAIN, SHARP, sampling.SamplingSettings(temperature=1.0)}) == 2


def test_distribution_top_k_top_p_temperature():
  probs = np.array([0.4, 0.3, 0.2, 0.1, 1e-9, 1e-9])
  logits = jnp.asarray(np.log(probs)[None], jnp.float32)
  # top-p 0.6: 0.4 is below 0.6 before the second token, so it is kept; 0.7 before the third is not.
  got = np.exp(sampling.sampling_log_probs(logits, sampling.SamplingSettings(top_p=0.6)))[0]
  np.testing.assert_allclose(got, [4 / 7, 3 / 7, 0, 0, 0, 0], atol=1e-6)
  got = np.exp(sampling.sampling_log_probs(logits, sampling.SamplingSettings(top_k=3)))[0]
  np.testing.assert_allclose(got, [4 / 9, 3 / 9, 2 / 9, 0, 0, 0], atol=1e-6)
  both = sampling.SamplingSettings(top_k=3, top_p=0.8)
  got = np.exp(sampling.sampling_log_probs(logits, both))[0]
  np.testing.assert_allclose(got, [4 / 9, 3 / 9, 2 / 9, 0, 0, 0], atol=1e-6)
  got = np.exp(sampling.sampling_log_probs(logits, sampling.SamplingSettings(temperature=0.5)))[0]
  np.testing.assert_allclose(got, probs ** 2 / np.sum(probs ** 2), atol=1e-6)
  log_p = sampling.sampling_log_probs(logits, sampling.SamplingSettings(top_p=0.6))
  assert float(sampling.entropy(log_p)[0]) == pytest.approx(
      -(4 / 7 * np.log(4 / 7) + 3 / 7 * np.log(3 / 7)), abs=1e-6)


def test_padded_vocabulary_ids_are_never_drawn(params):
  # A checkpoint padded past its tokenizer: 512 rows, 300 token ids, and the padding rows' logits
  # made the largest, so an unmasked distribution puts most of its mass on them.
  valid = 300
  kernel = params['lm_head']['kernel']
  padded = {**params, 'lm_head': {'kernel': kernel.at[:, valid:].add(
      jnp.sign(kernel[:, valid:]) * 5.0)}}
  contexts = CONTEXTS[:3]
  for base in (PLAIN, GREEDY):
    settings = dataclasses.replace(base, valid_vocab_size=valid)
    out = sampling.generate(CONFIG, padded, contexts, 8, settings, KEY, stop_ids=())
    assert int(np.max(out.tokens_NxT)) < valid, base
    for i, (log_probs, entropies, logits) in enumerate(
        teacher_forced(padded, contexts, out.tokens_list(), settings)):
      np.testing.assert_allclose(out.logprobs(i), log_probs, atol=1e-4)
      np.testing.assert_allclose(out.entropies(i), entropies, atol=1e-4)
      unmasked = np.exp(sampling.sampling_log_probs(jnp.asarray(logits), base))
      assert np.all(unmasked[:, valid:].sum(-1) > 0.5)
  # The mask comes before top-k and top-p: they choose among the tokenizer's ids only.
  logits = jnp.asarray([[1.0, 2.0, 3.0, 0.5, 9.0, 8.0]])
  got = np.exp(sampling.sampling_log_probs(logits, sampling.SamplingSettings(
      top_k=2, top_p=0.99, valid_vocab_size=4)))[0]
  np.testing.assert_allclose(got, [0, np.exp(2) / (np.exp(2) + np.exp(3)),
                                   np.exp(3) / (np.exp(2) + np.exp(3)), 0, 0, 0], atol=1e-6)
  assert int(distribution.draw(None, jnp.log(got)[None], greedy=True)[0]) == 2
  with pytest.raises(ValueError, match="exceeds the model's 6 vocabulary rows"):
    sampling.sampling_log_probs(logits, sampling.SamplingSettings(valid_vocab_size=7))


def test_draw_frequencies_and_greedy():
  log_p_1xV = jnp.log(jnp.asarray([[0.5, 0.3, 0.2]]))
  keys = jax.random.split(jax.random.key(3), 4000)
  draws = distribution.draw(keys, jnp.repeat(log_p_1xV, 4000, axis=0), greedy=False)
  freqs = np.bincount(np.asarray(draws), minlength=3) / 4000
  np.testing.assert_allclose(freqs, [0.5, 0.3, 0.2], atol=0.03)
  assert int(distribution.draw(keys[:1], log_p_1xV, greedy=True)[0]) == 0


# --- host-side packing ---------------------------------------------------------------------------

def test_buckets():
  assert [requests.bucket(n) for n in (1, 16, 17, 24, 25, 33, 49, 97, 1000)] == [
      16, 16, 24, 24, 32, 48, 64, 128, 1024]
  assert [requests.bucket(n, 8) for n in (1, 9, 13, 20)] == [8, 12, 16, 24]


def test_train_buckets_waste_at_most_an_eighth_above_128():
  sizes = (1, 16, 17, 100, 129, 136, 145, 250, 257, 330, 1000)
  assert [requests.train_bucket(n) for n in sizes] == [
      16, 16, 32, 112, 144, 144, 160, 256, 288, 352, 1024]
  for n in range(129, 5000):
    assert n <= requests.train_bucket(n) <= n * 9 / 8
  with pytest.raises(ValueError, match='size must be >= 1'):
    requests.train_bucket(0)


def test_pack_pads_to_buckets_and_caps_at_total_length():
  packed = requests.pack(make_contexts([3, 20]), [5, 40], [5, 100], vocab_size=512,
                         max_total_len=50, batch_multiple=4)
  assert packed.contexts_BxP.shape == (8, 24)
  assert list(packed.context_lengths_B) == [3, 20] + [1] * 6
  # Row 1 would need 20 + 40 > 50 positions: its effective cap is 30.
  assert list(packed.caps_B) == [5, 30] + [1] * 6
  assert packed.max_new == 32
  assert requests.pack(make_contexts([3] * 9), 1, None, vocab_size=512, max_total_len=50,
                       batch_multiple=8).contexts_BxP.shape[0] == 16


def test_fine_pack_pads_rows_to_eights_and_length_to_train_bucket():
  # 17 rows: the half-octave ladder pads them to 24, the fine one to 24 as well; 33 rows: 48
  # against 40. A longest context of 161 tokens: 192 against train_bucket's 176.
  coarse = requests.pack(make_contexts([161] + [3] * 32), 1, None, vocab_size=512,
                         max_total_len=400)
  fine = requests.pack(make_contexts([161] + [3] * 32), 1, None, vocab_size=512,
                       max_total_len=400, fine=True)
  assert coarse.contexts_BxP.shape == (48, 192)
  assert fine.contexts_BxP.shape == (40, 176)
  assert list(fine.context_lengths_B) == [161] + [3] * 32 + [1] * 7
  assert requests.pack(make_contexts([3] * 9), 1, None, vocab_size=512, max_total_len=50,
                       batch_multiple=4, fine=True).contexts_BxP.shape[0] == 16


@pytest.mark.parametrize('contexts, caps, budgets, message', [
    ([], 1, None, 'no contexts'),
    ([np.zeros((2, 2), np.int32)], 1, None, '1-D'),
    ([np.zeros(0, np.int32)], 1, None, 'non-empty'),
    ([np.array([1.0, 2.0])], 1, None, 'integers'),
    ([np.array([1, 600])], 1, None, r'\[0, 512\)'),
    ([np.arange(64)], 1, None, 'no room'),
    ([np.arange(4)], 0, None, '>= 1'),
    ([np.arange(4)], [1, 2], None, 'one per context'),
    ([np.arange(4)], 5, 4, 'below its cap'),
])
def test_pack_rejects_bad_requests(contexts, caps, budgets, message):
  with pytest.raises(ValueError, match=message):
    requests.pack(contexts, caps, budgets, vocab_size=512, max_total_len=64)


def test_generate_rejects_bad_key_stop_ids_and_mesh(params):
  with pytest.raises(ValueError, match='PRNG key'):
    sampling.generate(CONFIG, params, CONTEXTS, 4, PLAIN, 7, stop_ids=())
  with pytest.raises(ValueError, match='stop_ids'):
    sampling.generate(CONFIG, params, CONTEXTS, 4, PLAIN, KEY, stop_ids=(512,))
  mesh = jax.make_mesh((1,), ('batch',), devices=jax.devices()[:1])
  with pytest.raises(ValueError, match='axes'):
    sampling.generate(CONFIG, params, CONTEXTS, 4, PLAIN, KEY, stop_ids=(), mesh=mesh)


# --- generation ----------------------------------------------------------------------------------

def test_output_shapes_and_counts(plain_run):
  out = plain_run
  assert out.tokens_NxT.shape == (5, CAP) and out.tokens_NxT.dtype == np.int32
  assert list(out.num_new_N) == [CAP] * 5
  assert list(out.decode_forwards_N) == [CAP - 1] * 5
  assert list(out.stop_reason_N) == ['budget'] * 5
  assert len(out.tokens_list()) == 5 and out.tokens(2).shape == (CAP,)


@pytest.mark.parametrize('settings', [PLAIN, SHARP], ids=['t1', 't0.7_topk40_topp0.9'])
def test_logprobs_and_entropies_match_teacher_forcing(params, plain_run, settings):
  out = plain_run if settings == PLAIN else sampling.generate(
      CONFIG, params, CONTEXTS, CAP, settings, KEY, stop_ids=())
  expected = teacher_forced(params, CONTEXTS, out.tokens_list(), settings)
  for i, (log_probs, entropies, _) in enumerate(expected):
    np.testing.assert_allclose(out.logprobs(i), log_probs, atol=1e-4, err_msg=f'row {i}')
    np.testing.assert_allclose(out.entropies(i), entropies, atol=1e-4, err_msg=f'row {i}')
    assert np.all(np.isfinite(out.logprobs(i)))
  if settings == SHARP:
    # Truncation shows: entropies are well below those of the full tempered distribution.
    assert np.mean(out.entropies_NxT) < np.mean(plain_run.entropies_NxT) - 0.5


def test_same_key_same_tokens_other_key_other_tokens(params, plain_run):
  again = sampling.generate(CONFIG, params, CONTEXTS, CAP, PLAIN, KEY, stop_ids=())
  np.testing.assert_array_equal(again.tokens_NxT, plain_run.tokens_NxT)
  other = sampling.generate(CONFIG, params, CONTEXTS, CAP, PLAIN, jax.random.key(8), stop_ids=())
  assert np.mean(other.tokens_NxT != plain_run.tokens_NxT) > 0.5


def test_rows_do_not_depend_on_neighbours_padding_or_grouping(params, plain_run):
  # Other neighbours, more rows (batch bucket 12) and longer contexts and caps (other buckets).
  mixed = list(CONTEXTS)
  mixed[1], mixed[3] = make_contexts([20, 2], seed=1)
  mixed += make_contexts([4, 17, 9, 6], seed=2)
  caps = [CAP, 20, CAP, 3, CAP, 5, 6, 7, 20]
  out = sampling.generate(CONFIG, params, mixed, caps, PLAIN, KEY, stop_ids=())
  for i in (0, 2, 4):
    np.testing.assert_array_equal(out.tokens(i), plain_run.tokens(i), err_msg=f'row {i}')
  # A request keyed by its id, alone in a batch.
  alone = sampling.generate(CONFIG, params, [CONTEXTS[3]], CAP, PLAIN, KEY, stop_ids=(),
                            row_ids=[3])
  np.testing.assert_array_equal(alone.tokens(0), plain_run.tokens(3))
  grouped = sampling.generate(CONFIG, params, CONTEXTS, CAP, PLAIN, KEY, stop_ids=(), max_batch=2)
  np.testing.assert_array_equal(grouped.tokens_NxT, plain_run.tokens_NxT)
  np.testing.assert_allclose(grouped.logprobs_NxT, plain_run.logprobs_NxT, atol=1e-5)


def test_short_caps_in_calls_of_their_own_give_the_same_rows(params, plain_run):
  """AC2's ready chunks (caps <= short_cap) decode in their own call: the same tokens and
  log-probs in request order."""
  caps = [CAP, 4, CAP, 3, 4]
  together = sampling.generate(CONFIG, params, CONTEXTS, caps, PLAIN, KEY, stop_ids=())
  split = sampling.generate(CONFIG, params, CONTEXTS, caps, PLAIN, KEY, stop_ids=(), short_cap=4)
  np.testing.assert_array_equal(split.tokens_NxT, together.tokens_NxT)
  np.testing.assert_allclose(split.logprobs_NxT, together.logprobs_NxT, atol=1e-5)
  np.testing.assert_array_equal(split.stop_reason_N, together.stop_reason_N)
  for i in (0, 2):
    np.testing.assert_array_equal(split.tokens(i), plain_run.tokens(i), err_msg=f'row {i}')
  assert list(split.num_new_N) == caps
  # Every request short, or none: one call, as without the split.
  np.testing.assert_array_equal(sampling.generate(CONFIG, params, CONTEXTS, 3, PLAIN, KEY,
                                                  stop_ids=(), short_cap=4).tokens_NxT,
                                plain_run.tokens_NxT[:, :3])
  with pytest.raises(ValueError, match='short_cap must be >= 0'):
    sampling.generate(CONFIG, params, CONTEXTS, caps, PLAIN, KEY, stop_ids=(), short_cap=-1)


def test_greedy_prefix_continuation_equals_forced_prefix(params):
  contexts = CONTEXTS[:2] + CONTEXTS[3:]
  full = sampling.generate(CONFIG, params, contexts, CAP, GREEDY, KEY, stop_ids=())
  # Greedy tokens are the argmax of a teacher-forced forward.
  for i, (_, _, logits) in enumerate(teacher_forced(params, contexts, full.tokens_list(), GREEDY)):
    np.testing.assert_array_equal(full.tokens(i), np.argmax(logits, axis=-1), err_msg=f'row {i}')
  cuts = [1, 4, 5, 5]
  prefixed = [np.concatenate([c, full.tokens(i)[:k]]) for i, (c, k) in enumerate(zip(contexts,
                                                                                     cuts))]
  rest = sampling.generate(CONFIG, params, prefixed, [CAP - k for k in cuts], GREEDY,
                           jax.random.key(99), stop_ids=())
  for i, k in enumerate(cuts):
    np.testing.assert_array_equal(rest.tokens(i), full.tokens(i)[k:], err_msg=f'row {i}')
    np.testing.assert_allclose(rest.logprobs(i), full.logprobs(i)[k:], atol=1e-4)


def test_stop_reasons(params, plain_run):
  stop = int(plain_run.tokens(0)[4])
  caps = [CAP, CAP, CAP, CAP, 4]
  budgets = [CAP, 100, CAP, 100, 100]
  # max_total_len 20: row 2 (15 context tokens) has room for only 5 new tokens.
  out = sampling.generate(CONFIG, params, CONTEXTS, caps, PLAIN, KEY, stop_ids=(stop,),
                          budget_new_tokens=budgets, max_total_len=20)
  limits = [CAP, CAP, 5, CAP, 4]
  for i, limit in enumerate(limits):
    tokens = plain_run.tokens(i)[:limit]
    hits = np.nonzero(tokens == stop)[0]
    if hits.size:
      expected_tokens, reason = tokens[:hits[0] + 1], 'eos'
    else:
      limited_by_cap = limit == caps[i] and caps[i] < budgets[i]
      expected_tokens, reason = tokens, ('chunk_cap' if limited_by_cap else 'budget')
    np.testing.assert_array_equal(out.tokens(i), expected_tokens, err_msg=f'row {i}')
    assert out.stop_reason_N[i] == reason, f'row {i}'
    assert out.decode_forwards_N[i] == len(expected_tokens) - 1
  assert out.stop_reason_N[0] == 'eos' and out.num_new_N[0] <= 5
  assert 'chunk_cap' in out.stop_reason_N and 'budget' in out.stop_reason_N
  # Padding past a row's end is zero.
  assert np.all(out.tokens_NxT[0, out.num_new_N[0]:] == 0)
  assert np.all(out.logprobs_NxT[0, out.num_new_N[0]:] == 0)


def test_compilations_only_per_bucket(params):
  settings = sampling.SamplingSettings(temperature=0.9)  # Used by no other test: fresh cache.
  before = sampling.trace_count()
  rng = np.random.RandomState(5)
  buckets = set()
  for trial in range(6):
    n = int(rng.randint(1, 13))
    lengths = rng.randint(1, 17 if trial < 4 else 24, size=n)
    caps = rng.randint(1, 17, size=n)
    sampling.generate(CONFIG, params, make_contexts(lengths, seed=trial), caps, settings,
                      jax.random.key(trial), stop_ids=(1, 2))
    eff = np.minimum(caps, CONFIG.max_position_embeddings - lengths)
    buckets.add((requests.bucket(n, 8), requests.bucket(int(lengths.max())),
                 requests.bucket(int(eff.max()))))
  assert sampling.trace_count() - before == len(buckets)
  assert len(buckets) <= 4


def test_segment_ends_double_up_to_max_new():
  from ac2_jax.sampling import decode
  assert decode.segment_ends(384) == [384]              # < 512 new tokens: one segment
  assert decode.segment_ends(600) == [300, 600]
  assert decode.segment_ends(51200) == [6400, 12800, 25600, 51200]   # at most 4
  assert decode.segment_ends(96, first=12) == [12, 24, 48, 96]
  assert decode.segment_ends(97, first=12) == [13, 25, 49, 97]
  assert decode.segment_ends(96, first=0) == [96]


def test_a_cache_grown_in_segments_decodes_the_same_tokens(params):
  """The loop over a cache that grows 12 -> 24 -> 48 -> 96 new-token slots equals the loop over
  all of them from the start: the slots the first segments leave out hold no keys yet."""
  from ac2_jax.sampling import decode
  contexts = make_contexts([3, 8, 15, 5])
  packed = requests.pack(contexts, np.array([90, 40, 96, 7]), None, vocab_size=CONFIG.vocab_size,
                         max_total_len=CONFIG.max_position_embeddings)
  assert packed.max_new == 96
  args = (params, KEY, *(jnp.asarray(x) for x in (
      packed.contexts_BxP, packed.context_lengths_B, packed.caps_B, packed.row_ids_B)))
  whole, grown = (decode.decode_batch(*args, config=CONFIG, settings=PLAIN, stop_ids=(),
                                      max_new=packed.max_new, first_segment=first)
                  for first in (0, 12))
  np.testing.assert_array_equal(whole[0], grown[0])     # tokens
  np.testing.assert_array_equal(whole[3], grown[3])     # counts: every row ran to its cap
  assert np.asarray(grown[3])[:4].tolist() == [90, 40, 96, 7]
  np.testing.assert_allclose(whole[1], grown[1], atol=1e-5)  # log-probs, entropies
  np.testing.assert_allclose(whole[2], grown[2], atol=1e-5)
