"""The machine's measured peaks and a model's minimal work: what achieved FLOP/s and bytes/s mean.

  peaks = measure_peaks()                       # a large jitted matmul, a large elementwise pass
  flops, nbytes = generate_cost(config, batch=64, prompt_len=32, new_tokens=128)
  print(fraction(flops / seconds, peaks.matmul_flops_per_s))

Work is counted as a model needs it, not as an engine happens to do it: matmul FLOPs only
(a multiply-add is 2), attention over the filled part of the cache, every weight read once per
forward, the KV cache read and written once per position. Activations, the sampling distribution
and padding are not counted, so an engine that pads or re-reads shows as a lower fraction of peak.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ac2_jax.bench.stopwatch import median_seconds
from ac2_jax.models.config import ModelConfig
from ac2_jax.rl import flops as flops_lib


@dataclasses.dataclass(frozen=True)
class Peaks:
  matmul_flops_per_s: float   # float32 [n, n] @ [n, n], jitted (the fastest call)
  copy_bytes_per_s: float     # x = x + 1 in place, float32: bytes read + written (fastest call)
  matmul_n: int
  copy_mib: int

  def describe(self) -> str:
    return (f'matmul {self.matmul_n}^3 f32 {self.matmul_flops_per_s / 1e9:.1f} GFLOP/s, '
            f'copy {self.copy_mib} MiB f32 (read + write) {self.copy_bytes_per_s / 1e9:.2f} GB/s')


def measure_peaks(matmul_n: int = 2048, copy_mib: int = 256, repeats: int = 10) -> Peaks:
  """The default device's best rate at a large matmul and at a memory-bound pass.

  Both are jitted and run once before timing; the fastest of `repeats` calls counts (a peak is
  what the machine can do; on shared cores the median mostly measures the neighbours). The
  copy is `x + 1` rather than a plain copy, which XLA could forward without touching memory; it
  reads and writes every byte once.
  """
  a = jax.random.normal(jax.random.key(0), (matmul_n, matmul_n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (matmul_n, matmul_n), jnp.float32)
  matmul = jax.jit(jnp.matmul)
  matmul(a, b).block_until_ready()
  _, seconds = median_seconds(lambda: matmul(a, b).block_until_ready(), repeats)
  matmul_rate = 2 * matmul_n**3 / min(seconds)

  # Donated, so each call writes into the buffer it read: a fresh 256 MiB output per call would
  # time the kernel's page faults instead (measured: 2 GB/s against 17-28 GB/s in place).
  add_one = jax.jit(lambda v: v + 1.0, donate_argnums=0)
  box = [add_one(jnp.zeros((copy_mib * 2**20 // 4,), jnp.float32))]

  def copy():
    box[0] = add_one(box[0])
    box[0].block_until_ready()

  copy()
  _, seconds = median_seconds(copy, repeats)
  return Peaks(matmul_rate, 2 * box[0].nbytes / min(seconds), matmul_n, copy_mib)


def num_params(config: ModelConfig) -> int:
  e, f, l = config.hidden_size, config.intermediate_size, config.num_layers
  h, k, d, v = config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size
  per_layer = e * h * d + 2 * e * k * d + h * d * e + 3 * e * f + 2 * e + 2 * d
  return l * per_layer + e + v * e * (1 if config.tie_embeddings else 2)


def weight_bytes(config: ModelConfig) -> int:
  """Bytes one forward reads of the weights: all of them, except an untied input embedding (a
  forward gathers a few of its rows; the head reads the whole output matrix)."""
  untied_embedding = 0 if config.tie_embeddings else config.vocab_size * config.hidden_size
  return (num_params(config) - untied_embedding) * np.dtype(config.param_dtype).itemsize


def kv_bytes_per_position(config: ModelConfig) -> int:
  return (2 * config.num_layers * config.num_kv_heads * config.head_dim
          * np.dtype(config.dtype).itemsize)


def generate_cost(config: ModelConfig, batch: int, prompt_len: int,
                  new_tokens: int) -> tuple[float, float]:
  """(FLOPs, bytes) of sampling `new_tokens` after `prompt_len` tokens for `batch` rows.

  The prefill runs the body over the prompt and the head at its last position (drawing token 1);
  each of the other new_tokens - 1 tokens is one decoding forward (`rl.flops.decoding_flops`).
  """
  a, b = flops_lib.coefficients(config)
  head = 2 * config.hidden_size * config.vocab_size
  p, m = prompt_len, max(new_tokens - 1, 0)
  prefill = (a - head) * p + head + b * p * (p + 1) // 2
  flops = batch * (prefill + flops_lib.decoding_flops(config, p, new_tokens))
  # The prefill writes p positions; decoding step j reads p + j - 1 and writes one.
  positions = p + m * p + m * (m + 1) // 2
  nbytes = (1 + m) * weight_bytes(config) + batch * positions * kv_bytes_per_position(config)
  return float(flops), float(nbytes)


def update_flops(config: ModelConfig, rows: int, length: int) -> float:
  """Matmul FLOPs of one gradient step on `rows` sequences of `length` tokens: the forward
  (body and head at every position, causal attention) and a backward of twice its cost."""
  a, b = flops_lib.coefficients(config)
  forward = a * length + b * length * (length + 1) // 2
  return float(3 * rows * forward)


def fraction(achieved: float, peak: float) -> str:
  return f'{100 * achieved / peak:5.1f}%'
