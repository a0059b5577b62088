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

With `--from_runs=RUN,RUN,...` the methods are runs instead (a compare workdir, or one of its
checkpoints WORKDIR/checkpoints/<step>): each is rebuilt from its own config.json, restored from
that checkpoint (the policy, the critic and the controller's readiness and buffers), and takes
its next N steps from there, in turn with the others: the step time of AC2 once problems are
ready, against Prefix GRPO at the same point of its run. A run's cached critic warm-up is copied
beside it, so the restored state is not warmed up again first.

  python launch/bench.py steps --from_runs=ROOT/ac2_seed0,ROOT/prefix_grpo_seed0 --steps 8
      [--baseline prefix_grpo_seed0]

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

import numpy as np
import tensorflow_datasets as tfds

from ac2_jax.algorithms.timing import CompileClock
from ac2_jax.train import checkpoint_eval, cli, compare, critic_warmup, experiment

SUMMED = ('tokens_generated', 'decoding_flops')


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'configs')


def method_config(spec: str, config_arg: str, seed: int, overrides: list[str]):
  """configs/<method>.py[:arg[,variants]] with `seed` and the KEY=VALUE overrides (parsed as a
  launcher parses --config.KEY=VALUE)."""
  method = compare.parse_method(spec)
  path = os.path.join(CONFIGS_DIR, compare.METHOD_CONFIGS[method.config_name])
  arg = method.config_arg(config_arg)
  return cli.config_from_args(f'{path}:{arg}' if arg else path, [f'seed={seed}', *overrides])


def run_label(path: str) -> str:
  """A `--from_runs` run's name in the table: its workdir's name, and the step it starts from."""
  source = checkpoint_eval.resolve_run(path)
  name = os.path.basename(source.workdir)
  return name if source.step is None else f'{name}@{source.step}'


def run_steps(specs: list[str], configs: list, root: str, steps: int, log=print,
              sources: list | None = None) -> dict[str, list[dict]]:
  """{method: [the metrics of its steps 1..steps]}, the methods' steps taken in turn. With
  `sources` (a `checkpoint_eval.Source` per method), each starts from its run's checkpoint and
  its steps are the run's next ones."""
  runs = {}
  for i, (spec, c) in enumerate(zip(specs, configs)):
    source = sources[i] if sources else None
    name = os.path.basename(source.workdir) if source else compare.parse_method(spec).dirname
    workdir = os.path.join(root, f'steps_{name}')
    shutil.rmtree(workdir, ignore_errors=True)
    if source and os.path.isdir(os.path.join(source.workdir, critic_warmup.DIRECTORY)):
      shutil.copytree(os.path.join(source.workdir, critic_warmup.DIRECTORY),
                      os.path.join(workdir, critic_warmup.DIRECTORY))
    t0 = time.monotonic()
    rt, algorithm, state = experiment.build(c, workdir, log=lambda *_: None)
    first = 1
    if source:
      start, state, saved = checkpoint_eval.restore_run_state(source, c, state)
      algorithm.load_state_dict(saved['algorithm'])
      first = start + 1
    log(f'{spec}: built in {time.monotonic() - t0:.1f} s, first step {first}')
    runs[spec] = [c, rt, algorithm, state, first]
  records = {spec: [] for spec in specs}
  with CompileClock() as clock:
    for k in range(steps):
      for spec in specs:
        c, rt, algorithm, state, first = runs[spec]
        step = first + k
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
  for _, _, algorithm, _, _ in runs.values():
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
  parser.add_argument('--from_runs', default='',
                      help='comma-separated runs (workdirs or WORKDIR/checkpoints/<step>) that '
                           'continue from their checkpoints, each with its own config, instead '
                           'of --methods from one warm start')
  args = parser.parse_args(argv)
  if args.steps < 2:
    raise SystemExit('--steps must be at least 2 (step 1 compiles; the medians are of 2..N)')
  tfds.disable_progress_bar()
  if args.from_runs:
    from_runs(args)
    return
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
  baseline = args.baseline or ('prefix_grpo' if 'prefix_grpo' in specs else specs[0])
  report(records, baseline, args.root)


def from_runs(args: argparse.Namespace) -> None:
  """`main` for --from_runs: the runs' next steps, in turn."""
  if args.set or args.methods != 'ac2,prefix_grpo,grpo':
    raise SystemExit('--from_runs takes each run with its own config: no --methods or --set')
  paths = [p for p in args.from_runs.split(',') if p]
  try:
    loaded = [checkpoint_eval.load_run(p) for p in paths]
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(str(e)) from None
  labels = [run_label(p) for p in paths]
  if len(set(labels)) != len(labels):
    raise SystemExit(f'--from_runs names one run twice: {", ".join(labels)}')
  os.makedirs(args.root, exist_ok=True)
  print(f'steps: {", ".join(labels)} from their checkpoints, {args.steps} steps each, taken in '
        f'turn; {os.cpu_count()} CPUs, load average '
        + ' '.join(f'{x:.1f}' for x in os.getloadavg()))
  records = run_steps(labels, [c for _, c in loaded], args.root, args.steps,
                      sources=[s for s, _ in loaded])
  baseline = args.baseline or next((l for l in labels if l.startswith('prefix_grpo')), labels[0])
  if baseline not in labels:
    raise SystemExit(f'--baseline {baseline!r} is none of {", ".join(labels)}')
  report(records, baseline, args.root)


def report(records: dict[str, list[dict]], baseline: str, root: str) -> None:
  print('seconds per step by phase (median over steps 2..N), per method:')
  print(table(records, baseline))
  path = os.path.join(root, 'steps.json')
  with open(path, 'w') as f:
    json.dump(records, f, default=float)
  print(f'every step\'s metrics: {path}')
  print('load average at the end ' + ' '.join(f'{x:.1f}' for x in os.getloadavg()))
