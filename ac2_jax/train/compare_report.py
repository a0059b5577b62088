"""The report of a comparison (launch/compare.py): curves from the runs' metrics.jsonl, the table
against GRPO, compare.json and the PNG plots.

Axes: cumulative decoding FLOPs (`decoding_flops_cum`, ALGORITHMS.md), steps, and wall time = the
cumulative training step time (`step_time`; evaluation excluded, as it is the same for every method).
"Reaches GRPO's peak": the first evaluation whose mean score is >= the peak of GRPO's run with the
same seed; ratios are GRPO's FLOPs (or wall time) at its peak over the method's at that point, so
2.5 means 2.5x fewer. Per method: the mean of the per-seed ratios (over the seeds where it reached)
and the ratio of the means.
"""

from __future__ import annotations

import json
import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ac2_jax.train.metrics import METRICS_FILE, read_metrics  # noqa: E402

REFERENCE = 'grpo'
SCORE = 'val/mean_score'
PER_STEP = ('ready_fraction', 'critic_error', 'critic_error_audited')


def run_curves(workdir: str) -> dict:
  """Every curve of one run, from its metrics.jsonl."""
  records = sorted(read_metrics(os.path.join(workdir, METRICS_FILE)), key=lambda r: r['step'])
  wall, evals = 0.0, {'step': [], 'score': [], 'best_of_n': [], 'flops': [], 'wall_s': []}
  per_step = {'step': [], **{k: [] for k in PER_STEP}}
  phases: dict[str, list[float]] = {}
  tokens: dict[str, list[float]] = {}
  for r in records:
    wall += r.get('step_time') or 0.0
    if r['step'] > 0:
      per_step['step'].append(r['step'])
      for k in PER_STEP:
        per_step[k].append(r.get(k))
      for k, v in r.items():
        if v is None:
          continue
        if k.startswith('time/') or k == 'step_time':
          phases.setdefault(k, []).append(v)
        elif k.startswith('tokens/') or k == 'tokens_generated':
          tokens.setdefault(k, []).append(v)
    if r.get(SCORE) is not None:
      evals['step'].append(r['step'])
      evals['score'].append(r[SCORE])
      evals['best_of_n'].append(r.get('val/best_of_n'))
      evals['flops'].append(r.get('decoding_flops_cum') or 0.0)
      evals['wall_s'].append(wall)
  return {'eval': evals, 'per_step': per_step,
          'time_per_step': {k: float(np.mean(v)) for k, v in sorted(phases.items())},
          'tokens_per_step': {k: float(np.mean(v)) for k, v in sorted(tokens.items())},
          'last_step': records[-1]['step'] if records else 0}


def _first_reach(evals: dict, target: float):
  for i, score in enumerate(evals['score']):
    if score >= target:
      return i
  return None


def _ratio(num, den):
  return num / den if num is not None and den else None


def _reach(run: dict, ref: dict, target: float, ref_i: int) -> dict:
  """Where `run` first scores `target`, against GRPO's evaluation `ref_i` of the same seed."""
  ev, ref_ev = run['curves']['eval'], ref['curves']['eval']
  i = _first_reach(ev, target)
  reach = {'target': target, 'reached': i is not None,
           'step': ev['step'][i] if i is not None else None,
           'flops': ev['flops'][i] if i is not None else None,
           'wall_s': ev['wall_s'][i] if i is not None else None,
           'reference_flops': ref_ev['flops'][ref_i], 'reference_wall_s': ref_ev['wall_s'][ref_i]}
  reach['flops_ratio'] = _ratio(reach['reference_flops'], reach['flops'])
  reach['wall_ratio'] = _ratio(reach['reference_wall_s'], reach['wall_s'])
  return reach


def build_report(runs: list[dict]) -> dict:
  """runs: [{method, seed, workdir}] -> per run curves, per method table rows.

  Two targets per seed: GRPO's peak (`reach`), and 90% of GRPO's gain from its start to its peak
  (`reach90`: start + 0.9 (peak - start), against where GRPO itself first scores that), which a
  method still climbing at the end of the run can show its cost at, where the peak is one noisy
  evaluation at GRPO's last steps."""
  for run in runs:
    run['curves'] = run_curves(run['workdir'])
    scores = run['curves']['eval']['score']
    run['peak'] = max(scores) if scores else None
  reference = {r['seed']: r for r in runs if r['method'] == REFERENCE and r['peak'] is not None}
  for run in runs:
    ref = reference.get(run['seed'])
    run['reach'] = run['reach90'] = None
    if ref is None or run['peak'] is None:
      continue
    ref_scores = ref['curves']['eval']['score']
    run['reach'] = _reach(run, ref, ref['peak'], int(np.argmax(ref_scores)))
    gain90 = ref_scores[0] + 0.9 * (ref['peak'] - ref_scores[0])
    run['reach90'] = _reach(run, ref, gain90, _first_reach(ref['curves']['eval'], gain90))
  methods = {}
  for spec in dict.fromkeys(r['method'] for r in runs):
    mine = [r for r in runs if r['method'] == spec]
    methods[spec] = _method_row(mine)
  return {'runs': runs, 'methods': methods, 'reference': REFERENCE}


def _mean(values):
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else None


def _reach_row(reaches: list[dict], prefix: str = '') -> dict:
  hit = [x for x in reaches if x['reached']]
  return {
      f'{prefix}reached': f'{len(hit)}/{len(reaches)}' if reaches else None,
      f'{prefix}reach_flops_mean': _mean([x['flops'] for x in hit]),
      f'{prefix}reach_wall_mean': _mean([x['wall_s'] for x in hit]),
      f'{prefix}flops_ratio_mean_of_ratios': _mean([x['flops_ratio'] for x in hit]),
      f'{prefix}flops_ratio_of_means': _ratio(_mean([x['reference_flops'] for x in hit]),
                                              _mean([x['flops'] for x in hit])),
      f'{prefix}wall_ratio_mean_of_ratios': _mean([x['wall_ratio'] for x in hit]),
      f'{prefix}wall_ratio_of_means': _ratio(_mean([x['reference_wall_s'] for x in hit]),
                                             _mean([x['wall_s'] for x in hit])),
  }


def _mean_per_step(runs: list[dict], section: str) -> dict:
  """A per-step mean of each run (time by phase, tokens by kind), averaged over the runs."""
  out = {}
  for r in runs:
    for k, v in r['curves'].get(section, {}).items():
      out.setdefault(k, []).append(v)
  return {k: float(np.mean(v)) for k, v in sorted(out.items())}


def _method_row(runs: list[dict]) -> dict:
  return {
      'seeds': [r['seed'] for r in runs],
      'peak_mean': _mean([r['peak'] for r in runs]),
      'peak_spread': [min(r['peak'] for r in runs), max(r['peak'] for r in runs)]
                     if all(r['peak'] is not None for r in runs) else None,
      'start_score': _mean([(r['curves']['eval']['score'] or [None])[0] for r in runs]),
      **_reach_row([r['reach'] for r in runs if r['reach'] is not None]),
      **_reach_row([r['reach90'] for r in runs if r.get('reach90') is not None], 'gain90_'),
      'time_per_step': _mean_per_step(runs, 'time_per_step'),
      'tokens_per_step': _mean_per_step(runs, 'tokens_per_step'),
  }


def _fmt(value, spec='.4f'):
  return '-' if value is None else format(value, spec)


def table(report: dict) -> str:
  head = (f'{"method":28s} {"peak":>7s} {"spread":>13s} {"reached":>7s} {"FLOPs@ref":>10s} '
          f'{"xGRPO":>6s} {"(of means)":>10s} {"wall@ref":>8s} {"xGRPO":>6s} '
          f'{"90%gain":>7s} {"xGRPO":>6s} {"(of means)":>10s}')
  lines = [f'reference: the {REFERENCE} peak of each seed; xGRPO = GRPO\'s cost / the method\'s '
           f'(mean of per-seed ratios; of the means); 90%gain: the first evaluation at 90% of '
           f'{REFERENCE}\'s gain from its start to its peak', head]
  for spec, m in report['methods'].items():
    spread = m['peak_spread']
    lines.append(f'{spec:28s} {_fmt(m["peak_mean"]):>7s} '
                 f'{(f"{spread[0]:.3f}-{spread[1]:.3f}" if spread else "-"):>13s} '
                 f'{m["reached"] or "-":>7s} {_fmt(m["reach_flops_mean"], ".3e"):>10s} '
                 f'{_fmt(m["flops_ratio_mean_of_ratios"], ".2f"):>6s} '
                 f'{_fmt(m["flops_ratio_of_means"], ".2f"):>10s} '
                 f'{_fmt(m["reach_wall_mean"], ".0f"):>8s} '
                 f'{_fmt(m["wall_ratio_mean_of_ratios"], ".2f"):>6s} '
                 f'{m["gain90_reached"] or "-":>7s} '
                 f'{_fmt(m["gain90_flops_ratio_mean_of_ratios"], ".2f"):>6s} '
                 f'{_fmt(m["gain90_flops_ratio_of_means"], ".2f"):>10s}')
  lines.append('time per step by phase (s, mean over steps and seeds; compile: tracing and '
               'compiling new programs, inside the other phases):')
  for spec, m in report['methods'].items():
    parts = ' '.join(f'{k.removeprefix("time/")}={v:.2f}' for k, v in m['time_per_step'].items())
    lines.append(f'  {spec:26s} {parts}')
  lines.append('new tokens per step by request kind (mean over steps and seeds):')
  for spec, m in report['methods'].items():
    parts = ' '.join(f'{k.removeprefix("tokens/")}={v:.0f}'
                     for k, v in m.get('tokens_per_step', {}).items())
    lines.append(f'  {spec:26s} {parts}')
  return '\n'.join(lines)


def _by_method(report):
  out = {}
  for r in report['runs']:
    out.setdefault(r['method'], []).append(r)
  return out


def _aligned(runs, section, x_key, y_key):
  """Steps present in every run -> (x mean, y mean, y min, y max) over the runs."""
  tables = []
  for r in runs:
    cur = r['curves'][section]
    tables.append({s: (x, y) for s, x, y in zip(cur['step'], cur[x_key], cur[y_key])
                   if y is not None})
  steps = sorted(set.intersection(*(set(t) for t in tables))) if tables else []
  if not steps:
    return [], [], [], []
  xs = [float(np.mean([t[s][0] for t in tables])) for s in steps]
  ys = [[t[s][1] for t in tables] for s in steps]
  return xs, [float(np.mean(y)) for y in ys], [min(y) for y in ys], [max(y) for y in ys]


def _plot(path, curves, xlabel, ylabel, title, logx=False):
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for label, (xs, mean, low, high), style in curves:
    if not xs:
      continue
    line, = ax.plot(xs, mean, style, marker='o', markersize=3, label=label)
    if len(xs) > 1:
      ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2)
  if logx and any(c[1][0] for c in curves):
    ax.set_xscale('symlog')
  ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
  if any(c[1][0] for c in curves):
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def plot_report(report: dict, out_dir: str) -> list[str]:
  os.makedirs(out_dir, exist_ok=True)
  by = _by_method(report)
  band = '(mean over seeds, band: min-max)'
  paths = []
  for x_key, name, xlabel in (('flops', 'score_vs_flops', 'cumulative decoding FLOPs'),
                              ('step', 'score_vs_steps', 'step'),
                              ('wall_s', 'score_vs_wall', 'training wall time (s)')):
    curves = [(m, _aligned(runs, 'eval', x_key, 'score'), '-') for m, runs in by.items()]
    paths.append(_plot(os.path.join(out_dir, f'{name}.png'), curves, xlabel,
                       'mean validation score', f'Validation score {band}'))
  ac2 = {m: runs for m, runs in by.items() if m.split(':')[0] == 'ac2'}
  paths.append(_plot(os.path.join(out_dir, 'ready_fraction.png'),
                     [(m, _aligned(r, 'per_step', 'step', 'ready_fraction'), '-')
                      for m, r in ac2.items()],
                     'step', 'ready fraction of replay slots', f'AC2 readiness {band}'))
  curves = []
  for m, r in ac2.items():
    curves.append((f'{m} (all)', _aligned(r, 'per_step', 'step', 'critic_error'), '-'))
    curves.append((f'{m} (audited)', _aligned(r, 'per_step', 'step', 'critic_error_audited'), '--'))
  paths.append(_plot(os.path.join(out_dir, 'critic_error.png'), curves, 'step',
                     'mean |V(s) - target|', f'AC2 critic error {band}'))
  return paths


def write_report(runs: list[dict], root: str, settings: dict | None = None) -> dict:
  """Builds the report of `runs`, writes ROOT/compare.json and ROOT/plots/*.png; returns it."""
  report = build_report([dict(r) for r in runs])
  report['settings'] = settings or {}
  report['plots'] = plot_report(report, os.path.join(root, 'plots'))
  report['table'] = table(report)
  with open(os.path.join(root, 'compare.json'), 'w') as f:
    json.dump(report, f, indent=1)
  return report
