"""Decoding FLOPs: the compute axis every comparison is plotted against (AC2 paper, Appendix B).

One generation request has p prompt + replayed-prefix tokens and g new tokens. Its first new token
comes out of the prefill, so it costs m = max(g - 1, 0) decoding forwards, and

  F(p, g) = A m + B (m p + m (m + 1) / 2).

Derivation of A and B from a Qwen3 config (E hidden, F feed-forward, L layers, H query heads, K
key/value heads, D head dim, V vocabulary), counting a multiply-add as 2 FLOPs and only matmuls:

  A = 2 L (E*H*D  [q_proj] + 2*E*K*D  [k_proj, v_proj] + H*D*E  [o_proj] + 3*E*F  [gate, up, down])
      + 2 E V  [logits; counted whether or not the embedding is tied],
  B = 2 * 2 * H * D * L: per context position a decoding forward does q.k (H*D multiply-adds per
      layer) and p.v (H*D per layer); the forward at decode index j (1-based) sees p + j positions,
      so summing over j = 1..m gives B (m p + m (m + 1) / 2).

Qwen3-4B (E 2560, F 9728, L 36, H 32, K 8, D 128, V 151936) gives A = 8,044,544,000 and B = 589,824,
the paper's numbers (Eq. 6).
Not counted: prefill, critic and judge calls, validation, training, elementwise work.

Segments of one generation (in-flight rollouts, algorithms/inflight.py, generate a response in
calls of a few tokens, each continuing from prompt + the tokens so far): counted as the one whole
generation, F(p, g), never per call. Counted per call, a segment continuing after G new tokens
would be a request of p + G context tokens, F(p + G, g_s), whose first token comes out of that
call's prefill: each segment after the first would drop the decoding forward of its first token,
A + B (p + G), so a response cut into S segments would count S - 1 forwards fewer than the same
response generated at once (about 5% fewer for 50-70-token responses in 16-token segments). The
segment boundaries are where weight updates may land, not decoding work saved (the re-prefill
each one costs is real, uncounted work), so `continuation_flops` charges a segment
F(p, G + g_s) - F(p, G), and the segments of a response sum to F(p, g) exactly.
"""

from __future__ import annotations

import numpy as np

from ac2_jax.models.config import ModelConfig


def coefficients(config: ModelConfig) -> tuple[int, int]:
  """(A, B): decoding FLOPs per forward, and per forward per context position (module docstring)."""
  e, f, l = config.hidden_size, config.intermediate_size, config.num_layers
  h, k, d, v = config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size
  per_layer = e * h * d + 2 * e * k * d + h * d * e + 3 * e * f
  a = 2 * per_layer * l + 2 * e * v
  b = 2 * 2 * h * d * l
  return int(a), int(b)


def _check_nonnegative(name, x):
  if np.any(np.asarray(x) < 0):
    raise ValueError(f'{name} must be >= 0, got {x!r}')


def decoding_flops(config: ModelConfig, prompt_len, new_tokens):
  """Exact F(p, g) per request: Python ints in, Python int out; numpy arrays in, float64 out.

  Arrays come back as float64 because sums over a run (~1e20) overflow int64; each request's value
  is computed in int64 first, so it is exact up to 2**53 (~9e15 FLOPs, far above any single
  request).
  """
  _check_nonnegative('prompt_len', prompt_len)
  _check_nonnegative('new_tokens', new_tokens)
  a, b = coefficients(config)
  if isinstance(prompt_len, (int, np.integer)) and isinstance(new_tokens, (int, np.integer)):
    p, m = int(prompt_len), max(int(new_tokens) - 1, 0)
    return a * m + b * (m * p + m * (m + 1) // 2)
  p = np.asarray(prompt_len, np.int64)
  m = np.maximum(np.asarray(new_tokens, np.int64) - 1, 0)
  return (a * m + b * (m * p + m * (m + 1) // 2)).astype(np.float64)


def continuation_flops(config: ModelConfig, prompt_len, done, new_tokens):
  """Decoding FLOPs that `new_tokens` more tokens add to a generation of `done` new tokens after a
  prompt of `prompt_len`: F(p, done + new) - F(p, done), so a generation's segments sum to F(p, g)
  (module docstring). Ints or arrays, as `decoding_flops`."""
  _check_nonnegative('done', done)
  _check_nonnegative('new_tokens', new_tokens)
  if isinstance(done, (int, np.integer)) and isinstance(new_tokens, (int, np.integer)):
    return (decoding_flops(config, prompt_len, int(done) + int(new_tokens))
            - decoding_flops(config, prompt_len, int(done)))
  done = np.asarray(done, np.int64)
  return (decoding_flops(config, prompt_len, done + np.asarray(new_tokens, np.int64))
          - decoding_flops(config, prompt_len, done))


def total_decoding_flops(config: ModelConfig, prompt_lens, new_tokens) -> int:
  """Exact sum of F(p, g) over requests, as a Python int (no overflow)."""
  p = np.asarray(prompt_lens, np.int64).reshape(-1)
  g = np.asarray(new_tokens, np.int64).reshape(-1)
  if p.shape != g.shape:
    raise ValueError(f'prompt_lens and new_tokens differ in length: {p.shape} vs {g.shape}')
  return sum(decoding_flops(config, int(pi), int(gi)) for pi, gi in zip(p, g))


def mean_based_decoding_flops(config: ModelConfig, num_requests: int, mean_prompt_len: float,
                              mean_new_tokens: float) -> float:
  """The estimate used when only means are logged (paper Eq. 7):

    F^ = N (A m̄ + B (m̄ p̄ + (m̄^2 + m̄) / 2)),  with m̄ = max(ḡ - 1, 0).

  m̄ = ḡ - 1 assumes every request generated at least one token. With moments over the N
  requests, sum F - F^ = N B (Cov(m, p) + Var(m) / 2), which can have either sign.
  """
  if num_requests < 0 or mean_prompt_len < 0 or mean_new_tokens < 0:
    raise ValueError(f'mean_based_decoding_flops: arguments must be >= 0, got N={num_requests}, '
                     f'p={mean_prompt_len}, g={mean_new_tokens}')
  a, b = coefficients(config)
  m = max(float(mean_new_tokens) - 1.0, 0.0)
  p = float(mean_prompt_len)
  return float(num_requests) * (a * m + b * (m * p + (m * m + m) / 2.0))
