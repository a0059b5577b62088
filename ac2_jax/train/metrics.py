"""Per-step metrics: one JSONL record per step, TensorBoard scalars, and a progress line; AC2's
audited groups, one JSONL record per step beside them (`audits.jsonl`, read by
train/critic_panels).

Only process 0 writes (`MetricsLogger(..., enabled=False)` elsewhere), so multi-process runs log once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from ac2_jax.train.tensorboard import SummaryWriter

logger = logging.getLogger(__name__)

METRICS_FILE = 'metrics.jsonl'
# AC2: the audited groups of each step (algorithms/ac2.py, `audit_records`), numbers only.
AUDITS_FILE = 'audits.jsonl'


def _plain(value: Any) -> Any:
  """Converts numpy/jax scalars to Python numbers; non-finite floats become None (valid JSON)."""
  if hasattr(value, 'item') and getattr(value, 'size', 1) == 1:
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def _plain_tree(value: Any) -> Any:
  """`_plain` through nested dicts, lists, tuples and numpy arrays."""
  if isinstance(value, Mapping):
    return {str(k): _plain_tree(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim):
    return [_plain_tree(v) for v in value]
  return _plain(value)


class StepLog:
  """A JSONL file of one record per step, each appended with its newline in one write."""

  def __init__(self, path: str, enabled: bool = True):
    self.enabled = enabled
    self.path = path

  def truncate_after(self, step: int) -> None:
    """Drops records past `step` (after a resume from an earlier checkpoint), keeping the rest.

    A torn last line (the run was killed mid-append) is dropped with a warning (`read_metrics`).
    """
    if not self.enabled or not os.path.exists(self.path):
      return
    kept = [r for r in read_metrics(self.path) if r.get('step', 0) <= step]
    with open(self.path, 'w') as f:
      for record in kept:
        f.write(json.dumps(record) + '\n')

  def write(self, step: int, record: Mapping[str, Any]) -> dict:
    """Appends {'step': step, **record} (numpy numbers as Python ones, non-finite as null)."""
    plain = {'step': int(step), **_plain_tree(record)}
    if self.enabled:
      with open(self.path, 'a') as f:
        f.write(json.dumps(plain) + '\n')
    return plain


class MetricsLogger:
  """Appends step records to `workdir/metrics.jsonl` and TensorBoard events to `workdir/tb/`."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self._log = StepLog(os.path.join(workdir, METRICS_FILE), enabled)
    self.path = self._log.path
    self._tb = SummaryWriter(os.path.join(workdir, 'tb')) if enabled else None

  def truncate_after(self, step: int) -> None:
    """Drops records past `step` (`StepLog.truncate_after`)."""
    self._log.truncate_after(step)

  def write(self, step: int, record: Mapping[str, Any]) -> dict:
    plain = self._log.write(step, record)
    if self.enabled:
      self._tb.scalars(step, {k: v for k, v in plain.items() if v is not None})
    return plain

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(path: str) -> list[dict]:
  """All records of a metrics JSONL file; a malformed line is an error naming its line number.

  Except a torn last line: one without its newline that does not parse is what a run killed
  mid-append leaves behind (every record is written with its newline in one append), so it is
  dropped with a warning. A malformed line anywhere else, or one that ends in a newline, is an
  error.
  """
  with open(path, encoding='utf-8', errors='replace') as f:
    lines = f.readlines()
  records = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as e:
      if number == len(lines) and not line.endswith('\n'):
        logger.warning('%s:%d: dropped a torn last line (%d characters; the run was killed while '
                       'appending to it)', path, number, len(line))
        break
      raise ValueError(f'{path}:{number}: malformed metrics record ({e})') from None
  return records


def progress_line(record: Mapping[str, Any], keys: tuple[str, ...]) -> str:
  parts = []
  for key in keys:
    value = record.get(key)
    if value is None:
      continue
    parts.append(f'{key}={value:.4g}' if isinstance(value, float) else f'{key}={value}')
  return ' '.join(parts)


def mechanism_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
  """How far a run's critic carried it, from its per-step records (AC2; empty for the others).

  ready_problems: problems ready at the last step; first_ready_step: the first step after which
  any problem was ready (None: never); ready_fraction_second_half: mean ready fraction of replay
  slots over the second half of the steps; critic_scored_share: rows scored by the critic / rows
  generated; zero_variance_groups: mean share of replay groups with equal values, and
  zero_variance_groups/<kind> the same over the steps with groups of that request kind;
  critic_audit_corr: the mean over steps of the audits' windowed correlation of critic with Monte
  Carlo chunk advantages (the audit gate's test); critic_trusted_share: of the steps that ended
  with a ready problem, the share after which the critic scored ready chunks (below 1 only under
  controller.audit_gate); chunk_advantage_scale: over those steps, the mean factor on ready chunks'
  critic advantages (above 1 only under controller.audit_scale).
  """
  steps = [r for r in records if r.get('step', 0) > 0 and 'ready_fraction' in r]
  if not steps:
    return {}
  last = max(r['step'] for r in steps)
  ready = [r for r in steps if r.get('num_ready_problems', 0) > 0]
  second = [r['ready_fraction'] for r in steps if r['step'] > last / 2]
  rows = sum(r.get('rows_generated', 0) for r in steps)

  def mean_of(key, among=steps):
    values = [r[key] for r in among if r.get(key) is not None and r[key] == r[key]]  # no NaN
    return float(np.mean(values)) if values else None

  prefix = 'replay/zero_variance_groups/'
  kinds = sorted({k[len(prefix):] for r in steps for k in r if k.startswith(prefix)})
  return {
      'ready_problems': int(steps[-1].get('num_ready_problems', 0)),
      'first_ready_step': min(r['step'] for r in ready) if ready else None,
      'ready_fraction_second_half': float(np.mean(second)) if second else None,
      'critic_scored_share': (sum(r.get('routed_to_critic', 0) for r in steps) / rows
                              if rows else None),
      'zero_variance_groups': mean_of('replay/zero_variance_groups'),
      **{f'zero_variance_groups/{kind}': mean_of(prefix + kind) for kind in kinds},
      'critic_audit_corr': mean_of('critic_audit_corr'),
      'critic_trusted_share': mean_of('critic_trusted', ready),
      'chunk_advantage_scale': mean_of('chunk_advantage_scale', ready),
  }
