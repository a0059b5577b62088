"""Methods against each other over seeds (launch/compare.py): one warm start per seed, one evaluation.

  python launch/compare.py --methods=ac2,grpo,prefix_grpo --seeds=0,1,2 --config_arg=bench --root=DIR

A method is a config file of configs/ with AC2 variants after a colon (`ac2:no_local_readiness`,
several joined by '+': `ac2:chunk_small+no_audit`); with `config_arg=bench` it loads
`configs/ac2.py:bench,no_local_readiness`. Layout under ROOT:

  warmstart_seed<N>/{data,sft}   the seed's data set and SFT warm start, shared by its methods
  <method>_seed<N>/              one trainer workdir per run (':' and '+' become '-')
  compare.json, plots/*.png      every curve, the table (ac2_jax/train/compare_report.py)

Every run gets the same evaluation (every 5 steps, 128 problems x 8 responses unless told) and
checkpoints at each evaluation. A rerun skips finished runs (summary.json at the last step) and
resumes unfinished ones from their checkpoints (the trainer does that from a workdir); results are
read only from the runs' metrics.jsonl, so the report can be rebuilt at any time. A run stopped by
SIGTERM or SIGINT (preemption) ends the whole comparison there, its checkpoint saved and no report
written: the next run does not start on a machine that is being taken away.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
from typing import Any, Mapping

import ml_collections

from ac2_jax.train import compare_report, console, experiment, loop

# Method name -> config file in configs/ (an explicit registry: no file is chosen by a string).
METHOD_CONFIGS = {'ac2': 'ac2.py', 'grpo': 'grpo.py', 'prefix_grpo': 'prefix_grpo.py',
                  'ppo': 'ppo.py', 'pact': 'pact.py', 'lisao': 'lisao.py', 'li2sao': 'li2sao.py'}
# The sections a warm start depends on: every method of a seed must agree on them.
WARM_START_SECTIONS = ('task', 'sft', 'model')
QUICK_STEPS = 20
QUICK_PROBLEMS = 64


@dataclasses.dataclass(frozen=True)
class Method:
  spec: str                    # as given: 'ac2:no_local_readiness'
  config_name: str             # key of METHOD_CONFIGS
  variants: tuple[str, ...]

  @property
  def dirname(self) -> str:
    return self.spec.replace(':', '-').replace('+', '-')

  def config_arg(self, base_arg: str) -> str:
    return ','.join(p for p in (base_arg, *self.variants) if p)


def parse_method(spec: str) -> Method:
  name, _, variants = spec.partition(':')
  if name not in METHOD_CONFIGS:
    raise ValueError(f'unknown method {name!r} in {spec!r}; known: {", ".join(METHOD_CONFIGS)}')
  # Variants are config arguments (ac2:no_audit, ppo:lambda1, prefix_grpo:uncredited, ...): the
  # config file refuses one it does not know.
  return Method(spec, name, tuple(v for v in variants.split('+') if v))


@dataclasses.dataclass(frozen=True)
class CompareSettings:
  methods: tuple[str, ...]
  seeds: tuple[int, ...]
  root: str
  configs_dir: str
  config_arg: str = ''
  quick: bool = False          # the first seed only, QUICK_STEPS steps, QUICK_PROBLEMS problems
  eval_every: int = 5
  eval_problems: int = 128
  eval_responses: int = 8
  overrides: tuple[tuple[str, Any], ...] = ()  # dotted config keys applied to every run, last
  # (selector, dotted key, value): applied after `overrides` to the runs of the methods the selector
  # names, a config name ('ac2': every AC2 variant) or one spec ('ac2:no_audit'); e.g. a critic
  # setting that GRPO's config has no key for.
  method_overrides: tuple[tuple[str, str, Any], ...] = ()

  @property
  def run_seeds(self) -> tuple[int, ...]:
    return self.seeds[:1] if self.quick else self.seeds


def load_config(configs_dir: str, method: Method, base_arg: str) -> ml_collections.ConfigDict:
  """`configs/<file>:get_config(arg)`, imported by path (configs/ is not a package)."""
  path = os.path.join(configs_dir, METHOD_CONFIGS[method.config_name])
  spec = importlib.util.spec_from_file_location(f'configs_{method.config_name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(method.config_arg(base_arg))


def apply_overrides(c: ml_collections.ConfigDict, values: Mapping[str, Any]):
  for dotted, value in values.items():
    *parents, leaf = dotted.split('.')
    node = c
    for p in parents:
      node = node[p]
    if leaf not in node:
      raise ValueError(f'unknown config key {dotted!r}')
    node[leaf] = value
  return c


def run_config(s: CompareSettings, method: Method, seed: int) -> ml_collections.ConfigDict:
  """The config of one run before its warm start is filled in."""
  c = load_config(s.configs_dir, method, s.config_arg)
  c.seed = seed
  c.eval.every = s.eval_every
  c.eval.num_problems = QUICK_PROBLEMS if s.quick else s.eval_problems
  c.eval.num_responses = s.eval_responses
  c.checkpoint_every = s.eval_every
  if s.quick:
    c.num_steps = min(c.num_steps, QUICK_STEPS)
  apply_overrides(c, dict(s.overrides))
  return apply_overrides(c, {key: value for selector, key, value in s.method_overrides
                             if selector in (method.spec, method.config_name)})


def check_method_overrides(s: CompareSettings, methods: list[Method]) -> None:
  """Raises ValueError for a per-method override that names no method of the comparison (a typo
  would otherwise change nothing, silently)."""
  names = {n for m in methods for n in (m.spec, m.config_name)}
  for selector, key, _ in s.method_overrides:
    if selector not in names:
      raise ValueError(f'override {selector}/{key} names no method of this comparison '
                       f'({", ".join(m.spec for m in methods)})')


def run_dir(s: CompareSettings, method: Method, seed: int) -> str:
  return os.path.join(s.root, f'{method.dirname}_seed{seed}')


def is_finished(workdir: str, num_steps: int) -> bool:
  path = os.path.join(workdir, 'summary.json')
  if not os.path.exists(path):
    return False
  with open(path) as f:
    return json.load(f).get('last_step', -1) >= num_steps


def check_shared_warm_start(configs: Mapping[str, ml_collections.ConfigDict],
                            what: str = '') -> None:
  """Raises ValueError unless every config agrees on the sections a warm start depends on."""
  views = {name: {k: c[k].to_dict() for k in WARM_START_SECTIONS} for name, c in configs.items()}
  first_name, first = next(iter(views.items()))
  for name, view in views.items():
    if view != first:
      keys = sorted(f'{k}.{x}' for k in view for x in view[k] if view[k][x] != first[k].get(x))
      raise ValueError(f'{name}{what} differs from {first_name} in {keys}: the methods of a seed '
                       'share one warm start')


def warm_start(c: ml_collections.ConfigDict, root: str, seed: int, log=print) -> tuple[str, str]:
  """(data_dir, init_checkpoint) of the seed: the configured ones, or built (and cached) under
  ROOT/warmstart_seed<N> through the trainer's own SFT path."""
  if c.model.init_checkpoint and c.task.data_dir:
    return c.task.data_dir, c.model.init_checkpoint
  warm_dir = os.path.join(root, f'warmstart_seed{seed}')
  c = ml_collections.ConfigDict(c.to_dict())
  c.task.data_dir = c.task.data_dir or os.path.join(warm_dir, 'data')
  task, tok = experiment.build_task(c, warm_dir, c.model.init_checkpoint or None)
  return c.task.data_dir, experiment.initial_checkpoint(c, warm_dir, task, tok, log=log)


def run_all(s: CompareSettings, log=print) -> list[dict]:
  """Trains (or skips, or resumes) every run; returns [{method, seed, workdir, status}]."""
  methods = [parse_method(m) for m in s.methods]
  check_method_overrides(s, methods)
  plan = [(m, seed, run_config(s, m, seed)) for seed in s.run_seeds for m in methods]
  for seed in s.run_seeds:  # one warm start per seed: its methods must agree on what it reads
    check_shared_warm_start({m.spec: c for m, sd, c in plan if sd == seed}, f' (seed {seed})')
  os.makedirs(s.root, exist_ok=True)
  warm: dict[int, tuple[str, str]] = {}
  done, started = [], time.monotonic()
  for index, (method, seed, c) in enumerate(plan, 1):
    workdir = run_dir(s, method, seed)
    tag = f'[{index}/{len(plan)} {method.spec} seed {seed}]'
    entry = {'method': method.spec, 'seed': seed, 'workdir': workdir}
    if is_finished(workdir, c.num_steps):
      log(f'{tag} finished earlier: skipped')
      done.append({**entry, 'status': 'skipped'})
      continue
    if seed not in warm:
      warm[seed] = warm_start(c, s.root, seed, log=lambda m, t=tag: log(f'{t} warm start: {m}'))
    c.task.data_dir, c.model.init_checkpoint = warm[seed]
    log(f'{tag} {"resuming" if os.path.isdir(workdir) else "starting"} in {workdir}')
    t0 = time.monotonic()
    summary = loop.train(c, workdir, log=lambda m, t=tag: log(f'{t} {m}'))
    if not summary.finished:
      log(f'{tag} stopped at step {summary.last_step} of {summary.num_steps} (checkpoint saved); '
          'rerun the same command to continue')
      done.append({**entry, 'status': 'stopped'})
      return done
    trained = [d for d in done if d['status'] == 'trained']
    per_run = (time.monotonic() - started) / (len(trained) + 1)
    log(f'{tag} done in {console.format_duration(time.monotonic() - t0)}; '
        f'{len(plan) - index} runs left, ETA {console.format_duration(per_run * (len(plan) - index))}')
    done.append({**entry, 'status': 'trained'})
  return done


def compare(s: CompareSettings, log=print) -> dict:
  """Runs what is left of the comparison, then writes ROOT/compare.json and the plots; when a run
  was stopped (SIGTERM, SIGINT), only {'stopped': True, 'runs': [...]}."""
  runs = run_all(s, log=log)
  if any(r['status'] == 'stopped' for r in runs):
    return {'stopped': True, 'runs': runs}
  report = compare_report.write_report(runs, s.root, settings=dataclasses.asdict(s))
  log(report['table'])
  log(f'wrote {os.path.join(s.root, "compare.json")} and {len(report["plots"])} plots in '
      f'{os.path.join(s.root, "plots")}')
  return report
