"""Decoding FLOPs: the paper's Qwen3-4B coefficients, hand numbers, the mean-estimate identity, and
the segments of one in-flight generation."""

from fractions import Fraction

import numpy as np
import pytest

from ac2_jax.models.config import get_config
from ac2_jax.rl import flops


def test_qwen3_4b_coefficients_match_the_paper():
  assert flops.coefficients(get_config('qwen3_4b')) == (8_044_544_000, 589_824)


def test_coefficients_by_hand_for_tiny():
  c = get_config('tiny')  # E 128, F 512, L 4, H 4, K 2, D 32, V 512
  per_layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 512
  assert flops.coefficients(c) == (2 * 4 * per_layer + 2 * 128 * 512, 4 * 4 * 32 * 4)


def test_decoding_flops_hand_numbers_ints_and_arrays():
  c = get_config('qwen3_4b')
  a, b = flops.coefficients(c)
  # p = 100, g = 4: m = 3 forwards seeing 101, 102, 103 positions: A*3 + B*(300 + 6).
  assert flops.decoding_flops(c, 100, 4) == a * 3 + b * 306
  assert flops.decoding_flops(c, 100, 1) == 0 and flops.decoding_flops(c, 100, 0) == 0
  assert isinstance(flops.decoding_flops(c, np.int64(7), 3), int)
  out = flops.decoding_flops(c, np.array([100, 5, 40_000]), np.array([4, 0, 10_000]))
  assert out.dtype == np.float64
  long_request = a * 9_999 + b * (9_999 * 40_000 + 9_999 * 10_000 // 2)
  np.testing.assert_array_equal(out, [a * 3 + b * 306, 0, long_request])
  with pytest.raises(ValueError, match='new_tokens'):
    flops.decoding_flops(c, 3, -1)
  with pytest.raises(ValueError, match='differ in length'):
    flops.total_decoding_flops(c, [1, 2], [3])


def test_mean_estimate_differs_by_exactly_nb_cov_plus_half_var():
  c = get_config('qwen3_4b')
  _, b = flops.coefficients(c)
  rng = np.random.default_rng(0)
  n = 257
  p = rng.integers(50, 40_000, size=n)
  # Correlated with p; every request emits at least one token.
  g = rng.integers(1, 10_001, size=n) + (p // 10)
  total = flops.total_decoding_flops(c, p, g)
  m = g - 1
  # Exact moments with denominator N, in rationals.
  mean_m, mean_p = Fraction(int(m.sum()), n), Fraction(int(p.sum()), n)
  cov = sum(Fraction(int(mi)) * int(pi) for mi, pi in zip(m, p)) / n - mean_m * mean_p
  var = sum(Fraction(int(mi)) ** 2 for mi in m) / n - mean_m ** 2
  a, _ = flops.coefficients(c)
  estimate_exact = n * (a * mean_m + b * (mean_m * mean_p + (mean_m ** 2 + mean_m) / 2))
  assert total - estimate_exact == n * b * (cov + var / 2)
  # The float implementation agrees with the rational estimate to float precision.
  estimate = flops.mean_based_decoding_flops(c, n, float(p.mean()), float(g.mean()))
  assert abs(estimate - float(estimate_exact)) <= 1e-9 * float(estimate_exact)
  assert abs((total - estimate) - float(n * b * (cov + var / 2))) <= 1e-9 * total


def test_segments_of_one_generation_count_it_whole():
  """An in-flight response of g = 37 tokens after p = 100, generated in segments of 16, 16, 5:
  its segments sum to F(p, g). Counted per call instead (each segment a request of p + G context
  tokens), every segment after the first would drop its first token's decoding forward,
  A + B (p + G): here two forwards fewer."""
  c = get_config('qwen3_4b')
  a, b = flops.coefficients(c)
  p, segments = 100, [16, 16, 5]
  starts = np.cumsum([0] + segments[:-1])             # G before each segment: 0, 16, 32
  whole = flops.decoding_flops(c, p, sum(segments))
  assert sum(flops.continuation_flops(c, p, int(g0), n) for g0, n in zip(starts, segments)) == whole
  per_call = sum(flops.decoding_flops(c, p + int(g0), n) for g0, n in zip(starts, segments))
  assert whole - per_call == (a + b * (p + 16)) + (a + b * (p + 32))
  # Arrays (one entry per rollout of a call), an empty segment, and a first segment.
  out = flops.continuation_flops(c, np.array([100, 100, 7]), np.array([16, 3, 0]),
                                 np.array([16, 0, 4]))
  assert out.dtype == np.float64
  np.testing.assert_array_equal(out, [flops.decoding_flops(c, 100, 32) -
                                      flops.decoding_flops(c, 100, 16), 0,
                                      flops.decoding_flops(c, 7, 4)])
  with pytest.raises(ValueError, match='done'):
    flops.continuation_flops(c, 3, -1, 2)
