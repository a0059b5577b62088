"""Evaluates one checkpoint on the validation split: mean@n, best-of-n and pass@k (launch/evaluate.py).

A checkpoint is one of:
- a run's workdir (its latest orbax checkpoint; the run's config.json says how to rebuild it),
- one checkpoint step of a workdir (`WORKDIR/checkpoints/<step>`),
- a Hugging Face checkpoint directory (config.json + safetensors; the config comes from the caller).

From a workdir the result carries the run's step and cumulative decoding FLOPs (saved with the
checkpoint's host state), so a score can be placed on the compute axis. A response is correct for
pass@k when it earns full marks (score 1.0, the `val/full_marks` of training-time evaluation).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import jax
import ml_collections
import numpy as np

from ac2_jax.train import checkpointing, eval_stats, experiment, run_record
from ac2_jax.train import defaults as defaults_lib
from ac2_jax.train.evaluation import sample_scores

CORRECT_SCORE = 1.0  # full marks


@dataclasses.dataclass(frozen=True)
class Source:
  kind: str                  # 'workdir' | 'step' | 'hf'
  path: str
  workdir: str | None = None  # the run's workdir (kinds 'workdir' and 'step')
  step: int | None = None     # the checkpoint step (kind 'step'; None = the latest)


def resolve(path: str) -> Source:
  """What `path` is: a workdir, one of its checkpoint steps, or an HF checkpoint directory."""
  path = os.path.abspath(path.rstrip('/'))
  if not os.path.isdir(path):
    raise FileNotFoundError(f'no checkpoint directory {path!r}')
  if os.path.isdir(os.path.join(path, 'checkpoints')):
    return Source('workdir', path, workdir=path)
  parent = os.path.dirname(path)
  if os.path.basename(parent) == 'checkpoints' and os.path.basename(path).isdigit():
    return Source('step', path, workdir=os.path.dirname(parent), step=int(os.path.basename(path)))
  if (os.path.isfile(os.path.join(path, 'config.json'))
      and glob.glob(os.path.join(path, '*.safetensors'))):
    return Source('hf', path)
  raise ValueError(f'{path!r} is neither a workdir (with checkpoints/), a checkpoint step '
                   f'(WORKDIR/checkpoints/<step>) nor a Hugging Face checkpoint (config.json and '
                   f'*.safetensors)')


def resolve_run(path: str) -> Source:
  """`resolve` for a run only: its workdir or one of its checkpoint steps, not an HF directory."""
  source = resolve(path)
  if source.workdir is None:
    raise ValueError(f'{source.path!r} is not a run (a workdir or WORKDIR/checkpoints/<step>)')
  return source


def run_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run was trained with (its workdir's config.json). A key added since the run was
  written takes the value that reproduces it (`run_record.ADDED_KEYS`), a section added since
  takes its defaults, so that today's code evaluates yesterday's runs."""
  with open(os.path.join(workdir, 'config.json')) as f:
    stored = json.load(f)
  defaults = run_record.flatten(defaults_lib.base_config().to_dict())
  have = run_record.flatten(stored)
  for key in sorted(set(defaults) - set(have)):
    if key in run_record.ADDED_KEYS or key.startswith(run_record.ADDED_SECTIONS):
      node = stored
      *path, leaf = key.split('.')
      for part in path:
        node = node.setdefault(part, {})
      node[leaf] = run_record.ADDED_KEYS.get(key, defaults[key])
  return ml_collections.ConfigDict(stored)


def load_run(path: str) -> tuple[Source, ml_collections.ConfigDict]:
  """(`resolve_run(path)`, the run's config): what a tool reading a run's checkpoint starts from."""
  source = resolve_run(path)
  return source, run_config(source.workdir)


def restore_run_state(source: Source, c: ml_collections.ConfigDict, state):
  """(step, state, saved) of a workdir's checkpoint (`source.step`, or its latest), restored into
  the layout of `state` (built from `c`, the run's config); saved: {'algorithm', 'host'}."""
  if source.workdir is None:
    raise ValueError(f'{source.path!r} is not a run: give a workdir or WORKDIR/checkpoints/<step>')
  ckpt = checkpointing.Checkpointer(os.path.join(source.workdir, 'checkpoints'),
                                    keep=c.checkpoints_kept)
  try:
    return ckpt.restore(state, source.step)
  finally:
    ckpt.close()


def summarize(scores_PxN: np.ndarray, ks: tuple[int, ...], rng: np.random.Generator) -> dict:
  """mean@n, best-of-n (bootstrap), full marks and pass@k (mean over problems of the unbiased
  estimator, correct = full marks) of a problems x responses score matrix."""
  _, n = scores_PxN.shape
  correct_P = (scores_PxN >= CORRECT_SCORE).sum(axis=1)
  ks = tuple(k for k in ks if 1 <= k <= n)
  return {
      'num_problems': int(scores_PxN.shape[0]), 'num_responses': int(n),
      'mean_at_n': eval_stats.mean_score(scores_PxN),
      'best_of_n': eval_stats.best_of_n_bootstrap(scores_PxN, n, rng),
      'full_marks': float(np.mean(scores_PxN >= CORRECT_SCORE)),
      'pass_at_k': {str(k): float(np.mean([eval_stats.pass_at_k(n, int(c), k) for c in correct_P]))
                    for k in ks},
      'correct_per_problem': [int(c) for c in correct_P],
  }


def evaluate_checkpoint(path: str, *, config: ml_collections.ConfigDict | None = None,
                        scratch_dir: str | None = None, num_problems: int = 128,
                        num_responses: int = 16, ks: tuple[int, ...] = (1, 2, 4, 8, 16),
                        seed: int = 0, log=print) -> dict:
  """Samples `num_responses` per validation problem from the checkpoint and summarizes them.

  A workdir or step brings its own config (`config` overrides it when given); an HF checkpoint
  needs `config` (its `model.init_checkpoint` is set to `path`) and a `scratch_dir` where the
  built-in task's data set is built unless `config.task.data_dir` names one.
  """
  source = resolve(path)
  if source.kind == 'hf':
    if config is None or not scratch_dir:
      raise ValueError('an HF checkpoint needs a config and a scratch_dir')
    c = ml_collections.ConfigDict(config.to_dict())
    c.model.init_checkpoint = source.path
    workdir = scratch_dir
  else:
    c = ml_collections.ConfigDict((config or run_config(source.workdir)).to_dict())
    workdir = source.workdir
  rt, _, state = experiment.build(c, workdir, log=log)
  result = {'checkpoint': source.path, 'kind': source.kind, 'step': None,
            'decoding_flops_cum': None}
  if source.kind != 'hf':
    step, state, saved = restore_run_state(source, c, state)
    result.update(step=int(step), decoding_flops_cum=float(saved['host']['flops_cum']))
  scores_PxN, _, _ = sample_scores(rt, state.params, jax.random.key(seed),
                                   num_problems=num_problems, num_responses=num_responses,
                                   max_new_tokens=experiment.run_settings(c).eval_max_new_tokens)
  result.update(summarize(scores_PxN, ks, np.random.default_rng(seed)))
  return result


def table(result: dict) -> str:
  """The printed form of `evaluate_checkpoint`'s result."""
  flops = result['decoding_flops_cum']
  lines = [f'checkpoint  {result["checkpoint"]} ({result["kind"]}'
           + (f', step {result["step"]}' if result['step'] is not None else '') + ')',
           f'decoding FLOPs (cumulative, training)  '
           + (f'{flops:.3e}' if flops is not None else 'n/a (not from a workdir)'),
           f'problems x responses  {result["num_problems"]} x {result["num_responses"]}',
           f'mean@{result["num_responses"]}  {result["mean_at_n"]:.4f}',
           f'best-of-{result["num_responses"]}  {result["best_of_n"]:.4f}',
           f'full marks  {result["full_marks"]:.4f}']
  lines += [f'pass@{k}  {v:.4f}' for k, v in result['pass_at_k'].items()]
  return '\n'.join(lines)
