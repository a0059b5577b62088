"""Per-step metrics: one JSONL record per step, TensorBoard scalars, and a progress line.

Only process 0 writes (`MetricsLogger(..., enabled=False)` elsewhere), so multi-process runs log once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Mapping

from ac2_jax.train.tensorboard import SummaryWriter

logger = logging.getLogger(__name__)

METRICS_FILE = 'metrics.jsonl'


def _plain(value: Any) -> Any:
  """Converts numpy/jax scalars to Python numbers; non-finite floats become None (valid JSON)."""
  if hasattr(value, 'item') and getattr(value, 'size', 1) == 1:
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


class MetricsLogger:
  """Appends step records to `workdir/metrics.jsonl` and TensorBoard events to `workdir/tb/`."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, METRICS_FILE)
    self._tb = SummaryWriter(os.path.join(workdir, 'tb')) if enabled else None

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
    plain = {'step': int(step), **{k: _plain(v) for k, v in record.items()}}
    if self.enabled:
      with open(self.path, 'a') as f:
        f.write(json.dumps(plain) + '\n')
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
