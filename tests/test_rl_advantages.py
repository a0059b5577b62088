"""Group advantage estimators (GRPO, RLOO, AC2), Li2SAO targets and PACT, against hand numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ac2_jax.rl import advantages, li2sao, pact


def test_grpo_hand_numbers_and_zero_sum():
  rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
  adv = jax.jit(advantages.grpo_advantages)(rewards)
  np.testing.assert_allclose(adv, [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0]], atol=1e-7)
  rng = np.random.default_rng(0)
  r = rng.uniform(size=(7, 5))
  mask = rng.uniform(size=(7, 5)) > 0.3
  for kwargs in ({}, {'normalize_std': True}):
    a = advantages.grpo_advantages(r, mask, **kwargs)
    np.testing.assert_allclose(np.asarray(a).sum(-1), 0.0, atol=1e-5)
    assert np.all(np.asarray(a)[~mask] == 0)


def test_grpo_std_normalisation_and_ragged_groups():
  # Group [1, 0, 0, 1]: mean 0.5, population std 0.5 -> +-1; sample std sqrt(1/3) -> +-0.866.
  r = jnp.array([[1.0, 0.0, 0.0, 1.0]])
  np.testing.assert_allclose(advantages.grpo_advantages(r, normalize_std=True, eps=0.0),
                             [[1, -1, -1, 1]])
  np.testing.assert_allclose(advantages.grpo_advantages(r, normalize_std=True, eps=0.0, std_ddof=1),
                             [[0.8660254, -0.8660254, -0.8660254, 0.8660254]], rtol=1e-6)
  # The last row is absent: mean over [1, 0, 0.5] = 0.5.
  adv = advantages.grpo_advantages(jnp.array([[1.0, 0.0, 0.5, 9.0]]), jnp.array([[1, 1, 1, 0]]))
  np.testing.assert_allclose(adv, [[0.5, -0.5, 0.0, 0.0]])
  with pytest.raises(ValueError, match='mask shape'):
    advantages.grpo_advantages(r, jnp.ones((1, 3)))
  with pytest.raises(ValueError, match=r'\[N, G\]'):
    advantages.grpo_advantages(jnp.ones(4))


def test_rloo():
  # R = [1, 0, 0, 1]: A_0 = 1 - mean(0, 0, 1) = 2/3; A_1 = 0 - 2/3.
  adv = jax.jit(advantages.rloo_advantages)(jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 3.0, 3.0]]),
                                             jnp.array([[1, 1, 1, 1], [1, 0, 0, 0]]))
  np.testing.assert_allclose(adv, [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0, 0, 0, 0]], rtol=1e-6)
  # RLOO = G / (G - 1) x GRPO on full groups.
  r = np.random.default_rng(1).uniform(size=(3, 6))
  np.testing.assert_allclose(advantages.rloo_advantages(r), 6 / 5 * advantages.grpo_advantages(r),
                             atol=1e-6)


def test_ac2_chunk_advantages_invalid_rules():
  # Row 0: one invalid, filled with mean(0.8, 0.2, 0.5) = 0.5; row 1: all invalid, filled with 0;
  # row 2: two rows absent.
  values = jnp.array([[0.8, 0.2, jnp.nan, 0.5], [0.3, 0.9, 0.1, 0.7], [0.4, 0.6, 0.0, 0.0]])
  valid = jnp.array([[1, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
  present = jnp.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
  adv, weights, filled = jax.jit(advantages.ac2_chunk_advantages)(values, valid, present)
  np.testing.assert_allclose(filled, [[0.8, 0.2, 0.5, 0.5], [0, 0, 0, 0], [0.4, 0.6, 0, 0]],
                             atol=1e-6)
  np.testing.assert_allclose(adv, [[0.3, -0.3, 0.0, 0.0], [0, 0, 0, 0], [-0.1, 0.1, 0, 0]],
                             atol=1e-6)
  np.testing.assert_array_equal(weights, [[1, 1, 0, 1], [0, 0, 0, 0], [1, 1, 0, 0]])
  assert np.all(np.isfinite(adv))


def test_ac2_critic_targets():
  # Row 0: 8 valid, mean 0.25 -> a tie, rounds down: 0.2; row 1: 7 valid only -> no target;
  # row 2: mean 0.66 -> 0.7.
  values = jnp.array([[0.2] * 4 + [0.3] * 4 + [0.0] * 8, [1.0] * 7 + [0.0] * 9, [0.66] * 16])
  valid = jnp.array([[1] * 8 + [0] * 8, [1] * 7 + [0] * 9, [1] * 16], bool)
  targets, has = jax.jit(advantages.ac2_critic_targets)(values, valid)
  np.testing.assert_allclose(targets, [0.2, 0.0, 0.7], atol=1e-6)
  np.testing.assert_array_equal(has, [True, False, True])
  targets, has = advantages.ac2_critic_targets(values, valid, min_valid=7)
  np.testing.assert_allclose(targets, [0.2, 1.0, 0.7], atol=1e-6)
  np.testing.assert_array_equal(has, [True, True, True])


def test_ac2_single_advantages():
  adv, weights, targets, has = jax.jit(advantages.ac2_single_advantages)(
      jnp.array([0.7, 0.3, 0.9, 0.45]), jnp.array([True, True, False, True]),
      jnp.array([0.5, 0.4, 0.1, 0.2]), jnp.array([True, False, True, True]))
  np.testing.assert_allclose(adv, [0.2, 0.0, 0.0, 0.25], atol=1e-6)
  np.testing.assert_array_equal(weights, [1, 0, 0, 1])
  np.testing.assert_allclose(targets, [0.7, 0.0, 0.0, 0.4], atol=1e-6)  # 0.45 is a tie: down
  np.testing.assert_array_equal(has, [True, False, False, True])


def test_to_tokens():
  out = advantages.to_tokens(jnp.array([2.0, -1.0]), jnp.array([[0, 1, 1], [1, 1, 0]]))
  np.testing.assert_allclose(out, [[0, 2, 2], [-1, -1, 0]])
  with pytest.raises(ValueError, match='does not match'):
    advantages.to_tokens(jnp.array([1.0]), jnp.ones((2, 3)))


def test_li2sao_actor_and_residual_targets():
  rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
  adv = jax.jit(li2sao.actor_advantages, static_argnames='eps')(rewards, eps=0.0)
  np.testing.assert_allclose(adv[0], [0.8660254, -0.8660254, -0.8660254, 0.8660254], rtol=1e-6)
  np.testing.assert_allclose(adv[1], 0.0)
  z, keep = jax.jit(li2sao.residual_targets)(rewards)
  np.testing.assert_allclose(z, [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0]])
  np.testing.assert_array_equal(keep, [[True] * 4, [False] * 4])  # identical rewards: dropped


def test_li2sao_divergence_mask():
  # Group of 3 responses (T = 6). 0 and 1 share 2 tokens; 0 and 2 share 4; 1 and 2 share 2.
  tokens = jnp.array([[[5, 6, 7, 8, 9, 0],
                       [5, 6, 1, 2, 0, 0],
                       [5, 6, 7, 8, 3, 4]]])
  lengths = jnp.array([[5, 4, 6]])
  # Position 3 of response 2 is an observation token.
  model = jnp.ones((1, 3, 6), bool).at[0, 2, 3].set(False)
  rewards = jnp.array([[1.0, 0.0, 0.0]])
  mask = jax.jit(li2sao.divergence_mask)(tokens, lengths, model, rewards)
  # d_0 = max(d(0,1)=2, d(0,2)=4) = 4; d_1 = d(1,0) = 2; d_2 = d(2,0) = 4.
  np.testing.assert_array_equal(mask[0], [[0, 0, 0, 0, 1, 0],
                                          [0, 0, 1, 1, 0, 0],
                                          [0, 0, 0, 0, 1, 1]])
  # No opposite outcome: only the last model token is kept.
  mask = li2sao.divergence_mask(tokens, lengths, model, jnp.array([[1.0, 1.0, 1.0]]))
  np.testing.assert_array_equal(mask[0], [[0, 0, 0, 0, 1, 0],
                                          [0, 0, 0, 1, 0, 0],
                                          [0, 0, 0, 0, 0, 1]])
  # Identical text, different outcomes: d falls past the end, so the last model token is kept.
  same = jnp.array([[[5, 6, 7], [5, 6, 7]]])
  mask = li2sao.divergence_mask(same, jnp.array([[3, 3]]), jnp.ones((1, 2, 3), bool),
                                jnp.array([[1.0, 0.0]]))
  np.testing.assert_array_equal(mask[0], [[0, 0, 1], [0, 0, 1]])


def test_li2sao_ranking_and_readiness_statistics():
  rewards = jnp.array([[1.0, 0.0, 0.5]])
  pairs = jax.jit(li2sao.ranking_pairs)(rewards)
  np.testing.assert_array_equal(pairs[0], [[0, 1, 1], [0, 0, 0], [0, 1, 0]])
  values = jnp.array([[0.4, -0.3, 0.5]])   # orders (0,1) and (2,1) right, (0,2) wrong
  np.testing.assert_allclose(jax.jit(li2sao.ranking_accuracy)(values, pairs), 2 / 3, rtol=1e-6)
  z, keep = li2sao.residual_targets(rewards)
  np.testing.assert_allclose(li2sao.explained_variance(z, z, keep), 1.0)
  np.testing.assert_allclose(li2sao.explained_variance(z, jnp.zeros_like(z), keep), 0.0, atol=1e-6)
  # Var(Z) = 1/6 (Z = [.5, -.5, 0]); residual Z - V = [.1, -.2, -.5], Var = 0.06.
  np.testing.assert_allclose(jax.jit(li2sao.explained_variance)(z, values, keep),
                             1 - 0.06 / (1 / 6), rtol=1e-5)


def test_pact_advantages_and_targets():
  adv = jax.jit(pact.advantages)(jnp.array([1.0, 0.0]),
                                 jnp.array([[0.2, 0.5, 0.9], [0.3, 0.1, 0.0]]),
                                 jnp.array([[1, 1, 1], [1, 1, 0]]))
  np.testing.assert_allclose(adv, [[0.8, 0.5, 0.1], [-0.3, -0.1, 0.0]], atol=1e-6)
  new = jnp.log(jnp.array([[0.5, 0.9, 0.7]]))
  old = jnp.log(jnp.array([[0.25, 0.1, 0.7]]))   # rho = 2, 9 (> 6: masked), 1
  targets, keep = jax.jit(pact.critic_targets)(new, old, jnp.array([0.5]), jnp.array([[1, 1, 1]]))
  np.testing.assert_allclose(targets, [[1.0, 0.0, 0.5]], rtol=1e-5)
  np.testing.assert_array_equal(keep, [[True, False, True]])


def test_zero_variance_share():
  from ac2_jax.rl.advantages import zero_variance_share
  # Two of three groups of several values are all equal; the single is left out.
  assert zero_variance_share([[0.5, 0.5, 0.5], [0.0, 1.0], [1 / 7, 1 / 7], [0.3]]) == 2 / 3
  assert zero_variance_share([[0.2]]) is None and zero_variance_share([]) is None
  assert zero_variance_share(np.array([[0.1, 0.2], [0.3, 0.3]])) == 0.5
