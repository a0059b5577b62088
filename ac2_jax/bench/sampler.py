"""Sampler throughput against transformers `generate`, each engine in its own process on the same
exported weights, and the work done against the machine's measured peaks.

  python launch/bench.py sampler [--configs mini,small] [--batches 8,64] [--new_tokens 128]
      [--prompt_len 32] [--temperature 0.8] [--repeats 3] [--chunk 32] [--hf_threads 1,2]
      [--skip_hf]

Per config, random weights (seed 0) are exported once with `save_hf_checkpoint`, with prompts of
`prompt_len` random ids (batch b takes the first b). Then, each engine in a process of its own
(spawn.py says why):
1. parity: every engine computes the first-token logits of the prompts; the run stops unless
   they agree with transformers' within 1e-4 (largest absolute difference): timing two engines
   means nothing unless they run the same model.
2. throughput: per batch size, one warm-up call, then `repeats` timed calls (the median counts):
   temperature sampling with no top-k/top-p cut and no stop token, so every row draws
   `new_tokens`; prefill included. At the largest batch ours also times a `chunk`-token call on
   the same prompts: what AC2 pays for a chunk relative to a longer continuation. Transformers
   runs at the faster of 1 thread and every core (`--hf_threads`; a warm-up call at each
   decides): on shared cores torch's threads stall each other (sampler_hf.py).
The peaks (a jitted float32 matmul and a large elementwise pass, `roofline.measure_peaks`) are
measured in their own process in the same run; achieved FLOP/s and bytes/s count the work the
model needs (`roofline.generate_cost`), so padding or re-reading shows as a lower fraction.

Engines: ours (`sampling.generate`, worker `sampler_jax`) and Hugging Face transformers
(worker `sampler_hf`; skipped when torch or transformers is not installed). The naive
full-recompute loop of earlier versions is gone: ours ran 58x faster than it, and it took most
of the run time.

Configs: `mini` is issue 21's (vocab 1,024, hidden 256, 4 layers, 4 query / 2 KV heads, head_dim
64, intermediate 768, untied); `small` is the preset (29M parameters, tied).
Goal (issue 21): ours >= 1.5x transformers' tokens/s at `mini`, batch 64.
Run time with the defaults: about 6 minutes on 2 CPU cores shared with other jobs (load 5).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile

import jax
import numpy as np

from ac2_jax import models
from ac2_jax.bench import roofline, spawn

CONFIGS = {
    'mini': models.ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=768,
                               num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                               rope_theta=10_000.0, tie_embeddings=False,
                               max_position_embeddings=4096),
    'small': models.get_config('small'),
}
ENGINES = {'ours': 'ac2_jax.bench.sampler_jax', 'transformers': 'ac2_jax.bench.sampler_hf'}
# torch's OpenMP threads spin-wait at each barrier by default; on shared cores that stalls them
# (sampler_hf.py). JAX's thread pool is left as it is.
ENV = {'ours': {}, 'transformers': {'OMP_WAIT_POLICY': 'PASSIVE'}}
LOGIT_TOLERANCE = 1e-4
GOAL = ('mini', 64, 1.5)  # (config, batch, ours / transformers)


def _have_transformers() -> bool:
  return all(importlib.util.find_spec(m) is not None for m in ('torch', 'transformers'))


def _load() -> str:
  return 'load average {:.1f} {:.1f} {:.1f}'.format(*os.getloadavg())


def check_parity(engines: list[str], job: dict, workdir: str) -> float | None:
  """Largest |ours - transformers| over the first-token logits; None without transformers."""
  found = {}
  for engine in engines:
    out = os.path.join(workdir, f'logits_{engine}.npy')
    spawn.run(ENGINES[engine], {**job, 'task': 'logits', 'out': out}, env=ENV[engine])
    found[engine] = np.load(out)
  if 'transformers' not in found:
    return None
  return float(np.max(np.abs(found['ours'] - found['transformers'])))


def _rows(results: dict, batch: int) -> list[tuple[str, dict]]:
  """(label, run) of every engine at `batch`, transformers first."""
  rows = []
  if 'transformers' in results:
    run = results['transformers']['runs'][str(batch)]
    rows.append((f'transformers {run["threads"]} thr', run))
  return rows + [('ours', results['ours']['runs'][str(batch)])]


def _line(label: str, run: dict, batch: int, hf_seconds: float | None, config, args,
          peaks: dict) -> str:
  seconds = run['median']
  flops, nbytes = roofline.generate_cost(config, batch, args.prompt_len, args.new_tokens)
  achieved = lambda work, peak: (f'{work / seconds / 1e9:7.2f} '
                                 f'({roofline.fraction(work / seconds, peak)})')
  ratio = f'{hf_seconds / seconds:6.2f}' if hf_seconds else '     -'
  chunk = f'{run["chunk"]["median"] / seconds:6.3f}' if 'chunk' in run else '     -'
  spread = '/'.join(f'{s:.2f}' for s in run['seconds'])
  return (f'  {batch:5d}  {label:18s} {batch * args.new_tokens / seconds:8.0f} {ratio:>8s}  '
          f'{achieved(flops, peaks["matmul_flops_per_s"])}  '
          f'{achieved(nbytes, peaks["copy_bytes_per_s"])}  {chunk:>7s}   {spread} s '
          f'(warm-up {run["warmup"]:.1f} s)')


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py sampler', description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='mini,small')
  parser.add_argument('--batches', default='8,64')
  parser.add_argument('--new_tokens', type=int, default=128)
  parser.add_argument('--prompt_len', type=int, default=32)
  parser.add_argument('--temperature', type=float, default=0.8)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--chunk', type=int, default=32, help='0: no chunk timing')
  parser.add_argument('--hf_threads', default='',
                      help='torch thread counts to time; default: 1 and every core')
  parser.add_argument('--skip_hf', action='store_true')
  args = parser.parse_args(argv)
  names = [n for n in args.configs.split(',') if n]
  unknown = [n for n in names if n not in CONFIGS]
  if unknown:
    raise SystemExit(f'unknown configs {unknown}; known: {", ".join(CONFIGS)}')
  batches = [int(b) for b in args.batches.split(',')]
  threads = sorted({int(t) for t in args.hf_threads.split(',') if t} or {1, os.cpu_count() or 1})
  engines = ['transformers', 'ours']
  if args.skip_hf or not _have_transformers():
    print('transformers: skipped' + ('' if args.skip_hf else ' (torch or transformers missing)'))
    engines = ['ours']
  jobs = {'ours': {'chunk': args.chunk}, 'transformers': {'threads': threads}}

  print(f'sampler: prompts of {args.prompt_len} ids, {args.new_tokens} new tokens, temperature '
        f'{args.temperature}, no stop token; median of {args.repeats} after a warm-up; each '
        f'engine in its own process; {os.cpu_count()} CPUs, {_load()} at the start')
  peaks = spawn.run(ENGINES['ours'], {'task': 'peaks'})
  print(f'peaks (own process, jax {peaks["jax"]}): '
        + roofline.Peaks(peaks['matmul_flops_per_s'], peaks['copy_bytes_per_s'],
                         peaks['matmul_n'], peaks['copy_mib']).describe())
  goal = None
  with tempfile.TemporaryDirectory() as tmp:
    for name in names:
      config = CONFIGS[name]
      workdir = os.path.join(tmp, name)
      models.save_hf_checkpoint(config, models.init_params(config, jax.random.key(0)),
                                os.path.join(workdir, 'checkpoint'))
      prompts = os.path.join(workdir, 'prompts.npy')
      rng = np.random.RandomState(0)
      np.save(prompts, rng.randint(0, config.vocab_size, (max(batches), args.prompt_len)))
      job = {'checkpoint': os.path.join(workdir, 'checkpoint'), 'prompts': prompts,
             'new_tokens': args.new_tokens}
      diff = check_parity(engines, job, workdir)
      print(f'config {name}: {roofline.num_params(config) / 1e6:.2f}M parameters, '
            f'{"tied" if config.tie_embeddings else "untied"}, weights read per forward '
            f'{roofline.weight_bytes(config) / 1e6:.1f} MB; first-token logits '
            + ('not compared' if diff is None else
               f'max |ours - transformers| {diff:.1e} (limit {LOGIT_TOLERANCE:.0e})'))
      if diff is not None and not diff <= LOGIT_TOLERANCE:
        raise SystemExit(f'config {name}: the engines disagree on the logits; not timed')
      results = {}
      for engine in engines:
        results[engine] = spawn.run(ENGINES[engine], {
            **job, **jobs[engine], 'task': 'throughput', 'batches': batches,
            'temperature': args.temperature, 'repeats': args.repeats}, env=ENV[engine])
        print(f'  {engine}: {results[engine]["engine"]}')
      print(f'  {"batch":>5s}  {"engine":18s} {"tokens/s":>8s} {"x transf":>8s}  '
            f'{"GFLOP/s (of peak)":>17s}  {"GB/s (of peak)":>17s}  '
            f'{f"{args.chunk}/{args.new_tokens}":>7s}   timed runs')
      for batch in batches:
        rows = _rows(results, batch)
        hf_seconds = rows[0][1]['median'] if len(rows) > 1 else None
        for label, run in rows:
          print(_line(label, run, batch, hf_seconds, config, args, peaks))
        if (name, batch) == GOAL[:2] and hf_seconds:
          goal = hf_seconds / results['ours']['runs'][str(batch)]['median']
  if goal is not None:
    print(f'goal: ours / fastest transformers at {GOAL[0]}, batch {GOAL[1]}: x{goal:.2f} '
          f'(goal >= {GOAL[2]}) {"met" if goal >= GOAL[2] else "MISSED"}')
  print(f'{_load()} at the end')
