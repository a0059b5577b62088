"""PNG plots of a run from its metrics JSONL: score against decoding FLOPs and steps, readiness, critic error."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use('Agg')  # Headless: runs write files, they never open windows.
import matplotlib.pyplot as plt  # noqa: E402

from ac2_jax.train.metrics import METRICS_FILE, read_metrics  # noqa: E402


def _series(records, x_key, y_key):
  xs, ys = [], []
  for r in records:
    if r.get(x_key) is not None and r.get(y_key) is not None:
      xs.append(r[x_key])
      ys.append(r[y_key])
  return xs, ys


def _plot(path, records, x_key, y_keys, xlabel, ylabel, title, logx=False):
  fig, ax = plt.subplots(figsize=(6, 4))
  drawn = False
  for y_key in y_keys:
    xs, ys = _series(records, x_key, y_key)
    if xs:
      ax.plot(xs, ys, marker='o', markersize=3, label=y_key)
      drawn = True
  if logx and drawn:
    ax.set_xscale('log')
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  if drawn:
    ax.legend()
  else:
    ax.text(0.5, 0.5, 'no data yet', ha='center', va='center', transform=ax.transAxes)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_run(workdir: str, out_dir: str | None = None) -> list[str]:
  """Writes the standard plots of `workdir` and returns their paths."""
  records = read_metrics(os.path.join(workdir, METRICS_FILE))
  out_dir = out_dir or os.path.join(workdir, 'plots')
  os.makedirs(out_dir, exist_ok=True)
  val = ('val/mean_score', 'val/best_of_n')
  return [
      _plot(os.path.join(out_dir, 'score_vs_flops.png'), records, 'decoding_flops_cum', val,
            'cumulative decoding FLOPs', 'validation score', 'Score against decoding compute'),
      _plot(os.path.join(out_dir, 'score_vs_steps.png'), records, 'step', val,
            'step', 'validation score', 'Score against steps'),
      _plot(os.path.join(out_dir, 'ready_fraction.png'), records, 'step', ('ready_fraction',),
            'step', 'fraction of ready problems', 'Local readiness'),
      _plot(os.path.join(out_dir, 'critic_error.png'), records, 'step',
            ('critic_error', 'critic_error_audited'), 'step', 'mean |V(s) - target|',
            'Critic error'),
  ]
