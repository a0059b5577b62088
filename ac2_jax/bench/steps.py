"""Whole training steps of AC2, Prefix GRPO and GRPO, split by phase and measured side by side.

  python launch/bench.py steps [--methods ac2,prefix_grpo,grpo] [--config_arg walk] [--steps 8]
      [--baseline prefix_grpo] [--root DIR] [--seed 0] [--set KEY=VALUE ...]

Every method starts from one warm start: the configured `model.init_checkpoint` and
`task.data_dir`, or the seed's SFT warm start that `launch/compare.py` builds and caches under
ROOT/warmstart_seed<N> (a rerun with the same ROOT reuses it). Each method's run is built once
(`experiment.build`, in ROOT/steps_<method>, emptied first), then the methods take their steps in
turn (ac2 step 1, prefix_grpo step 1, grpo step 1, ac2 step 2, ...), so a load that drifts during
the benchmark reaches all of them alike. A step is the trainer's own (`algorithm.step`: sample,
judge, read the critic, update), with its phase times (`time/*`) as the trainer logs them.

A later step can still meet a new length bucket and compile a program for it, inside whatever
phase needed it; JAX reports each tracing, lowering and compilation (`jax.monitoring`), and their
seconds are counted per step ('compile') and taken out of the step ('step - compile').

Printed per method: the median over steps 2..N of each phase, of the whole step, of its compile
seconds and of the step without them; step 1 (most programs compile there); the tokens generated
and decoding FLOPs per step; and each method's ratio to the baseline method, phase by phase.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import jax
import numpy as np
import tensorflow_datasets as tfds

from ac2_jax.train import cli, compare, experiment

SUMMED = ('tokens_generated', 'decoding_flops')
# Tracing, lowering and XLA compilation: consecutive, so their seconds add up.
COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
                  '/jax/core/compile/jaxpr_to_mlir_module_duration',
                  '/jax/core/compile/backend_compile_duration')


class CompileClock:
  """Seconds JAX spent tracing, lowering and compiling since the last `lap`, while in its `with`
  block (the listener is global to the process, so it leaves with the block)."""

  def __init__(self):
    self.seconds = 0.0

  def __enter__(self) -> 'CompileClock':
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *_) -> None:
    jax.monitoring.unregister_event_duration_listener(self._listen)

  def _listen(self, event: str, duration: float, **_) -> None:
    if event in COMPILE_EVENTS:
      self.seconds += duration

  def lap(self) -> float:
    seconds, self.seconds = self.seconds, 0.0
    return seconds


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'configs')


def method_config(spec: str, config_arg: str, seed: int, overrides: list[str]):
  """configs/<method>.py[:arg[,variants]] with `seed` and the KEY=VALUE overrides (parsed as a
  launcher parses --config.KEY=VALUE)."""
  method = compare.parse_method(spec)
  path = os.path.join(CONFIGS_DIR, compare.METHOD_CONFIGS[method.config_name])
  arg = method.config_arg(config_arg)
  return cli.config_from_args(f'{path}:{arg}' if arg else path, [f'seed={seed}', *overrides])


def run_steps(specs: list[str], configs: list, root: str, steps: int, log=print
              ) -> dict[str, list[dict]]:
  """{method: [the metrics of steps 1..steps]}, the methods' steps taken in turn."""
  runs = {}
  for spec, c in zip(specs, configs):
    workdir = os.path.join(root, f'steps_{compare.parse_method(spec).dirname}')
    shutil.rmtree(workdir, ignore_errors=True)
    t0 = time.monotonic()
    rt, algorithm, state = experiment.build(c, workdir, log=lambda *_: None)
    log(f'{spec}: built in {time.monotonic() - t0:.1f} s')
    runs[spec] = [c, rt, algorithm, state]
  records = {spec: [] for spec in specs}
  with CompileClock() as clock:
    for step in range(1, steps + 1):
      for spec in specs:
        c, rt, algorithm, state = runs[spec]
        clock.lap()
        t0 = time.perf_counter()
        state, record = algorithm.step(rt, state, step, experiment.step_key(c.seed, step))
        record['step_time'] = time.perf_counter() - t0
        record['compile'] = clock.lap()
        record['step - compile'] = record['step_time'] - record['compile']
        runs[spec][3] = state
        records[spec].append(record)
        log(f'{spec} step {step}: {record["step_time"]:.2f} s ({record["compile"]:.2f} s '
            'compiling)')
  for _, _, algorithm, _ in runs.values():
    algorithm.close()
  return records


def phase_medians(records: list[dict]) -> dict[str, float]:
  """Median over steps 2.. of the step time, each `time/*` phase and the per-step counts."""
  later = records[1:] or records
  keys = sorted({k for r in later for k in r if k.startswith('time/')})
  out = {k: float(np.median([r[k] for r in later]))
         for k in ('step_time', 'compile', 'step - compile') if k in later[0]}
  out.update({k: float(np.median([r.get(k, 0.0) for r in later])) for k in keys})
  out.update({k: float(np.median([r[k] for r in later])) for k in SUMMED if k in later[0]})
  return out


def table(records: dict[str, list[dict]], baseline: str | None = None) -> str:
  """Medians per method (columns) and each method's ratio to `baseline` (default: the first)."""
  medians = {spec: phase_medians(rs) for spec, rs in records.items()}
  phases = sorted({k for m in medians.values() for k in m if k.startswith('time/')})
  baseline = baseline or next(iter(medians))
  base = medians[baseline]
  others = [s for s in medians if s != baseline]
  width = max(12, *(len(s) for s in medians))
  lines = [f'{"":26s}' + ''.join(f'{s:>{width}s}' for s in medians)
           + f'   / {baseline}: ' + ' '.join(others)]
  for key in ('step_time', 'compile', 'step - compile', *phases):
    label = 'step (median of 2..N)' if key == 'step_time' else key.removeprefix('time/')
    values = [m.get(key, 0.0) for m in medians.values()]
    # A ratio to a phase the baseline (nearly) does not have says nothing.
    ratios = ' '.join(f'{medians[s].get(key, 0.0) / base[key]:.2f}x'
                      if base.get(key, 0.0) >= 0.01 else '-' for s in others)
    lines.append(f'{label:26s}' + ''.join(f'{v:{width}.2f}' for v in values) + f'   {ratios}')
  first = [rs[0]['step_time'] for rs in records.values()]
  lines.append(f'{"step 1 (compiles)":26s}' + ''.join(f'{v:{width}.2f}' for v in first))
  for key in SUMMED:
    lines.append(f'{key + " / step":26s}' + ''.join(f'{m.get(key, 0.0):{width}.3g}'
                                                   for m in medians.values()))
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py steps', description=__doc__.split('\n')[0])
  parser.add_argument('--methods', default='ac2,prefix_grpo,grpo')
  parser.add_argument('--config_arg', default='', help="configs' argument, e.g. walk")
  parser.add_argument('--steps', type=int, default=8)
  parser.add_argument('--baseline', default='',
                      help='the method the ratios divide by (default: prefix_grpo if measured, '
                           'else the first)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--root', default='/tmp/ac2_jax_bench_steps')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='config override for every method, e.g. --set=sampling.temperature=1.0')
  args = parser.parse_args(argv)
  if args.steps < 2:
    raise SystemExit('--steps must be at least 2 (step 1 compiles; the medians are of 2..N)')
  tfds.disable_progress_bar()
  specs = [m for m in args.methods.split(',') if m]
  configs = [method_config(s, args.config_arg, args.seed, args.set) for s in specs]
  try:
    compare.check_shared_warm_start(dict(zip(specs, configs)))
  except ValueError as e:
    raise SystemExit(str(e)) from None
  os.makedirs(args.root, exist_ok=True)
  data_dir, checkpoint = compare.warm_start(configs[0], args.root, args.seed,
                                            log=lambda m: print(f'warm start: {m}'))
  for c in configs:
    c.task.data_dir, c.model.init_checkpoint = data_dir, checkpoint
  print(f'steps: {", ".join(specs)} from one warm start ({checkpoint}), {args.steps} steps each, '
        f'taken in turn; {os.cpu_count()} CPUs, load average '
        + ' '.join(f'{x:.1f}' for x in os.getloadavg()))
  records = run_steps(specs, configs, args.root, args.steps)
  print('seconds per step by phase (median over steps 2..N), per method:')
  baseline = args.baseline or ('prefix_grpo' if 'prefix_grpo' in specs else specs[0])
  print(table(records, baseline))
  path = os.path.join(args.root, 'steps.json')
  with open(path, 'w') as f:
    json.dump(records, f, default=float)
  print(f'every step\'s metrics: {path}')
  print('load average at the end ' + ' '.join(f'{x:.1f}' for x in os.getloadavg()))
