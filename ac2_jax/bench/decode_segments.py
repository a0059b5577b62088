"""A long generation with the KV cache grown in segments against the whole cache from the start.

  python launch/bench.py decode_segments [--config mini] [--batch 8] [--prompt_len 32]
      [--new_tokens 2048] [--repeats 3]

`sampling.decode` grows the cache in segments (P + 256 slots, then doubling up to P + C), so that
attention reads the slots a generation has reached rather than all P + C of them. This times one
`decode_batch` call both ways on `bench.py sampler`'s model and prompts (random weights, no stop
token: every row runs to C), the two calls alternating after a compile of each; it checks that
both drew the same tokens, and prints tokens/s and the ratio.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np

from ac2_jax.bench import decode_profile
from ac2_jax.bench import sampler as sampler_bench
from ac2_jax.sampling import decode
from ac2_jax.sampling.settings import SamplingSettings


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py decode_segments',
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='mini', choices=sorted(sampler_bench.CONFIGS))
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--prompt_len', type=int, default=32)
  parser.add_argument('--new_tokens', type=int, default=2048)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args(argv)
  config = sampler_bench.CONFIGS[args.config]
  params, _, packed = decode_profile.random_inputs(config, args.batch, args.prompt_len,
                                                   args.new_tokens)
  inputs = (params, jax.random.key(1), packed.contexts_BxP, packed.context_lengths_B,
            packed.caps_B, packed.row_ids_B)
  variants = {'whole cache': 0, 'segments': decode.FIRST_SEGMENT_TOKENS}
  print(f'decode_segments: config {args.config}, batch {args.batch}, prompts of '
        f'{args.prompt_len}, {args.new_tokens} new tokens (cache P + {packed.max_new} slots; '
        f'segments {decode.segment_ends(packed.max_new)}); {os.cpu_count()} CPUs, load average '
        + ' '.join(f'{x:.1f}' for x in os.getloadavg()))

  def call(first):
    return jax.block_until_ready(decode.decode_batch(
        *inputs, config=config, settings=SamplingSettings(temperature=0.8), stop_ids=(),
        max_new=packed.max_new, first_segment=first))

  outputs, seconds = {}, {name: [] for name in variants}
  for name, first in variants.items():
    start = time.perf_counter()
    outputs[name] = call(first)
    print(f'  {name}: compile + first call {time.perf_counter() - start:.1f} s')
  for _ in range(args.repeats):
    for name, first in variants.items():
      start = time.perf_counter()
      call(first)
      seconds[name].append(time.perf_counter() - start)
  same = np.array_equal(*(np.asarray(out[0]) for out in outputs.values()))
  tokens = int(np.asarray(outputs['segments'][3]).sum())
  for name in variants:
    median = float(np.median(seconds[name]))
    print(f'  {name:12s} {tokens / median:9.0f} tokens/s  (median of '
          + '/'.join(f'{s:.2f}' for s in seconds[name]) + ' s)')
  ratio = np.median(seconds['whole cache']) / np.median(seconds['segments'])
  print(f'  segments / whole cache: {ratio:.2f}x the tokens/s; same tokens: {same}')
  print('load average at the end ' + ' '.join(f'{x:.1f}' for x in os.getloadavg()))
