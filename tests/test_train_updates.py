"""Actor and critic update steps: exact micro-batch accumulation, NaN skipping, traced learning
rate, the sampler's support on a padded vocabulary."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax import models, sampling
from ac2_jax.learner import runtime
from ac2_jax.learner import state as state_lib
from ac2_jax.learner import updates
from ac2_jax.rl import critic_loss

CONFIG = models.get_config('tiny').replace(num_layers=2)


def _actor_batch(B=4, T=12, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, CONFIG.vocab_size, (B, T)).astype(np.int32)
  mask = np.zeros((B, T), np.float32)
  for b, start in enumerate(rng.integers(3, 7, B)):
    mask[b, start:T - b] = 1.0  # ragged generated spans
  params = models.init_params(CONFIG, jax.random.key(1))
  old = updates.sequence_logprobs(CONFIG, params, jnp.asarray(tokens), 0.8)
  adv = rng.normal(size=(B, 1)).astype(np.float32) * mask
  batch = updates.ActorBatch(jnp.asarray(tokens), jnp.asarray(mask), old, jnp.asarray(adv))
  return params, batch


def _settings(**kw):
  return updates.UpdateSettings(model=CONFIG, optim=state_lib.OptimSettings(actor_lr=1e-3), **kw)


def test_sequence_logprobs_align_with_tokens():
  params, batch = _actor_batch()
  logits = models.logits(CONFIG, params, batch.tokens_BxT)
  logp = updates.sequence_logprobs(CONFIG, params, batch.tokens_BxT, 1.0)
  expected = jax.nn.log_softmax(logits[1, 4])[batch.tokens_BxT[1, 5]]
  np.testing.assert_allclose(logp[1, 5], expected, rtol=1e-5)
  assert float(logp[0, 0]) == 0.0


@pytest.mark.parametrize('tied', [False, True])
def test_chunked_head_equals_the_whole_head(tied):
  """Chunks of 5 positions over T - 1 = 11 (the last chunk padded): same log-probs, same updates."""
  # A vocabulary unlike every other dimension, so that its shape is recognisable in the program.
  config = CONFIG.replace(tie_embeddings=tied, vocab_size=640)
  _, batch = _actor_batch()
  params = models.init_params(config, jax.random.key(1))
  whole = updates.sequence_logprobs(config, params, batch.tokens_BxT, 0.8)
  chunked = updates.sequence_logprobs(config, params, batch.tokens_BxT, 0.8, logits_chunk=5)
  np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-6)
  settings = updates.UpdateSettings(model=config, optim=state_lib.OptimSettings(actor_lr=1e-3))
  state = state_lib.init_state(params, settings.optim)
  step = jax.jit(updates.actor_update, static_argnums=0)
  new_whole, m_whole = step(settings, state, batch, 0.28)
  state = state_lib.init_state(params, settings.optim)
  new_chunked, m_chunked = step(dataclasses.replace(settings, logits_chunk=5), state, batch, 0.28)
  np.testing.assert_allclose(m_chunked['grad_norm'], m_whole['grad_norm'], rtol=1e-5)
  # Adam's first step moves each weight by about lr = 1e-3 whatever the gradient's size; where a
  # gradient is almost 0 the rounding of the two sums shows, far below a wrong step.
  for a, b in zip(jax.tree.leaves(new_chunked.params), jax.tree.leaves(new_whole.params)):
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)
  # The chunked forward and backward never build [B, T, V] logits; the whole head does.
  B, T = batch.tokens_BxT.shape

  def program(chunk):
    grad = jax.grad(lambda p: updates.sequence_logprobs(config, p, batch.tokens_BxT, 0.8,
                                                        chunk).sum())
    return jax.jit(grad).lower(params).as_text()

  full_shapes = [f'tensor<{B}x{t}x{config.vocab_size}xf32>' for t in (T, T - 1)]
  assert any(shape in program(0) for shape in full_shapes)
  chunked_program = program(5)
  assert not any(shape in chunked_program for shape in full_shapes)
  assert f'tensor<{B}x5x{config.vocab_size}xf32>' in chunked_program


def test_micro_batches_equal_full_batch():
  params, batch = _actor_batch()
  state = state_lib.init_state(params, _settings().optim)
  full, m_full = jax.jit(updates.actor_update, static_argnums=0)(_settings(), state, batch, 0.28)
  micro, m_micro = jax.jit(updates.actor_update, static_argnums=0)(
      _settings(micro_batch=2), state, batch, 0.28)
  np.testing.assert_allclose(m_full['loss'], m_micro['loss'], rtol=1e-5, atol=1e-7)
  assert float(m_full['tokens']) == float(batch.loss_mask_BxT.sum())
  for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(micro.params)):
    # Adam normalises tiny gradients, so compare at a fraction of the 1e-3 step size.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=5e-5)
  assert float(m_full['update_norm']) > 0 and float(m_full['skipped']) == 0.0
  assert int(full.step) == 1


def test_positive_advantage_raises_logprob_of_its_tokens():
  params, batch = _actor_batch()
  batch = batch.replace(advantages_BxT=batch.loss_mask_BxT)  # every generated token is good
  state = state_lib.init_state(params, _settings().optim)
  new, _ = updates.actor_update(_settings(), state, batch, 0.28)
  before = updates.sequence_logprobs(CONFIG, params, batch.tokens_BxT, 0.8)
  after = updates.sequence_logprobs(CONFIG, new.params, batch.tokens_BxT, 0.8)
  gain = ((after - before) * batch.loss_mask_BxT).sum()
  assert float(gain) > 0


def test_nan_loss_skips_update():
  params, batch = _actor_batch()
  batch = batch.replace(advantages_BxT=batch.advantages_BxT.at[0, 5].set(jnp.nan))
  state = state_lib.init_state(params, _settings().optim)
  new, metrics = updates.actor_update(_settings(), state, batch, 0.28)
  assert float(metrics['skipped']) == 1.0 and float(metrics['update_norm']) == 0.0
  assert int(new.step) == 0  # counts applied updates only
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(new.actor_opt_state), jax.tree.leaves(state.actor_opt_state)):
    np.testing.assert_array_equal(a, b)


def test_critic_update_uses_traced_learning_rate():
  params, batch = _actor_batch()
  target_mask = jnp.zeros_like(batch.loss_mask_BxT).at[:, -3:-1].set(1.0)
  cbatch = updates.CriticBatch(batch.tokens_BxT, target_mask, jnp.array([1.0, 0.5, 0.5, 1.0]))
  state = state_lib.init_state(params, _settings().optim)
  step = jax.jit(updates.critic_update, static_argnums=0)
  small, m_small = step(_settings(), state, cbatch, jnp.float32(1e-4))
  large, m_large = step(_settings(), state, cbatch, jnp.float32(2e-4))
  assert float(m_small['records']) == 4.0
  # Adam's first step has a fixed direction, so doubling lr doubles the update norm.
  assert float(m_large['update_norm']) == pytest.approx(2 * float(m_small['update_norm']), rel=1e-3)
  before = updates.sequence_logprobs(CONFIG, params, batch.tokens_BxT, 1.0)
  after = updates.sequence_logprobs(CONFIG, large.params, batch.tokens_BxT, 1.0)
  assert float(((after - before) * target_mask).sum()) > 0
  # The actor's optimizer state is untouched by a critic update.
  for a, b in zip(jax.tree.leaves(large.actor_opt_state), jax.tree.leaves(state.actor_opt_state)):
    np.testing.assert_array_equal(a, b)


def _critic_batch(contexts, targets, weights, T):
  tokens = np.zeros((len(contexts), T), np.int32)
  mask = np.zeros((len(contexts), T), np.float32)
  for b, (s, t) in enumerate(zip(contexts, targets)):
    tokens[b, :len(s) + len(t)] = np.concatenate([s, t])
    mask[b, len(s):len(s) + len(t)] = 1.0
  return updates.CriticBatch(jnp.asarray(tokens), jnp.asarray(mask),
                             jnp.asarray(weights, jnp.float32))


@pytest.mark.parametrize('tied', [False, True])
def test_critic_loss_on_its_target_window_equals_the_loss_over_every_position(tied):
  """The critic's head runs on a window of MAX_VALUE_TOKENS positions from each record's first
  target: the same loss and gradients as log-probs over the whole sequence, masked, including
  a record whose window runs past the sequence's end and a padding row with no target."""
  config = CONFIG.replace(tie_embeddings=tied)
  rng = np.random.default_rng(5)
  contexts = [rng.integers(1, config.vocab_size, n).astype(np.int32) for n in (9, 4, 14)]
  targets = [rng.integers(1, config.vocab_size, n).astype(np.int32) for n in (2, 4, 2)]
  batch = _critic_batch(contexts + [np.zeros(0, np.int32)], targets + [np.zeros(0, np.int32)],
                        [1.0, 0.5, 0.5, 0.0], 16)
  params = models.init_params(config, jax.random.key(2))

  def over_every_position(p):
    logp = updates.sequence_logprobs(config, p, batch.tokens_BxT, 1.0)
    return critic_loss.value_nll_loss(logp, batch.target_mask_BxT, batch.weights_B)[0]

  def on_the_window(p):
    start_B, mask_BxW = updates.target_window(batch.target_mask_BxT, critic_loss.MAX_VALUE_TOKENS)
    np.testing.assert_array_equal(start_B[:3], [9, 4, 14])
    logp = updates.window_logprobs(config, p, batch.tokens_BxT, start_B,
                                   critic_loss.MAX_VALUE_TOKENS, 1.0)
    return critic_loss.value_nll_loss(logp, mask_BxW, batch.weights_B)[0]

  want, want_grads = jax.value_and_grad(over_every_position)(params)
  got, got_grads = jax.value_and_grad(on_the_window)(params)
  assert float(want) > 0
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()))


def test_two_hot_critic_loss_by_hand():
  """A two-hot record's loss: w/4 of -[(1 - u) log p(lower) + u log p(upper) + log p(end | lower)],
  with p from the model's next-token distribution; u = 0 is the rounded record's loss."""
  rng = np.random.default_rng(7)
  contexts = [rng.integers(1, CONFIG.vocab_size, n).astype(np.int32) for n in (6, 11)]
  lower, end, upper = 5, 9, 6
  batch = _critic_batch(contexts, [np.array([lower, end], np.int32)] * 2, [1.0, 0.5], 16)
  two_hot = batch.replace(upper_token_B=jnp.array([upper, upper], jnp.int32),
                          upper_weight_B=jnp.array([0.3, 0.0], jnp.float32))
  params = models.init_params(CONFIG, jax.random.key(4))
  state = state_lib.init_state(params, _settings().optim)
  loss_sum, records, _ = updates.critic_grads(_settings(), state, two_hot)
  logits = models.forward(CONFIG, params, batch.tokens_BxT)[0]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  by_hand = 0.0
  for b, (n, w, u) in enumerate(zip((6, 11), (1.0, 0.5), (0.3, 0.0))):
    value = (1 - u) * logp[b, n - 1, lower] + u * logp[b, n - 1, upper]
    by_hand += w * -(value + logp[b, n, end]) / critic_loss.MAX_VALUE_TOKENS
  assert float(records) == 2.0
  np.testing.assert_allclose(loss_sum, by_hand, rtol=1e-5)
  # With no weight on the upper token the loss is the rounded (plain) record's.
  plain_sum, _, _ = updates.critic_grads(_settings(), state, batch)
  no_upper = two_hot.replace(upper_weight_B=jnp.zeros(2, jnp.float32))
  np.testing.assert_allclose(updates.critic_grads(_settings(), state, no_upper)[0], plain_sum,
                             rtol=1e-6)


def test_critic_step_over_length_groups_equals_one_padded_batch():
  """Records split into a short and a long batch, each padded to its own length: the same loss,
  records and update as all of them padded to the longest."""
  rng = np.random.default_rng(3)
  lengths = [5, 7, 6, 21, 24, 19]
  contexts = [rng.integers(1, CONFIG.vocab_size, n).astype(np.int32) for n in lengths]
  targets = [rng.integers(1, CONFIG.vocab_size, 2).astype(np.int32) for _ in lengths]
  weights = [1.0, 0.5, 0.5, 1.0, 0.5, 0.5]
  params = models.init_params(CONFIG, jax.random.key(1))
  # Adam's first step is lr * g / (|g| + eps): with the default eps it is about lr * sign(g), so a
  # gradient near 0 that rounds the other way moves its parameter by 2 lr (one of 65,536 did, by
  # 2.3% of lr, under XLA's cheap CPU passes). With eps = 1 the step is about lr * g: linear in the
  # gradient, so the parameters compare the two gradients without amplifying their rounding.
  settings = updates.UpdateSettings(model=CONFIG, optim=state_lib.OptimSettings(
      actor_lr=1e-3, critic_eps=1.0))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('data',))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state_shardings = jax.tree.map(lambda _: replicated, state_lib.init_state(params, settings.optim))
  step = runtime.make_critic_step(settings, state_shardings, replicated, replicated)
  lr = jnp.float32(1.0)  # updates of about g, far above the parameters' float32 rounding
  fresh = lambda: state_lib.init_state(jax.tree.map(jnp.copy, params), settings.optim)  # donated
  whole, m_whole = step(fresh(), _critic_batch(contexts, targets, weights, 32), lr)
  groups = (_critic_batch(contexts[:3], targets[:3], weights[:3], 16),
            _critic_batch(contexts[3:], targets[3:], weights[3:], 32))
  split, m_split = step(fresh(), groups, lr)
  assert float(m_split['records']) == float(m_whole['records']) == 6.0
  np.testing.assert_allclose(m_split['loss'], m_whole['loss'], rtol=1e-6)
  assert float(m_split['update_norm']) > 0
  # The two updates, each leaf against its own largest entry.
  for a, b, p in zip(jax.tree.leaves(split.params), jax.tree.leaves(whole.params),
                     jax.tree.leaves(params)):
    du_split, du_whole = np.asarray(a - p, np.float64), np.asarray(b - p, np.float64)
    scale = np.abs(du_whole).max()
    assert scale > 0
    np.testing.assert_allclose(du_split, du_whole, rtol=0, atol=1e-3 * scale)


def test_learner_logprobs_match_the_sampler_on_a_padded_vocabulary():
  """A checkpoint padded past its tokenizer: 512 rows, 300 ids, the padding rows' logits made the
  largest. Over the sampler's support the learner's log-prob of a sampled token is the sampler's,
  so an on-policy PPO ratio is 1; over all rows the padding would take most of the mass."""
  valid = 300
  params = models.init_params(CONFIG, jax.random.key(1))
  kernel = params['lm_head']['kernel']
  params = {**params, 'lm_head': {'kernel': kernel.at[:, valid:].add(
      jnp.sign(kernel[:, valid:]) * 5.0)}}
  rng = np.random.default_rng(0)
  contexts = [rng.integers(0, valid, n).astype(np.int32) for n in (3, 7, 5, 9)]
  settings = sampling.SamplingSettings(temperature=0.8, valid_vocab_size=valid)
  out = sampling.generate(CONFIG, params, contexts, 6, settings, jax.random.key(2), stop_ids=())
  tokens = np.zeros((4, 16), np.int32)
  mask = np.zeros((4, 16), np.float32)
  old = np.zeros((4, 16), np.float32)
  for b, c in enumerate(contexts):
    new = out.tokens(b)
    assert len(new) == 6 and np.max(new) < valid
    tokens[b, :len(c)], tokens[b, len(c):len(c) + 6] = c, new
    mask[b, len(c):len(c) + 6] = 1.0
    old[b, len(c):len(c) + 6] = out.logprobs(b)
  on = mask > 0
  for chunk in (0, 5):
    logp = updates.sequence_logprobs(CONFIG, params, jnp.asarray(tokens), 0.8, chunk, valid)
    np.testing.assert_allclose(np.asarray(logp)[on], old[on], atol=1e-4)
  unmasked = np.asarray(updates.sequence_logprobs(CONFIG, params, jnp.asarray(tokens), 0.8))
  assert np.all(old[on] - unmasked[on] > 1.0)
  batch = updates.ActorBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(old),
                             jnp.asarray(mask * rng.normal(size=(4, 1)).astype(np.float32)))
  # The actor step reads the same support from its settings (unmasked, the ratio would be < e^-1).
  state = state_lib.init_state(params, _settings().optim)
  _, metrics = jax.jit(updates.actor_update, static_argnums=0)(
      _settings(valid_vocab_size=valid), state, batch, 0.28)
  assert float(metrics['ratio']) == pytest.approx(1.0, abs=1e-4)
  assert float(metrics['clip_frac']) == 0.0 and float(metrics['approx_kl']) < 1e-6
  for bad in (-1, 513, 2.5):
    with pytest.raises(ValueError, match='valid_vocab_size'):
      _settings(valid_vocab_size=bad)
  # A runtime whose learner and samplers disagree on the support is refused before any work.
  with pytest.raises(ValueError, match='valid_vocab_size differs'):
    runtime.build_runtime(
        model_config=CONFIG, tokenizer=None, task=None, mesh=None,
        update_settings=_settings(valid_vocab_size=valid), train_sampling=settings,
        eval_sampling=sampling.SamplingSettings(), max_total_len=64, max_sample_batch=8,
        actor_minibatches=1, state=None)


def test_critic_rationale_loss_by_hand():
  """A record with a rationale inside its prompt: its value loss as before, plus w times the mean
  NLL of the rationale's tokens, read from the same forward; a row without one adds nothing."""
  rng = np.random.default_rng(8)
  contexts = [rng.integers(1, CONFIG.vocab_size, n).astype(np.int32) for n in (9, 12)]
  value, end = 5, 9
  batch = _critic_batch(contexts, [np.array([value, end], np.int32)] * 2, [1.0, 0.5], 16)
  spans = [(4, 7), (0, 0)]  # record 0's tokens 4..6 are its rationale; record 1 has none
  mask = np.zeros((2, 16), np.float32)
  mask[0, 4:7] = 1.0
  with_rationale = batch.replace(rationale_mask_BxT=jnp.asarray(mask), rationale_width=8)
  params = models.init_params(CONFIG, jax.random.key(5))
  state = state_lib.init_state(params, _settings().optim)
  plain_sum, records, _ = updates.critic_grads(_settings(), state, batch)
  loss_sum, records_r, grads = updates.critic_grads(_settings(), state, with_rationale)
  logits = models.forward(CONFIG, params, batch.tokens_BxT)[0]
  logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), -1))
  tokens = np.asarray(batch.tokens_BxT)
  start, stop = spans[0]
  rationale_nll = -np.mean([logp[0, t - 1, tokens[0, t]] for t in range(start, stop)])
  assert float(records_r) == float(records) == 2.0
  np.testing.assert_allclose(loss_sum, plain_sum + 1.0 * rationale_nll, rtol=1e-5)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
