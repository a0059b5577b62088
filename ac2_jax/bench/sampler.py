"""Sampler throughput: our decoder vs a naive full-recompute loop vs transformers `generate`.

  python launch/bench.py sampler [--preset small] [--batch 64] [--new_tokens 256]
      [--prompt_len 32] [--chunk 32] [--long 128] [--skip_hf]

All three sample the same random-weight model (temperature 1, no top-k/top-p, no stop token, so
every row generates exactly `new_tokens`), from the same ragged prompts (lengths uniform in
[prompt_len / 2, prompt_len]). Compilation is excluded: each jitted shape is run once before timing.

- ours: `ac2_jax.sampling.generate` (prefill, then the `lax.while_loop` decoder over a KV cache).
- naive: each new token recomputes a full forward pass over the whole sequence so far (jitted per
  length bucket). One step is timed per bucket and weighted by its number of steps (the step cost
  depends only on the bucket), which keeps the bench within minutes.
- transformers: `Qwen3ForCausalLM.generate` (torch CPU, fp32, left padding, KV cache) on the same
  weights exported with `save_hf_checkpoint`; skipped when torch/transformers do not import.

Also: the time of a `chunk`-token continuation relative to `long` new tokens on the same prefixes,
prefill included (the cost AC2 pays per chunk vs a longer rollout).
Goals: ours >= 10x naive, >= 1.5x transformers, chunk/long <= 1/3.

Run time on 2 shared CPU cores: about 9 minutes with the defaults (transformers about 5.5, the naive
step times about 2); `--skip_hf` or a smaller `--batch`/`--new_tokens` for a quick run.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from ac2_jax import models
from ac2_jax.models import qwen3
from ac2_jax.sampling import decode, distribution, requests, sampler
from ac2_jax.sampling.settings import SamplingSettings

SETTINGS = SamplingSettings(temperature=1.0)


def _warm_up(config, params, contexts, caps) -> None:
  """Compiles `generate`'s executable for these requests while decoding a single token per row."""
  packed = requests.pack(contexts, caps, None, vocab_size=config.vocab_size,
                         max_total_len=config.max_position_embeddings)
  out = decode.decode_batch(params, jax.random.key(0), packed.contexts_BxP,
                            packed.context_lengths_B, np.ones_like(packed.caps_B),
                            packed.row_ids_B, config=config, settings=SETTINGS, stop_ids=(),
                            max_new=packed.max_new, mesh=None)
  jax.block_until_ready(out)


def _time_ours(config, params, contexts, new_tokens: int, key) -> float:
  _warm_up(config, params, contexts, new_tokens)
  compiled = decode.trace_count()
  start = time.perf_counter()
  out = sampler.generate(config, params, contexts, new_tokens, SETTINGS, key, stop_ids=())
  elapsed = time.perf_counter() - start
  assert int(out.num_new_N.min()) == new_tokens
  assert decode.trace_count() == compiled, 'the timed call compiled: warm-up missed its shape'
  return elapsed


@functools.partial(jax.jit, static_argnames=('config',))
def _naive_next(params, tokens_BxT, lengths_B, keys_B, *, config):
  hidden_BxTxE, _ = qwen3.forward(config, params, tokens_BxT, lengths_B=lengths_B,
                                  output='hidden')
  logits_BxV = qwen3.head_logits(config, params, decode.last_hidden(hidden_BxTxE, lengths_B))
  return distribution.draw(keys_B, distribution.sampling_log_probs(logits_BxV, SETTINGS), False)


def _time_naive(config, params, contexts, new_tokens: int, key) -> float:
  """Seconds the full-recompute loop needs for `new_tokens` tokens (compilation excluded).

  The loop's step t runs one forward over a batch padded to width bucket(longest + t), and its
  cost depends only on that width. So one step is timed per width the loop meets, weighted by
  the number of steps at that width.
  """
  B = len(contexts)
  longest = max(len(c) for c in contexts)
  widths = collections.Counter(requests.bucket(longest + t) for t in range(new_tokens))
  rng = np.random.RandomState(1)
  keys_B = jax.random.split(key, B)
  total = 0.0
  for width, steps in sorted(widths.items()):
    tokens_BxT = jnp.asarray(rng.randint(0, config.vocab_size, (B, width)), jnp.int32)
    lengths_B = jnp.asarray(rng.randint(width // 2, width + 1, B), jnp.int32)
    _naive_next(params, tokens_BxT, lengths_B, keys_B, config=config).block_until_ready()
    start = time.perf_counter()
    np.asarray(_naive_next(params, tokens_BxT, lengths_B, keys_B, config=config))
    step = time.perf_counter() - start
    print(f'    naive step at width {width:4d}: {step:6.2f} s x {steps} steps')
    total += step * steps
  return total


def _time_transformers(config, params, contexts, new_tokens: int) -> float | None:
  try:
    import torch
    import transformers
  except ImportError as e:
    print(f'  transformers: skipped ({e})')
    return None
  torch.set_num_threads(os.cpu_count() or 1)
  with tempfile.TemporaryDirectory() as tmp:
    models.save_hf_checkpoint(config, params, tmp)
    model = transformers.Qwen3ForCausalLM.from_pretrained(tmp, dtype=torch.float32)
  model.eval()
  B, width = len(contexts), max(len(c) for c in contexts)
  ids = np.zeros((B, width), np.int64)
  mask = np.zeros((B, width), np.int64)
  for i, c in enumerate(contexts):  # left padding, as generate expects for decoder-only models
    ids[i, width - len(c):] = c
    mask[i, width - len(c):] = 1
  kwargs = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                do_sample=True, temperature=SETTINGS.temperature, top_k=0, top_p=1.0,
                pad_token_id=0, eos_token_id=None)
  with torch.inference_mode():
    model.generate(**kwargs, max_new_tokens=2, min_new_tokens=2)  # warm-up
    start = time.perf_counter()
    out = model.generate(**kwargs, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    elapsed = time.perf_counter() - start
  assert out.shape[1] == width + new_tokens, out.shape
  print(f'  transformers {transformers.__version__}, torch {torch.__version__}, '
        f'{torch.get_num_threads()} threads')
  return elapsed


def _status(ok: bool) -> str:
  return 'met' if ok else 'MISSED'


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py sampler', description=__doc__.split('\n')[0])
  parser.add_argument('--preset', default='small')
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--new_tokens', type=int, default=256)
  parser.add_argument('--prompt_len', type=int, default=32)
  parser.add_argument('--chunk', type=int, default=32)
  parser.add_argument('--long', type=int, default=128)
  parser.add_argument('--skip_hf', action='store_true')
  args = parser.parse_args(argv)

  config = models.get_config(args.preset)
  params = models.init_params(config, jax.random.key(0))
  rng = np.random.RandomState(0)
  lengths = rng.randint(max(args.prompt_len // 2, 1), args.prompt_len + 1, size=args.batch)
  contexts = [rng.randint(0, config.vocab_size, size=n).astype(np.int32) for n in lengths]
  n_tokens = args.batch * args.new_tokens
  print(f'sampler: preset {args.preset}, batch {args.batch}, {args.new_tokens} new tokens, '
        f'prompts of {lengths.min()}..{lengths.max()} tokens; {jax.devices()[0].platform} '
        f'x{len(jax.devices())}, {os.cpu_count()} CPUs (shared machine: timings are noisy)')

  ours = _time_ours(config, params, contexts, args.new_tokens, jax.random.key(1))
  ours_rate = n_tokens / ours
  print(f'  ours          {ours_rate:10.1f} tokens/s   ({ours:.2f} s, prefill included)')
  naive = _time_naive(config, params, contexts, args.new_tokens, jax.random.key(1))
  naive_rate = n_tokens / naive
  print(f'  naive         {naive_rate:10.1f} tokens/s   ({naive:.2f} s from the step times above)')
  hf = None if args.skip_hf else _time_transformers(config, params, contexts, args.new_tokens)
  if hf is not None:
    print(f'  transformers  {n_tokens / hf:10.1f} tokens/s   ({hf:.2f} s)')

  chunk = _time_ours(config, params, contexts, args.chunk, jax.random.key(2))
  long = _time_ours(config, params, contexts, args.long, jax.random.key(2))

  print('ratios')
  speedup = ours_rate / naive_rate
  print(f'  ours / naive          x{speedup:7.2f}   goal >= 10    {_status(speedup >= 10)}')
  if hf is not None:
    speedup = hf / ours
    print(f'  ours / transformers   x{speedup:7.2f}   goal >= 1.5   {_status(speedup >= 1.5)}')
  ratio = chunk / long
  print(f'  {args.chunk}-token chunk / {args.long} new tokens: {chunk:.2f} s / {long:.2f} s = '
        f'{ratio:.3f}   goal <= 0.333   {_status(ratio <= 1 / 3)}')
