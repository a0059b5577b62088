"""Worker process of `bench.py sampler` for our sampler (and the machine's peaks): see spawn.py.

  python -m ac2_jax.bench.sampler_jax '{"task": "throughput", ...}' RESULT.json

Tasks:
  peaks       the machine's matmul and copy rates (`roofline.measure_peaks`)
  logits      first-token logits of the prompts (the prefill `generate` runs), saved as .npy
  throughput  `sampling.generate` at each batch size: one warm-up call (it compiles), then
              `repeats` timed calls; at the largest batch also a `chunk`-token call on the same
              prompts (what AC2 pays per chunk)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ac2_jax import models
from ac2_jax.bench import roofline, spawn, stopwatch
from ac2_jax.models import qwen3
from ac2_jax.sampling import decode, requests, sampler
from ac2_jax.sampling.settings import SamplingSettings


def peaks() -> dict:
  p = roofline.measure_peaks()
  return {'matmul_flops_per_s': p.matmul_flops_per_s, 'copy_bytes_per_s': p.copy_bytes_per_s,
          'matmul_n': p.matmul_n, 'copy_mib': p.copy_mib, 'jax': jax.__version__}


@functools.partial(jax.jit, static_argnames=('config', 'max_new'))
def _prefill_logits(params, contexts_BxP, lengths_B, *, config, max_new: int):
  """The logits of token 1 as `decode.decode_batch` computes them: a prefill into its cache."""
  B, P = contexts_BxP.shape
  shapes = dict(zip(('k', 'v'), qwen3.layer_cache_shapes(config, B, P + max_new)))
  cache = {name: tuple(jnp.zeros(shape, config.jnp_dtype) for _ in range(config.num_layers))
           for name, shape in shapes.items()}
  hidden_BxPxE, _ = qwen3.forward(config, params, contexts_BxP, cache=cache, lengths_B=lengths_B,
                                  output='hidden')
  return qwen3.head_logits(config, params, decode.last_hidden(hidden_BxPxE, lengths_B))


def logits(checkpoint: str, prompts: str, new_tokens: int, out: str) -> dict:
  config, params = models.load_hf_checkpoint(checkpoint)
  prompts_NxP = np.load(prompts)
  packed = requests.pack(list(prompts_NxP), new_tokens, None, vocab_size=config.vocab_size,
                         max_total_len=config.max_position_embeddings)
  logits_BxV = _prefill_logits(params, packed.contexts_BxP, packed.context_lengths_B,
                               config=config, max_new=packed.max_new)
  np.save(out, np.asarray(logits_BxV)[:packed.num_rows])
  return {'path': out}


def _timed_generate(config, params, contexts, new_tokens: int, settings, repeats: int) -> dict:
  """Warm-up (compiles), then `repeats` timed calls of the host API, prefill and transfers in."""
  call = lambda: sampler.generate(config, params, contexts, new_tokens, settings,
                                  jax.random.key(1), stop_ids=())
  warmup, _ = stopwatch.median_seconds(call, 1)
  compiled = decode.trace_count()
  median, seconds = stopwatch.median_seconds(call, repeats)
  assert decode.trace_count() == compiled, 'a timed call compiled: the warm-up missed its shape'
  out = call()
  assert int(out.num_new_N.min()) == new_tokens, 'a row stopped early'
  return {'median': median, 'seconds': seconds, 'warmup': warmup}


def throughput(checkpoint: str, prompts: str, batches: list[int], new_tokens: int,
               temperature: float, repeats: int, chunk: int) -> dict:
  config, params = models.load_hf_checkpoint(checkpoint)
  prompts_NxP = np.load(prompts)
  settings = SamplingSettings(temperature=temperature)
  runs = {}
  for batch in batches:
    contexts = list(prompts_NxP[:batch])
    runs[str(batch)] = _timed_generate(config, params, contexts, new_tokens, settings, repeats)
    if chunk and batch == max(batches):
      runs[str(batch)]['chunk'] = _timed_generate(config, params, contexts, chunk, settings,
                                                  repeats)
  return {'engine': f'ac2_jax sampling.generate (jax {jax.__version__})', 'runs': runs}


if __name__ == '__main__':
  spawn.serve({'peaks': peaks, 'logits': logits, 'throughput': throughput})
