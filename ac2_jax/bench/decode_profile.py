"""Where a decode step's time goes: one `sampling.generate` call under the JAX profiler, each
executed XLA operation attributed to the source operation it came from.

  python launch/bench.py decode_profile [--config mini] [--batch 64] [--new_tokens 128]

The model and prompts are `bench.py sampler`'s (random weights, prompts of 32 ids, temperature
0.8, no stop token). After a warm-up call, one call is traced (`op_profile`: each executed XLA
operation is traced back to the JAX operation it came from) and its time put in one of the
groups below. Times inside the decode loop are divided by
its number of steps; the prefill (outside the loop) is reported as a whole.

  matmuls        the projections, the MLP and the vocabulary head
  attention      q.k and p.v over the cache, masking and softmax
  cache writes   writing the step's keys and values into the cache, and any copy of the cache
  model, other   norms, rotary embedding, residual adds, activation
  sampling       the sampling distribution, the draw, log-probs and entropies, the per-row keys,
                 writes into the output buffers, stop checks: the work that is not the model

The profile runs the operations the way they run in a real call (threads, fusion), so on shared
cores it is as noisy as any timing; read the shares rather than the milliseconds.
"""

from __future__ import annotations

import argparse
import collections
import os
import re

import jax
import numpy as np

from ac2_jax import models
from ac2_jax.bench import op_profile
from ac2_jax.bench import sampler as sampler_bench
from ac2_jax.sampling import decode, requests, sampler
from ac2_jax.sampling.settings import SamplingSettings

GROUPS = ('matmuls', 'attention', 'cache writes', 'model, other', 'sampling')


def group_of(op_name: str) -> str:
  """The group of one JAX operation of the decode loop body, from its HLO op_name."""
  if '/Decoder/' not in op_name and not op_name.startswith('Decoder/'):
    return 'sampling'
  if re.search(r'_proj/|lm_head/', op_name) or ('embed_tokens/' in op_name
                                                 and 'dot_general' in op_name):
    return 'matmuls'
  if '/self_attn/' in op_name:
    if re.search(r'scatter|dynamic_update_slice', op_name):
      return 'cache writes'
    if re.search(r'_norm/|/rope|/sin|/cos', op_name):
      return 'model, other'
    return 'attention'
  return 'model, other'


def random_inputs(config, batch: int, prompt_len: int, new_tokens: int):
  """(params, contexts, packed requests): random weights and `batch` prompts of `prompt_len`
  random ids, each asking for `new_tokens` (`bench.py sampler`'s model and prompts)."""
  params = models.init_params(config, jax.random.key(0))
  rng = np.random.RandomState(0)
  contexts = list(rng.randint(0, config.vocab_size, (batch, prompt_len)).astype(np.int32))
  packed = requests.pack(contexts, new_tokens, None, vocab_size=config.vocab_size,
                         max_total_len=config.max_position_embeddings)
  return params, contexts, packed


def profile(config, batch: int, prompt_len: int, new_tokens: int) -> dict:
  """{'loop': {group: seconds per step}, 'prefill': seconds, 'steps': decode steps}."""
  params, contexts, packed = random_inputs(config, batch, prompt_len, new_tokens)
  settings = SamplingSettings(temperature=0.8)
  call = lambda: sampler.generate(config, params, contexts, new_tokens, settings,
                                  jax.random.key(1), stop_ids=())
  call()
  hlo = decode.decode_batch.lower(
      params, jax.random.key(1), packed.contexts_BxP, packed.context_lengths_B, packed.caps_B,
      packed.row_ids_B, config=config, settings=settings, stop_ids=(),
      max_new=packed.max_new).compile().as_text()
  by_op, out = op_profile.traced_seconds(call, hlo)
  steps = int(out.num_new_N.max()) - 1  # the prefill draws the first token
  loop, prefill = collections.Counter(), 0.0
  for op, seconds in by_op.items():
    if '/while/body/' in op:
      loop[group_of(op.split('/while/body/', 1)[1])] += seconds / steps
    elif '/while/' not in op:  # the loop's own condition is left out
      prefill += seconds
  return {'loop': dict(loop), 'prefill': prefill, 'steps': steps}


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py decode_profile',
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='mini', choices=sorted(sampler_bench.CONFIGS))
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--prompt_len', type=int, default=32)
  parser.add_argument('--new_tokens', type=int, default=128)
  args = parser.parse_args(argv)
  result = profile(sampler_bench.CONFIGS[args.config], args.batch, args.prompt_len,
                   args.new_tokens)
  loop = result['loop']
  total = sum(loop.values())
  print(f'decode_profile: config {args.config}, batch {args.batch}, {args.new_tokens} new tokens; '
        f'{os.cpu_count()} CPUs, load average '
        + ' '.join(f'{x:.1f}' for x in os.getloadavg()))
  print(f'  one decode step: {total * 1e3:.2f} ms of XLA operations (mean of {result["steps"]})')
  for group in GROUPS:
    seconds = loop.get(group, 0.0)
    print(f'    {group:14s} {seconds * 1e3:7.2f} ms  {100 * seconds / total:5.1f}%')
  print(f'  prefill: {result["prefill"] * 1e3:.1f} ms')
