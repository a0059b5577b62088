"""launch/compare.py's library on a tiny setting (2 methods, 1 seed, 2 steps): one warm start per
seed, compare.json and the plots, a rerun that skips finished runs and resumes an unfinished one;
launch/evaluate.py's library (mean@n, best-of-n, pass@k) on the runs' checkpoints; and the AC2
run's audited groups (audits.jsonl) with the critic diagnostics notebook drawn from its workdir
(every problem is made ready after step 1, so step 2 has ready chunks and audits)."""

import dataclasses
import itertools
import json
import math
import os

import numpy as np
import pytest

from ac2_jax.bench import chain_errors
from ac2_jax.controller import readiness
from ac2_jax.train import (checkpoint_eval, compare, compare_report, critic_panels, experiment,
                           loop)
from test_notebooks import execute_notebook
from train_fixtures import (CONFIGS, SMALL, compile_cache, length_credit_build_task,  # noqa: F401
                            read_records, tiny_config, train_base)

pytestmark = pytest.mark.usefixtures('compile_cache')

STEPS = 2


def _settings(train_base, root):
  data_dir, _ = train_base
  small = {k: v for k, v in SMALL.items() if not k.startswith('eval.') and k != 'checkpoint_every'}
  small.update({'num_steps': STEPS, 'task.data_dir': data_dir,
                'controller.audit_fraction': 0.5})  # 2 of AC2's 4 ready slots at step 2
  return compare.CompareSettings(methods=('grpo', 'ac2'), seeds=(0,), root=root,
                                 configs_dir=CONFIGS, eval_every=2, eval_problems=4,
                                 eval_responses=2, overrides=tuple(small.items()))


@pytest.fixture(scope='module')
def compared(train_base, compile_cache, tmp_path_factory):  # noqa: F811
  """Runs the tiny comparison once, counting trainer calls and warm starts."""
  root = str(tmp_path_factory.mktemp('compare'))
  counts = {'train': 0, 'warm': 0}
  real_train, real_initial = loop.train, experiment.initial_checkpoint

  def train(*args, **kwargs):
    counts['train'] += 1
    return real_train(*args, **kwargs)

  def initial_checkpoint(c, *args, **kwargs):  # the fixture's 2-layer warm start stands in for SFT
    if c.model.init_checkpoint:  # a run's own build, given the seed's warm start
      return real_initial(c, *args, **kwargs)
    counts['warm'] += 1
    return train_base[1]

  def all_ready(self, has_reference_P):
    """Every problem ready after AC2's step 1: the tiny warm start's critic reads nothing valid,
    so none would pass the readiness tests in 2 steps."""
    del has_reference_P
    flipped = np.flatnonzero(~self.ready_P)
    self.ready_P[:] = True
    return flipped

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(loop, 'train', train)
    mp.setattr(readiness.Readiness, 'update', all_ready)
    mp.setattr(experiment, 'initial_checkpoint', initial_checkpoint)
    lines = []
    report = compare.compare(_settings(train_base, root), log=lines.append)
    yield {'root': root, 'report': report, 'counts': counts, 'lines': lines, 'mp': mp}


def test_compare_writes_json_and_plots(compared):
  root, counts = compared['root'], compared['counts']
  assert counts == {'train': 2, 'warm': 1}  # one warm start for the seed's two methods
  with open(os.path.join(root, 'compare.json')) as f:
    report = json.load(f)
  assert set(report['methods']) == {'grpo', 'ac2'}
  for run in report['runs']:
    assert run['curves']['eval']['step'] == [0, 2]
    assert run['curves']['last_step'] == STEPS
    assert set(run['curves']['time_per_step']) >= {'step_time', 'time/generate'}
    assert run['reach'] is not None and run['reach']['target'] == report['methods']['grpo'][
        'peak_mean']
  ac2_run = next(r for r in report['runs'] if r['method'] == 'ac2')
  assert len(ac2_run['curves']['per_step']['ready_fraction']) == STEPS
  names = {os.path.basename(p) for p in report['plots']}
  assert names == {'score_vs_flops.png', 'score_vs_steps.png', 'score_vs_wall.png',
                   'ready_fraction.png', 'critic_error.png'}
  for p in report['plots']:
    assert os.path.getsize(p) > 1000
  assert 'grpo' in report['table'] and 'time per step by phase' in report['table']
  ac2_tokens = report['methods']['ac2']['tokens_per_step']
  assert ac2_tokens['tokens/ready_chunk'] > 0 and ac2_tokens['tokens/refill'] > 0
  kinds = [v for k, v in ac2_tokens.items() if k.startswith('tokens/')]
  assert sum(kinds) == pytest.approx(ac2_tokens['tokens_generated'])
  assert set(report['methods']['grpo']['tokens_per_step']) == {'tokens_generated'}
  assert 'ready_chunk=' in report['table']
  assert any('eta=' in line and line.startswith('[1/2 grpo seed 0] step=') for line in
             compared['lines'])


def test_ac2_run_writes_its_audited_groups(compared, train_base):
  settings = _settings(train_base, compared['root'])
  workdir = compare.run_dir(settings, compare.parse_method('ac2'), 0)
  metrics, audits = critic_panels.read_workdir(workdir)
  records = {r['step']: r for r in metrics}
  assert [a['step'] for a in audits] == [1, 2] and audits[0]['groups'] == []
  assert records[2]['ready_fraction'] == 1.0 and records[2]['num_ready_chunk'] == 2
  groups = audits[1]['groups']
  assert len(groups) == records[2]['num_audit'] == 2
  c = compare.run_config(settings, compare.parse_method('ac2'), 0)
  chunk, budget = c.controller.chunk_size, c.controller.response_budget
  for g in groups:
    assert g['reference']  # the bank starts with the data set's solutions
    assert 0 <= g['cut'] < budget and len(g['rewards']) == c.controller.group_size
    assert all(0.0 <= r <= 1.0 for r in g['rewards'])  # full continuations, all judged
    assert all(0 < n <= budget - g['cut'] for n in g['new_tokens'])
    assert g['chunk_end_read'] == [n > chunk for n in g['new_tokens']]
    for value in (g['v_prefix_ref'], g['v_prefix_noref'], *g['chunk_end_value']):
      assert value is None or 0.0 <= value <= 1.0
    assert all(read or v is None for read, v in zip(g['chunk_end_read'], g['chunk_end_value']))
  assert any(any(g['chunk_end_read']) for g in groups)
  assert len(critic_panels.groups(audits)) == 2
  grpo_dir = compare.run_dir(settings, compare.parse_method('grpo'), 0)
  assert not os.path.exists(os.path.join(grpo_dir, 'audits.jsonl'))  # no critic, no audits


@pytest.mark.slow
def test_critic_diagnostics_notebook_on_the_ac2_run(compared, train_base):
  workdir = compare.run_dir(_settings(train_base, compared['root']),
                            compare.parse_method('ac2'), 0)
  nb = execute_notebook('notebooks/critic_diagnostics.ipynb', {'WORKDIR': workdir})
  text = ''.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code'
                 for o in c.get('outputs', []))
  assert f'{STEPS} steps; {STEPS} steps with audit records, 2 audited groups' in text, text


def test_rerun_skips_finished_and_resumes_unfinished(compared, train_base):
  root, counts, mp = compared['root'], compared['counts'], compared['mp']
  settings = _settings(train_base, root)
  grpo_dir = compare.run_dir(settings, compare.parse_method('grpo'), 0)
  before = read_records(grpo_dir)
  lines = []
  compare.compare(settings, log=lines.append)
  assert counts['train'] == 2, 'finished runs must be skipped'
  assert sum('skipped' in line for line in lines) == 2

  os.remove(os.path.join(grpo_dir, 'summary.json'))  # as if the run had been stopped
  lines = []
  compare.compare(settings, log=lines.append)
  assert counts['train'] == 3 and counts['warm'] == 2
  assert any('resumed from step 2' in line for line in lines), lines
  assert read_records(grpo_dir) == before  # nothing recomputed
  del mp


def test_parse_methods_and_configs(compared, train_base):
  m = compare.parse_method('ac2:chunk_small+no_audit')
  assert m.variants == ('chunk_small', 'no_audit') and m.dirname == 'ac2-chunk_small-no_audit'
  assert m.config_arg('bench') == 'bench,chunk_small,no_audit'
  with pytest.raises(ValueError, match="unknown method 'evaluate'"):
    compare.parse_method('evaluate:no_audit')
  with pytest.raises(ValueError, match='unknown Prefix GRPO config arguments'):
    compare.load_config(CONFIGS, compare.parse_method('prefix_grpo:no_audit'), '')
  pg = compare.load_config(CONFIGS, compare.parse_method('prefix_grpo:at_uncredited'), 'bench')
  assert pg.controller.cut_before_uncredited and pg.controller.cut_at_uncredited
  assert compare.parse_method('grpo:async').config_arg('bench') == 'bench,async'
  with pytest.raises(ValueError, match='unknown GRPO config arguments'):
    compare.load_config(CONFIGS, compare.parse_method('grpo:no_audit'), '')
  s = _settings(train_base, compared['root'])
  c = compare.run_config(s, m, 1)
  assert (c.seed, c.eval.every, c.controller.no_audit, c.num_steps) == (1, 2, True, STEPS)


def test_method_overrides_reach_only_the_methods_they_name(train_base, tmp_path):
  s = dataclasses.replace(_settings(train_base, str(tmp_path)), method_overrides=(
      ('ac2', 'critic.warmup', '0:40'), ('ac2:no_audit', 'num_steps', 7)))
  plain, no_audit, grpo = (compare.parse_method(m) for m in ('ac2', 'ac2:no_audit', 'grpo'))
  assert compare.run_config(s, plain, 0).critic.warmup == '0:40'
  assert compare.run_config(s, plain, 0).num_steps == STEPS
  c = compare.run_config(s, no_audit, 0)
  assert (c.critic.warmup, c.num_steps) == ('0:40', 7)
  assert compare.run_config(s, grpo, 0).num_steps == STEPS  # GRPO's config has no critic.warmup
  compare.check_method_overrides(s, [plain, no_audit, grpo])
  with pytest.raises(ValueError, match='ac2:no_audit/num_steps names no method'):
    compare.check_method_overrides(s, [plain, grpo])


def test_summarize_pass_at_k_by_hand():
  scores = np.array([[1.0, 0.0, 0.5, 1.0],   # c = 2 of n = 4
                     [0.0, 0.0, 0.0, 0.0],   # c = 0
                     [1.0, 1.0, 1.0, 0.2]])  # c = 3
  out = checkpoint_eval.summarize(scores, (1, 2, 4, 8), np.random.default_rng(0))
  # pass@2: 1 - C(2,2)/C(4,2) = 5/6; 0; 1 - C(1,2)/C(4,2) = 1  -> mean 11/18
  assert out['pass_at_k'] == pytest.approx({'1': (2 / 4 + 0 + 3 / 4) / 3, '2': 11 / 18,
                                            '4': 2 / 3})
  assert out['mean_at_n'] == pytest.approx(scores.mean())
  assert out['correct_per_problem'] == [2, 0, 3] and out['full_marks'] == pytest.approx(5 / 12)


def _pass_at_k_by_enumeration(correct, n, k):
  """Share of the k-subsets of n responses (c of them correct) holding a correct one."""
  responses = [True] * correct + [False] * (n - correct)
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(responses[i] for i in s) for s in subsets) / len(subsets)


def test_evaluate_workdir_step_and_hf(compared, train_base, tmp_path):
  mp = compared['mp']
  mp.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  workdir = compare.run_dir(_settings(train_base, compared['root']),
                            compare.parse_method('grpo'), 0)
  kwargs = dict(num_problems=4, num_responses=4, ks=(1, 2, 3), log=lambda *_: None)
  out = checkpoint_eval.evaluate_checkpoint(workdir, **kwargs)
  assert out['kind'] == 'workdir' and out['step'] == STEPS
  assert out['decoding_flops_cum'] == pytest.approx(read_records(workdir)[STEPS][
      'decoding_flops_cum'])
  for k in (1, 2, 3):
    expected = np.mean([_pass_at_k_by_enumeration(c, 4, k) for c in out['correct_per_problem']])
    assert out['pass_at_k'][str(k)] == pytest.approx(expected)
  assert 'pass@3' in checkpoint_eval.table(out)

  step_dir = os.path.join(workdir, 'checkpoints', str(STEPS))
  assert checkpoint_eval.resolve(step_dir).step == STEPS
  hf = checkpoint_eval.evaluate_checkpoint(train_base[1], config=tiny_config(train_base, 'grpo'),
                                           scratch_dir=str(tmp_path), **kwargs)
  assert hf['kind'] == 'hf' and hf['decoding_flops_cum'] is None
  assert 0.0 <= hf['mean_at_n'] <= 1.0 and math.isfinite(hf['best_of_n'])


def test_chain_errors_of_a_run(compared, train_base, capsys):
  mp = compared['mp']
  mp.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  workdir = compare.run_dir(_settings(train_base, compared['root']),
                            compare.parse_method('grpo'), 0)
  chain_errors.main(['--checkpoint', workdir, '--problems', '2', '--responses', '3'])
  out = capsys.readouterr().out.splitlines()
  assert out[0] == f'{workdir}, step {STEPS}' and 'over 6 responses' in out[1]
  histogram = [int(n) for n in out[2].rsplit(': ', 1)[1].split()]
  assert sum(histogram) == 6
  with pytest.raises(SystemExit, match='--problems'):
    chain_errors.main(['--checkpoint', workdir, '--problems', '0'])


def test_report_reaches_by_hand(tmp_path):
  """GRPO 0.2 -> 0.5 -> 0.6 at 0 / 10 / 20 FLOPs; the method 0.2 -> 0.58 -> 0.55 at 0 / 4 / 8. The
  method never reaches GRPO's peak 0.6; 90% of GRPO's gain is 0.56, which GRPO first scores at 20
  FLOPs and the method at 4: 5x fewer."""
  def workdir(name, scores, flops):
    d = tmp_path / name
    d.mkdir()
    with open(d / 'metrics.jsonl', 'w') as f:
      for step, (score, fl) in enumerate(zip(scores, flops)):
        f.write(json.dumps({'step': step * 5, 'val/mean_score': score, 'decoding_flops_cum': fl,
                            'step_time': 1.0}) + '\n')
    return str(d)
  runs = [{'method': 'grpo', 'seed': 0, 'workdir': workdir('g', [0.2, 0.5, 0.6], [0, 10, 20])},
          {'method': 'ac2', 'seed': 0, 'workdir': workdir('a', [0.2, 0.58, 0.55], [0, 4, 8])}]
  report = compare_report.build_report(runs)
  ac2 = report['methods']['ac2']
  assert ac2['reached'] == '0/1' and ac2['flops_ratio_mean_of_ratios'] is None
  assert ac2['gain90_reached'] == '1/1'
  assert ac2['gain90_flops_ratio_mean_of_ratios'] == pytest.approx(5.0)
  assert runs[1]['reach90']['target'] == pytest.approx(0.56)
  assert report['methods']['grpo']['gain90_flops_ratio_of_means'] == pytest.approx(1.0)
  assert '90%gain' in compare_report.table(report)


def test_a_signal_stops_the_whole_comparison(train_base, tmp_path):
  """SIGTERM during a run (preemption): the run saves its checkpoint and the comparison ends there,
  the next run not started and no report written; the rerun then resumes the stopped run."""
  import signal
  data_dir, sft_dir = train_base
  settings = dataclasses.replace(
      _settings(train_base, str(tmp_path)), methods=('grpo', 'prefix_grpo'),
      overrides=_settings(train_base, str(tmp_path)).overrides + (
          ('model.init_checkpoint', sft_dir), ('task.data_dir', data_dir)))
  lines = []

  def log(line):
    lines.append(line)
    if 'grpo seed 0] step=1 ' in line and '[1/2' in line:
      os.kill(os.getpid(), signal.SIGTERM)  # a real signal, caught by the trainer

  report = compare.compare(settings, log=log)
  assert report['stopped'] and [r['status'] for r in report['runs']] == ['stopped']
  assert any('stopped at step 1 of 2 (checkpoint saved)' in line for line in lines), lines
  assert not os.path.exists(compare.run_dir(settings, compare.parse_method('prefix_grpo'), 0))
  assert not os.path.exists(os.path.join(str(tmp_path), 'compare.json'))
  lines = []
  report = compare.compare(settings, log=lines.append)
  assert 'table' in report and any('resumed from step 1' in line for line in lines), lines


def test_a_run_written_before_a_key_existed_is_read_with_its_old_value(tmp_path):
  """`evaluate.py` on a run stored before `critic.target` (and the `rollout` section) existed: the
  key takes the value that reproduces the run, the section its defaults; stored values stay."""
  from ac2_jax.train import defaults, run_record
  stored = defaults.base_config().to_dict()
  del stored['critic']['target'], stored['rollout']
  stored['critic']['adapter_rank'] = 16
  (tmp_path / 'config.json').write_text(json.dumps(stored))
  c = checkpoint_eval.run_config(str(tmp_path))
  assert c.critic.target == run_record.ADDED_KEYS['critic.target'] == 'rounded'
  assert c.rollout.to_dict() == defaults.base_config().rollout.to_dict()
  assert c.critic.adapter_rank == 16
