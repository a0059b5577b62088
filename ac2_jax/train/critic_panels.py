"""The AC2 paper's critic panels (Figures 2 and 4) from a run's workdir, as plain numbers.

Two files of the workdir: `metrics.jsonl` (one record per step: ready fraction, readiness errors)
and `audits.jsonl` (AC2: one record per step, {'step', 'groups'}, a group per audited replay slot;
algorithms/ac2.py `audit_records` names its fields). An audited slot is a ready problem's prefix s
that got g full continuations instead of chunks, so its Monte Carlo rewards r_i check the critic:

  prefix error      |V(s) - mean_i r_i|, with the read AC2 used (Figure 2, third panel) and, on the
                    groups with a reference, with and without it in the prompt (fourth panel)
  group-mean error  |mean_i v_i - mean_i r_i| against |V(s) - mean_i r_i| (Figure 4, left and
                    middle); v_i is what AC2 would have used had the slot not been audited: the
                    critic at the end of the chunk c_i (its first b new tokens) where the
                    continuation ran past it, else r_i (paper, Section A.4)
  advantages        critic A_i = v_i - mean_j v_j against r_i - mean_j r_j on the groups with at
                    least one chunk-end read (Figure 4, right): their Pearson correlation, MAE
                    and scale (mean |A| over mean |r - mean r|: a critic that ranks chunks right
                    but spreads them a quarter as wide as the rewards do weighs them a quarter as
                    much in the actor loss), slope (of the Monte Carlo advantages on the critic's,
                    through 0: 1 when v_i is the expected reward of chunk c_i, above 1 when the
                    critic spreads its values too little) and flat groups (the critic's A_i all
                    within FLAT of 0 while the rewards differ: the chunk ended before whatever
                    the reward turned on)

v follows AC2's rules for invalid critic reads: the row is left out (weight 0 in the actor loss) and
its v_i is the mean of the group's valid v_j (0 if none) before the group mean is taken. A group
with a failed judge call (a reward of None) is left out of every audit panel: its mean is not the
group's. An invalid V(s) leaves its group out of the prefix errors that need it.

No JAX: a notebook (notebooks/critic_diagnostics.ipynb) reads a workdir copied off the machine.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np

from ac2_jax.controller.audit_gate import advantage_slope, audit_advantages, pearson
from ac2_jax.train.metrics import AUDITS_FILE, METRICS_FILE, read_metrics

NAN = float('nan')
# A group's critic advantages all within this of 0 carry no signal (reads of equal end states
# differ by float rounding of different texts, about 1e-4), against reward steps of 1/14.
FLAT = 0.01


def read_workdir(workdir: str) -> tuple[list[dict], list[dict]]:
  """(metrics records, audit records) of a workdir; [] for a file it lacks (a run that is not
  AC2 writes no audits.jsonl). A torn last line is dropped as `read_metrics` does."""
  out = []
  for name in (METRICS_FILE, AUDITS_FILE):
    path = os.path.join(workdir, name)
    out.append(read_metrics(path) if os.path.exists(path) else [])
  return out[0], out[1]


def _number(value: Any) -> float:
  return NAN if value is None else float(value)


def step_series(records: Sequence[Mapping[str, Any]],
                keys: Sequence[str] = ('ready_fraction', 'global_window_error', 'critic_error',
                                       'critic_error_audited')) -> dict[str, np.ndarray]:
  """{'step', *keys} over the training steps (step >= 1) of metrics records; None -> NaN."""
  steps = [r for r in records if r.get('step', 0) >= 1]
  out = {'step': np.array([r['step'] for r in steps], np.int64)}
  for key in keys:
    out[key] = np.array([_number(r.get(key)) for r in steps], np.float64)
  return out


def trailing_mean(values: Sequence[float], window: int = 5) -> np.ndarray:
  """Mean of the last `window` values up to each step, NaNs skipped (the paper's dark lines)."""
  values = np.asarray(values, np.float64)
  out = np.full(values.shape, NAN)
  for k in range(len(values)):
    seen = values[max(0, k - window + 1):k + 1]
    seen = seen[~np.isnan(seen)]
    if seen.size:
      out[k] = seen.mean()
  return out


@dataclasses.dataclass(frozen=True)
class Group:
  """One audited group, reduced to what the panels plot (None where undefined)."""

  step: int
  problem: Any
  reference: bool
  mean_reward: float                     # mean_i r_i
  v_prefix: float | None                 # V(s) as AC2 read it (with the reference if it had one)
  v_prefix_ref: float | None
  v_prefix_noref: float | None
  mean_value: float                      # mean_i v_i (invalid reads filled as AC2 does)
  critic_share: float                    # f: share of continuations read at their chunk end
  critic_advantages: np.ndarray          # v_i - mean_j v_j of the valid rows
  reward_advantages: np.ndarray          # r_i - mean_j r_j of the same rows


def group_of(step: int, g: Mapping[str, Any]) -> Group | None:
  """The panels' view of one audit record; None for a group with a failed judge call."""
  a = audit_advantages(g['rewards'], g['chunk_end_read'], g['chunk_end_value'])
  if a is None:
    return None
  v_prefix = g['v_prefix_ref'] if g['reference'] else g['v_prefix_noref']
  return Group(step=int(step), problem=g['problem'], reference=bool(g['reference']),
               mean_reward=a.mean_reward, v_prefix=v_prefix, v_prefix_ref=g['v_prefix_ref'],
               v_prefix_noref=g['v_prefix_noref'], mean_value=a.mean_value,
               critic_share=float(np.mean(g['chunk_end_read'])),
               critic_advantages=a.critic_A, reward_advantages=a.reward_A)


def groups(audits: Sequence[Mapping[str, Any]]) -> list[Group]:
  """Every audited group of the audit records, in step order."""
  out = []
  for record in audits:
    for g in record.get('groups', []):
      group = group_of(record['step'], g)
      if group is not None:
        out.append(group)
  return out


def _mae(pairs: Sequence[tuple[float | None, float]]) -> float:
  errors = [abs(a - b) for a, b in pairs if a is not None]
  return float(np.mean(errors)) if errors else NAN


def summarize(gs: Sequence[Group]) -> dict[str, float]:
  """The panels' numbers over some groups (one step's, or all of them pooled).

  groups; prefix_mae: |V(s) - mean r| (the read AC2 used) over its valid reads, and
  prefix_reads_invalid: how many were invalid (AC2's readiness error, `critic_error_audited` in
  metrics.jsonl, counts each as 1 and rounds the target to the grid); groups_with_reference,
  mae_ref, mae_noref: both reads on the groups with a reference where both are valid (a paired
  comparison); group_mean_mae: |mean v - mean r|; advantage_rows, advantage_corr,
  advantage_mae, advantage_scale: critic vs Monte Carlo advantages of the groups with a chunk-end
  read (scale: mean |critic A| / mean |Monte Carlo A|, NaN when the rewards agree);
  advantage_slope: sum(A_mc A_critic) / sum(A_critic^2) (NaN when every critic A is 0);
  flat_groups: share of the read groups whose critic advantages are flat (`FLAT`) and rewards not.
  """
  paired = [g for g in gs if g.reference and g.v_prefix_ref is not None
            and g.v_prefix_noref is not None]
  read = [g for g in gs if g.critic_share > 0]
  a = np.concatenate([g.critic_advantages for g in read]) if read else np.zeros((0,))
  r = np.concatenate([g.reward_advantages for g in read]) if read else np.zeros((0,))
  return {
      'groups': len(gs),
      'prefix_mae': _mae([(g.v_prefix, g.mean_reward) for g in gs]),
      'prefix_reads_invalid': sum(g.v_prefix is None for g in gs),
      'groups_with_reference': len(paired),
      'mae_ref': _mae([(g.v_prefix_ref, g.mean_reward) for g in paired]),
      'mae_noref': _mae([(g.v_prefix_noref, g.mean_reward) for g in paired]),
      'group_mean_mae': _mae([(g.mean_value, g.mean_reward) for g in gs]),
      'advantage_rows': int(a.size),
      'advantage_corr': pearson(a, r),
      'advantage_mae': float(np.mean(np.abs(a - r))) if a.size else NAN,
      'advantage_scale': _ratio(np.mean(np.abs(a)), np.mean(np.abs(r))) if a.size else NAN,
      'advantage_slope': advantage_slope(a, r),
      'flat_groups': float(np.mean([_flat(g) for g in read])) if read else NAN,
  }


def _flat(g: Group) -> bool:
  if not g.reward_advantages.size:
    return False
  return bool(np.all(np.abs(g.critic_advantages) < FLAT) and np.ptp(g.reward_advantages) > 0)


def _ratio(x: float, y: float) -> float:
  return float(x / y) if y > 0 else NAN


def per_step(gs: Sequence[Group]) -> dict[str, np.ndarray]:
  """`summarize` of each step's groups: {'step', *summary keys} over the steps with a group."""
  steps = sorted({g.step for g in gs})
  rows = [summarize([g for g in gs if g.step == s]) for s in steps]
  out = {'step': np.array(steps, np.int64)}
  for key in (rows[0] if rows else summarize([])):
    out[key] = np.array([row[key] for row in rows], np.float64)
  return out
