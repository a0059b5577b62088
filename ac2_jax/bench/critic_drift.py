"""Which part of a run's critic moved? (`python launch/bench.py critic_drift`)

AC2's critic is the policy asked by prompt, so two things change its reads during a run: its own
update, and the actor's updates of the weights it reads through. This benchmark reads a run's
critic at one of its checkpoints on the run's own training data, the critic buffer's records
(prefix, reference, target) as the next critic update would draw them, under each combination of
the weights: the run's critic (W_t + A_t B_t with the adapter, W_t without it), the adapter on the
warm start's weights (W_0 + A_t B_t), the warm start (W_0) and the policy alone (W_t). Printed per
combination: the mean read against the mean target, MAE, correlation and invalid reads. When the
run's critic reads like W_0, its update has taught it nothing yet; when W_0 + A_t B_t reads like
W_t + A_t B_t, the actor's drift has not moved it.

  python launch/bench.py critic_drift --checkpoint=RUN/checkpoints/55 [--draws=6]

The run's config (RUN/config.json) and warm start are reused; nothing is written.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from ac2_jax.learner import critic_adapter
from ac2_jax.learner import rows as rows_lib


def buffer_records(controller, draws: int) -> list:
  """Records of `draws` critic batches drawn from the controller's critic buffer (each draw as an
  update would take it: up to critic_pairs_per_update pairs, with and without the reference)."""
  records = []
  for k in range(draws):
    records.extend(controller.critic_batch((controller.last_step or 0) + 1 + k).records)
  return records


def weight_variants(warm_state, run_state) -> dict:
  """{name: critic weights}: the run's critic first."""
  if isinstance(run_state, critic_adapter.AdapterState):
    return {'run critic W_t + A_t B_t': critic_adapter.critic_params(run_state),
            'W_0 + A_t B_t': critic_adapter.merge(warm_state.params, run_state.critic_adapter),
            'warm start W_0': warm_state.params,
            'policy W_t': run_state.params}
  return {'run critic W_t': run_state.params, 'warm start W_0': warm_state.params}


def figures(values: Sequence[float | None], targets: Sequence[float]) -> dict:
  """Mean read, MAE and correlation over the valid reads, the mean target over every record, and
  the invalid reads counted."""
  valid = np.array([v is not None for v in values], bool)
  v = np.array([x for x in values if x is not None], np.float64)
  t = np.asarray(targets, np.float64)[valid]
  target_mean = float(np.mean(targets)) if len(targets) else float('nan')
  corr = (float(np.corrcoef(v, t)[0, 1]) if v.size > 1 and v.std() > 0 and t.std() > 0
          else float('nan'))
  return {'read_mean': float(v.mean()) if v.size else float('nan'),
          'target_mean': target_mean,
          'mae': float(np.abs(v - t).mean()) if v.size else float('nan'),
          'corr': corr, 'invalid': int((~valid).sum()), 'records': len(values)}


def run(rt, algorithm, warm_state, run_state, draws: int, log=print) -> dict:
  records = buffer_records(algorithm.controller, draws)
  if not records:
    raise SystemExit('bench.py critic_drift: the run\'s critic buffer is empty')
  read = rows_lib.critic_reader(rt.critic_readout)
  prompts = [rt.prompt_ids_by_id[r.problem_id] for r in records]
  prefixes = [r.prefix_tokens_P for r in records]
  references = [r.reference for r in records]
  targets = [r.target for r in records]
  log(f'{len(records)} critic-buffer records (with and without the reference), target mean '
      f'{np.mean(targets):.3f}')
  out = {}
  for name, params in weight_variants(warm_state, run_state).items():
    f = figures(read(rt, params, prompts, prefixes, references), targets)
    out[name] = f
    log(f'  {name:26s} read mean {f["read_mean"]:.3f}  MAE {f["mae"]:.3f}  corr {f["corr"]:+.3f}'
        f'  invalid {f["invalid"]}')
  return out


def main(argv: Sequence[str]) -> None:
  parser = argparse.ArgumentParser(prog='bench.py critic_drift', description=__doc__.split('\n')[0])
  parser.add_argument('--checkpoint', required=True, help='a run: its workdir (the latest '
                      'checkpoint) or WORKDIR/checkpoints/<step>')
  parser.add_argument('--draws', type=int, default=6, help='critic batches drawn from the buffer')
  args = parser.parse_args(argv)
  if args.draws < 1:
    raise SystemExit('bench.py critic_drift: --draws must be >= 1')
  from ac2_jax.train import checkpoint_eval, experiment
  try:
    source, config = checkpoint_eval.load_run(args.checkpoint)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f'bench.py critic_drift: --checkpoint: {e}') from None
  rt, algorithm, warm_state = experiment.build(config, source.workdir, log=lambda *a: None)
  step, run_state, saved = checkpoint_eval.restore_run_state(source, config, warm_state)
  algorithm.load_state_dict(saved['algorithm'])
  print(f'critic of {source.workdir} at step {step}')
  run(rt, algorithm, warm_state, run_state, args.draws)
