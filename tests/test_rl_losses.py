"""Policy losses (PPO + dual clip, DIS, truncated IS), critic losses and entropy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax.rl import critic_loss, entropy, policy_loss


def _ppo(logp, old, adv, mask, **kw):
  return policy_loss.ppo_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv),
                              jnp.asarray(mask), **kw)


def test_ppo_hand_numbers():
  ratio = np.array([[1.5, 0.5, 5.0, 0.5, 1.1, 7.0]])
  adv = np.array([[1.0, -1.0, -1.0, 1.0, 2.0, 5.0]])
  mask = np.array([[1, 1, 1, 1, 1, 0]])
  loss_sum, count, sums = jax.jit(policy_loss.ppo_loss)(jnp.log(ratio), jnp.zeros((1, 6)), adv,
                                                        mask)
  # Per token: max(-1.5, -1.28) = -1.28 (clipped); max(.5, .8) = .8 (clipped); max(5, 1.28) = 5 ->
  # dual clip 3; max(-.5, -.8) = -.5; max(-2.2, -2.2) = -2.2; masked token ignored.
  np.testing.assert_allclose(loss_sum, -1.28 + 0.8 + 3.0 - 0.5 - 2.2, rtol=1e-5)
  assert count == 5
  metrics = policy_loss.finalize_metrics(sums, count)
  np.testing.assert_allclose(metrics['clip_frac'], 2 / 5)
  np.testing.assert_allclose(metrics['dual_clip_frac'], 1 / 5)
  np.testing.assert_allclose(metrics['ratio'], (1.5 + 0.5 + 5 + 0.5 + 1.1) / 5, rtol=1e-6)
  k3 = ratio[0, :5] - 1 - np.log(ratio[0, :5])
  np.testing.assert_allclose(metrics['approx_kl'], k3.mean(), rtol=1e-5)
  # Without dual clip, token 3 costs 5.
  loss_nodual, _, _ = _ppo(jnp.log(ratio), jnp.zeros((1, 6)), adv, mask, dual_clip=None)
  np.testing.assert_allclose(loss_nodual, -1.28 + 0.8 + 5.0 - 0.5 - 2.2, rtol=1e-5)
  # eps_high as a traced value: no recompilation needed, different clip.
  loss_hi, _, _ = jax.jit(policy_loss.ppo_loss)(jnp.log(ratio), jnp.zeros((1, 6)), adv, mask,
                                                eps_high=jnp.float32(0.6))
  np.testing.assert_allclose(loss_hi, -1.5 + 0.8 + 3.0 - 0.5 - 2.2, rtol=1e-5)


def test_ppo_gradients_vanish_where_clipped_and_dual_clip_bounds_negative_advantages():
  rng = np.random.default_rng(0)
  logp = rng.normal(size=(4, 32)).astype(np.float32)
  old = (logp + rng.normal(scale=0.8, size=logp.shape)).astype(np.float32)
  adv = rng.normal(size=logp.shape).astype(np.float32)
  mask = np.ones_like(logp)

  def per_token(lp):
    cell = lambda x, i, j: x[i:i + 1, j:j + 1]
    return jnp.stack([
        policy_loss.ppo_loss(cell(lp, i, j), cell(old, i, j), cell(adv, i, j), cell(mask, i, j))[0]
        for i in range(2) for j in range(8)])

  losses = np.asarray(per_token(jnp.asarray(logp)))
  a, ratio = adv[:2, :8].reshape(-1), np.exp(logp - old)[:2, :8].reshape(-1)
  neg = a < 0
  assert np.all(losses[neg] <= -3.0 * a[neg] + 1e-6)
  np.testing.assert_allclose(losses[neg & (ratio > 3.0)], -3.0 * a[neg & (ratio > 3.0)], rtol=1e-5)
  grad = jax.grad(lambda lp: policy_loss.ppo_loss(lp, old, adv, mask)[0])(jnp.asarray(logp))
  r_all = np.exp(logp - old)
  clipped = ((adv > 0) & (r_all > 1.28)) | ((adv < 0) & (r_all < 0.8)) | ((adv < 0) & (r_all > 3.0))
  assert clipped.any() and (~clipped).any()
  np.testing.assert_array_equal(np.asarray(grad)[clipped], 0.0)
  # Unclipped: d(-A rho)/d logp = -A rho.
  np.testing.assert_allclose(np.asarray(grad)[~clipped], (-adv * r_all)[~clipped], rtol=1e-4)


def test_ppo_accumulation_is_exact_and_padding_cannot_leak_nan():
  rng = np.random.default_rng(1)
  logp = rng.normal(size=(6, 10)).astype(np.float32)
  old = logp + rng.normal(scale=0.3, size=logp.shape).astype(np.float32)
  adv = rng.normal(size=logp.shape).astype(np.float32)
  mask = (rng.uniform(size=logp.shape) > 0.3).astype(np.float32)
  whole_sum, whole_count, _ = _ppo(logp, old, adv, mask)
  parts = [_ppo(logp[s], old[s], adv[s], mask[s]) for s in (slice(0, 1), slice(1, 6))]
  np.testing.assert_allclose(whole_sum / whole_count,
                             sum(p[0] for p in parts) / sum(p[1] for p in parts), rtol=1e-6)
  bad_logp = np.where(mask > 0, logp, np.inf)
  bad_old = np.where(mask > 0, old, np.nan)
  loss, _, _ = _ppo(bad_logp, bad_old, adv, mask)
  np.testing.assert_allclose(loss, whole_sum, rtol=1e-6)
  grad = jax.grad(lambda lp: policy_loss.ppo_loss(lp, bad_old, adv, mask)[0])(jnp.asarray(bad_logp))
  assert np.all(np.isfinite(grad))
  with pytest.raises(ValueError, match='share one'):
    _ppo(logp, old[:, :3], adv, mask)


def test_truncated_importance_weights():
  w = policy_loss.truncated_is_weights(jnp.log(jnp.array([[0.5, 0.9]])),
                                       jnp.log(jnp.array([[0.25, 0.9]])), cap=1.5)
  np.testing.assert_allclose(w, [[1.5, 1.0]], rtol=1e-6)
  loss, _, _ = _ppo(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)),
                    is_weights_BxT=w)
  np.testing.assert_allclose(loss, -2.5, rtol=1e-6)


def test_dis_hand_numbers_and_zero_gradient_outside_band():
  ratio = jnp.array([[0.5, 0.8, 2.0, 6.5, 0.65]])
  adv = jnp.array([[1.0, 1.0, -1.0, 1.0, 1.0]])
  mask = jnp.ones((1, 5))
  loss, count, sums = jax.jit(policy_loss.dis_loss)(jnp.log(ratio), jnp.zeros((1, 5)), adv, mask)
  # Inside (0.7, 6.0): tokens 1 and 2.
  np.testing.assert_allclose(loss, -0.8 + 2.0, rtol=1e-6)
  assert count == 5
  np.testing.assert_allclose(sums['masked_frac'], 3.0)
  grad = jax.grad(
      lambda lp: policy_loss.dis_loss(lp, jnp.zeros((1, 5)), adv, mask)[0])(jnp.log(ratio))
  np.testing.assert_allclose(grad, [[0.0, -0.8, 2.0, 0.0, 0.0]], rtol=1e-6)
  loss_code, _, _ = policy_loss.dis_loss(jnp.log(ratio), jnp.zeros((1, 5)), adv, mask,
                                         ratio_low=0.2, ratio_high=4.0)
  np.testing.assert_allclose(loss_code, -0.5 - 0.8 + 2.0 - 0.65, atol=1e-6)


def test_value_nll_loss():
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.5, 1.0], [0.1, 0.1, 0.1, 0.1], [0.9, 0.9, 0.9, 0.9]]))
  target_mask = jnp.array([[1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]])
  weights = jnp.array([0.5, 1.0, 1.0])
  loss_sum, records = jax.jit(critic_loss.value_nll_loss)(logp, target_mask, weights)
  nll0 = -(np.log(0.5) + np.log(0.25) + np.log(0.5))
  nll1 = -2 * np.log(0.1)
  np.testing.assert_allclose(loss_sum, 0.5 * nll0 / 4 + 1.0 * nll1 / 4, rtol=1e-6)
  assert records == 2   # the third row has no target tokens
  with pytest.raises(ValueError, match='value_nll_loss'):
    critic_loss.value_nll_loss(logp, target_mask, jnp.ones(2))


def test_clipped_value_loss():
  values = jnp.array([[0.5, 0.9, 0.1]])
  old = jnp.array([[0.4, 0.5, 0.2]])
  returns = jnp.array([[1.0, 1.0, 0.0]])
  loss_sum, count = jax.jit(critic_loss.clipped_value_loss)(values, old, returns,
                                                            jnp.array([[1, 1, 0]]))
  # Token 0: V=.5 unclipped (|.1| < .2): .25. Token 1: V=.9, clipped .7: max(.01, .09) = .09.
  np.testing.assert_allclose(loss_sum, 0.25 + 0.09, rtol=1e-5)
  assert count == 2
  grad = jax.grad(
      lambda v: critic_loss.clipped_value_loss(v, old, returns, jnp.ones((1, 3)))[0])(values)
  np.testing.assert_allclose(grad, [[2 * (0.5 - 1.0), 0.0, 2 * 0.1]], atol=1e-6)


def test_ranking_hinge_loss():
  values = jnp.array([[0.3, 0.25, 0.0]])
  pairs = jnp.array([[[0, 1, 1], [0, 0, 0], [0, 0, 0]]], bool)
  loss_sum, count = jax.jit(critic_loss.ranking_hinge_loss)(values, pairs)
  # (0 over 1): [.1 - .3 + .25]_+ = .05; (0 over 2): [.1 - .3 + 0]_+ = 0.
  np.testing.assert_allclose(loss_sum, 0.05, rtol=1e-5)
  assert count == 2


def test_soft_bce_loss():
  z = jnp.array([[-2.0, 0.0, 3.0, 50.0]])
  y = jnp.array([[0.2, 0.5, 1.0, 2.0]])
  mask = jnp.array([[1, 1, 1, 0]])
  loss_sum, count = jax.jit(critic_loss.soft_bce_loss)(z, y, mask)
  p = 1 / (1 + np.exp(-np.array([-2.0, 0.0, 3.0])))
  yy = np.array([0.2, 0.5, 1.0])
  np.testing.assert_allclose(loss_sum, np.sum(-yy * np.log(p) - (1 - yy) * np.log(1 - p)),
                             rtol=1e-5)
  assert count == 3
  grad = jax.grad(lambda zz: critic_loss.soft_bce_loss(zz, y, jnp.ones((1, 4)))[0])(z)
  np.testing.assert_allclose(grad, jax.nn.sigmoid(z) - y, atol=1e-6)   # y = 2 > 1 is allowed


def test_entropy_and_token_logprobs():
  logits = jnp.array([[[0.0, 0.0, 0.0, 0.0], [2.0, 0.0, -jnp.inf, 0.0]]])
  h = jax.jit(entropy.entropy_from_logits)(logits, 1.0)
  p = np.exp([2.0, 0.0, 0.0]) / np.exp([2.0, 0.0, 0.0]).sum()
  np.testing.assert_allclose(h, [[np.log(4.0), -(p * np.log(p)).sum()]], rtol=1e-6)
  # Temperature 2 halves the logits.
  p2 = np.exp([1.0, 0.0, 0.0]) / np.exp([1.0, 0.0, 0.0]).sum()
  np.testing.assert_allclose(entropy.entropy_from_logits(logits, 2.0)[0, 1],
                             -(p2 * np.log(p2)).sum(), rtol=1e-6)
  # Temperature -> 0 drives the entropy of a peaked row towards 0.
  assert entropy.entropy_from_logits(logits, 0.05)[0, 1] < 1e-6
  lp = jax.jit(entropy.token_logprobs)(logits, jnp.array([[3, 0]]), 2.0)
  np.testing.assert_allclose(lp, [[np.log(0.25), np.log(p2[0])]], rtol=1e-6)
  # A vocabulary padded past its 3 tokens: the 4th row leaves the support, as in the sampler.
  np.testing.assert_allclose(entropy.token_logprobs(logits, jnp.array([[2, 3]]), 1.0, 3),
                             [[np.log(1 / 3), -np.inf]], rtol=1e-6)
  q = p[:2] / p[:2].sum()
  np.testing.assert_allclose(entropy.entropy_from_logits(logits, 1.0, 3)[0],
                             [np.log(3.0), -(q * np.log(q)).sum()], rtol=1e-6)
  with pytest.raises(ValueError, match='exceeds the 4 vocabulary rows'):
    entropy.token_logprobs(logits, jnp.array([[2, 3]]), 1.0, 5)
  np.testing.assert_allclose(
      entropy.masked_mean(jnp.array([[1.0, 3.0, 100.0]]), jnp.array([[1, 1, 0]])), 2.0)
  with pytest.raises(ValueError, match='temperature'):
    entropy.entropy_from_logits(logits, 0.0)
  with pytest.raises(ValueError, match='do not match'):
    entropy.token_logprobs(logits, jnp.zeros((1, 3), jnp.int32))
