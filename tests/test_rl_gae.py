"""GAE over token masks, skip-observation GAE, adaptive lambda: hand numbers, lambda identities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax.rl import gae


def _reference_gae(values, rewards, gamma, lam):
  """Textbook loop over one contiguous episode (value after the end is 0)."""
  t_len = len(values)
  adv = np.zeros(t_len)
  running = 0.0
  for t in reversed(range(t_len)):
    next_v = values[t + 1] if t + 1 < t_len else 0.0
    running = rewards[t] + gamma * next_v - values[t] + gamma * lam * running
    adv[t] = running
  return adv


def test_hand_numbers():
  # V = [.5, .6, .8], terminal reward 1 on the last token, gamma 1, lambda .5:
  # deltas = [.1, .2, .2]; A_2 = .2, A_1 = .2 + .5*.2 = .3, A_0 = .1 + .5*.3 = .25.
  values = jnp.array([[0.5, 0.6, 0.8, 0.0]])
  mask = jnp.array([[1, 1, 1, 0]])
  rewards = gae.terminal_rewards(jnp.array([1.0]), mask)
  np.testing.assert_allclose(rewards, [[0, 0, 1, 0]])
  adv, ret = jax.jit(gae.gae)(values, rewards, mask, gamma=1.0, lam=0.5)
  np.testing.assert_allclose(adv, [[0.25, 0.3, 0.2, 0.0]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0.75, 0.9, 1.0, 0.0]], atol=1e-6)
  # gamma .9, lambda 1: A_t = .9^(2-t) * 1 - V_t.
  adv, _ = gae.gae(values, rewards, mask, gamma=0.9, lam=1.0)
  np.testing.assert_allclose(adv, [[0.81 - 0.5, 0.9 - 0.6, 1.0 - 0.8, 0.0]], atol=1e-6)


def test_lambda_one_and_zero_identities_with_prefix_and_padding():
  rng = np.random.default_rng(0)
  b, t = 6, 12
  values = rng.uniform(size=(b, t)).astype(np.float32)
  starts = rng.integers(0, 4, size=b)            # replayed prefix: mask 0 before the response
  ends = starts + rng.integers(1, 8, size=b)     # padding after it
  pos = np.arange(t)[None]
  mask = (pos >= starts[:, None]) & (pos < ends[:, None])
  final = rng.uniform(size=b).astype(np.float32)
  rewards = gae.terminal_rewards(final, mask)
  run = jax.jit(gae.gae)
  adv1, ret1 = run(values, rewards, mask, gamma=1.0, lam=1.0)
  # lambda = 1: R - V(s_t); returns are R on every token.
  np.testing.assert_allclose(adv1, np.where(mask, final[:, None] - values, 0), atol=1e-5)
  np.testing.assert_allclose(ret1, np.where(mask, final[:, None], 0), atol=1e-5)
  # lambda = 0: V(s_{t+1}) - V(s_t) inside, R - V(s_T) on the last token.
  adv0, _ = run(values, rewards, mask, gamma=1.0, lam=0.0)
  next_v = np.where(np.roll(mask, -1, axis=1) & (pos < t - 1), np.roll(values, -1, axis=1), 0.0)
  expected = np.where(mask, np.asarray(rewards) + next_v - values, 0.0)
  np.testing.assert_allclose(adv0, expected, atol=1e-5)
  # Any lambda, gamma: the loop reference on each row's episode.
  adv, _ = run(values, rewards, mask, gamma=0.95, lam=0.7)
  for i in range(b):
    s, e = starts[i], ends[i]
    expected = _reference_gae(values[i, s:e], np.asarray(rewards)[i, s:e], 0.95, 0.7)
    np.testing.assert_allclose(adv[i, s:e], expected, atol=1e-5)


def test_per_row_lambda():
  values = jnp.array([[0.5, 0.6, 0.8]] * 2)
  mask = jnp.ones((2, 3))
  rewards = gae.terminal_rewards(jnp.array([1.0, 1.0]), mask)
  adv, _ = gae.gae(values, rewards, mask, lam=jnp.array([0.5, 1.0]))
  np.testing.assert_allclose(adv, [[0.25, 0.3, 0.2], [0.5, 0.4, 0.2]], atol=1e-6)
  with pytest.raises(ValueError, match='per-row'):
    gae.gae(values, rewards, mask, lam=jnp.array([0.5, 1.0, 1.0]))
  with pytest.raises(ValueError, match=r'\[B, T\]'):
    gae.gae(values, rewards, jnp.ones((2, 4)))


def test_skip_observation_gae():
  # Model tokens at 0, 1, 4, 5; observation tokens at 2, 3 (their values must be ignored).
  values = jnp.array([[0.2, 0.4, 9.0, 9.0, 0.5, 0.7]])
  mask = jnp.array([[1, 1, 0, 0, 1, 1]])
  rewards = gae.terminal_rewards(jnp.array([1.0]), mask)
  adv, ret = jax.jit(gae.skip_observation_gae)(values, rewards, mask, gamma=1.0, lam=0.5)
  # Subsequence V = [.2, .4, .5, .7], R = 1: deltas [.2, .1, .2, .3];
  # A_4 = .3, A_3 = .2 + .5*.3 = .35, A_2 = .1 + .5*.35 = .275, A_1 = .2 + .5*.275 = .3375.
  np.testing.assert_allclose(adv, [[0.3375, 0.275, 0, 0, 0.35, 0.3]], atol=1e-6)
  np.testing.assert_allclose(ret, [[0.5375, 0.675, 0, 0, 0.85, 1.0]], atol=1e-6)
  # Plain GAE ends the chain at the observation instead: A_1 = 0 - .4, A_0 = .2 + .5 * -.4 = 0.
  adv_plain, _ = gae.gae(values, rewards, mask, gamma=1.0, lam=0.5)
  np.testing.assert_allclose(adv_plain[0, :2], [0.0, -0.4], atol=1e-6)
  # On contiguous masks the two agree.
  rng = np.random.default_rng(1)
  v = rng.uniform(size=(3, 7))
  m = np.arange(7)[None] < np.array([[3], [7], [5]])
  r = gae.terminal_rewards(rng.uniform(size=3), m)
  np.testing.assert_allclose(gae.skip_observation_gae(v, r, m, gamma=0.9, lam=0.8)[0],
                             gae.gae(v, r, m, gamma=0.9, lam=0.8)[0], atol=1e-6)


def test_adaptive_lambda():
  lam = gae.adaptive_lambda(jnp.array([0, 1, 2, 10, 1000]))
  np.testing.assert_allclose(lam, [0.0, 1 - 1 / 1.5, 1 - 1 / 3, 1 - 1 / 15, 1 - 1 / 1500],
                             rtol=1e-6)


def test_terminal_rewards_empty_row():
  out = gae.terminal_rewards(jnp.array([3.0, 2.0]), jnp.array([[0, 0, 0], [1, 1, 0]]))
  np.testing.assert_allclose(out, [[0, 0, 0], [0, 2, 0]])
