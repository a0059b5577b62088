"""The exact-label critic benchmark (ac2_jax/bench/critic_exact.py) on a tiny checkpoint."""

import dataclasses

import jax
import numpy as np
import pytest

from ac2_jax import critic as critic_lib
from ac2_jax import models, sampling

from ac2_jax.bench import critic_exact
from ac2_jax.learner import rows
from ac2_jax.tasks import builtin
from ac2_jax.train import cli, critic_warmup, experiment
from train_fixtures import compile_cache, tiny_config, train_base  # noqa: F401


def test_within_position_removes_what_the_attempt_length_explains():
  """Reads that know only the lines written correlate with the values, but not within a position;
  reads that also know the lines' credit do."""
  held = [critic_warmup.ExactPrefix(np.zeros(1, np.int32), v, (n, c))
          for n, c, v in [(1, 0, 0.2), (1, 1, 0.4), (2, 1, 0.5), (2, 2, 0.7), (2, 2, 0.7)]]
  values = np.array([p.value for p in held])
  by_length = np.array([0.3, 0.3, 0.63, 0.63, 0.63])
  reads, centred = critic_exact.within_position(by_length, values, held)
  np.testing.assert_allclose(centred, [-0.1, 0.1, -0.133333, 0.066667, 0.066667], atol=1e-6)
  np.testing.assert_allclose(reads, 0.0, atol=1e-12)
  assert critic_exact.figures(by_length, held, 0.5)['corr'] > 0.8
  assert critic_exact.figures(by_length, held, 0.5)['corr_within'] == 0.0
  assert critic_exact.figures(values + 0.01, held, 0.5)['corr_within'] == pytest.approx(1.0)


def test_settings_refuse_bad_values():
  with pytest.raises(ValueError, match='labels'):
    critic_exact.ExactSettings(labels='mode')
  with pytest.raises(ValueError, match='mistake_rate'):
    critic_exact.ExactSettings(mistake_rate=1.0)
  with pytest.raises(ValueError, match='blind_fraction'):
    critic_exact.ExactSettings(blind_fraction=-0.5)


def test_config_from_args_types_overrides_and_refuses_unknown_keys():
  c = cli.config_from_args('configs/ac2.py', ['controller.tau_local=0.1', 'task.builtin_steps=6'])
  assert c.controller.tau_local == 0.1 and c.task.builtin_steps == 6
  with pytest.raises(SystemExit, match='unknown config key'):
    cli.config_from_args('configs/ac2.py', ['controller.tau_lokal=0.1'])
  with pytest.raises(SystemExit, match='no such file'):
    cli.config_from_args('configs/nope.py')


def test_exact_labels_and_a_run_on_a_tiny_checkpoint(train_base, compile_cache, tmp_path):
  c = tiny_config(train_base, 'ac2')
  rt, _, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  # Without mistakes every line is right: each prefix is worth all 7 points.
  clean = critic_exact.ExactSettings(mistake_rate=0.0)
  stream = critic_exact.prefixes(rt, clean, 'validation', seed=0)
  valid_ids = {tuple(rt.task.prompt_ids(rt.tokenizer, r)) for r in rt.task.records('validation')}
  for _ in range(8):
    p = next(stream)
    assert p.value == pytest.approx(1.0)
    written, credited = p.lines
    assert written == credited
    assert any(tuple(p.context[:len(ids)]) == ids for ids in valid_ids)
  # Blind facts, as a blind-fact setting's warm-up has them: some lines wrong without mistakes.
  blind = dataclasses.replace(clean, blind_fraction=0.5)
  assert blind.warmup().blind_fraction == 0.5 and clean.warmup().blind_fraction == 0.0
  stream = critic_exact.prefixes(rt, blind, 'validation', seed=0)
  assert min(next(stream).value for _ in range(32)) < 1.0
  # Cuts right after the first line: one line written.
  one_line = dataclasses.replace(clean, cut_lines=1)
  assert next(critic_exact.prefixes(rt, one_line, 'train', seed=0)).lines == (1, 1)
  # The control's label is the start value / 10, read off the critic prompt.
  control = dataclasses.replace(clean, labels='start')
  p = next(critic_exact.prefixes(rt, control, 'train', seed=0))
  start = builtin.parse_problem(rt.tokenizer.decode(p.context.tolist()).split('\n', 1)[1]).start
  assert p.value == pytest.approx(start / 10)
  # The table control: the last written value (no mistakes: the true one) and lines written.
  table = dataclasses.replace(clean, labels='state_lines', cut_lines=3)
  for p in [next(it) for it in [critic_exact.prefixes(rt, table, 'train', seed=1)]
            for _ in range(4)]:
    problem = builtin.parse_problem(
        rt.tokenizer.decode(p.context.tolist()).split('\n', 1)[1])
    written = p.lines[0]
    assert 1 <= written <= 3
    last = problem.values()[written - 1]
    assert p.value == critic_warmup.state_lines_value(last, written)
  settings = critic_exact.ExactSettings(pairs=32, pairs_per_update=16, eval_every=16, held_out=8,
                                        baseline_pairs=32)
  curve = critic_exact.run(rt, state, settings, log=lambda *_: None)
  assert [e['pairs'] for e in curve] == [0, 16, 32]
  for entry in curve:
    fig = entry['critic']
    assert 0.0 <= fig['mae'] <= 1.0 and fig['spread'] >= 0.0 and -1.0 <= fig['corr'] <= 1.0
  # The lookup by (lines written, lines credited) can only beat the one by lines written alone
  # on its own training table; on held-out prefixes it may not, but both are real figures.
  assert set(curve[0]) >= {'lookup', 'position', 'linear', 'self'}
  assert curve[0]['lookup']['mae_constant'] == curve[0]['critic']['mae_constant']
  # A curriculum: held out at the last stage's cut, and at each earlier stage's cut beside it.
  staged = dataclasses.replace(settings, curriculum='1:16,0:16')
  _, _, state = experiment.build(c, str(tmp_path), log=lambda *_: None)  # the update donated it
  logs = []
  curve = critic_exact.run(rt, state, staged, log=lambda *_: None,
                           on_trained=critic_exact.keep_as_warmup(c, str(tmp_path), rt, staged,
                                                                  log=logs.append))
  assert [e['pairs'] for e in curve] == [0, 16, 32]
  assert set(curve[-1]['by_cut']) == {'1'}
  assert curve[-1]['by_cut']['1']['value_spread'] > 0
  # Kept as the warm-up of the matching config: a run with it restores instead of training.
  assert any('kept as the warm-up' in line for line in logs)
  c.critic.warmup, c.critic.warmup_pairs_per_update = '1:16,0:16', 16
  # The corpus's rate as the SFT's (-1: sft.step_mistake_rate) is the same warm-up as 0.3 spelt out.
  c.sft.step_mistake_rate = 0.3
  c.critic.warmup_learning_rate, c.critic.warmup_mistake_rate = 1e-3, -1.0
  logs.clear()
  experiment.build(c, str(tmp_path), log=logs.append)
  assert any('critic warm-up: restored 32 pairs' in line for line in logs)


def test_ridge_reads_recover_a_linear_map():
  rng = np.random.default_rng(0)
  x_NxE = rng.normal(size=(64, 5))
  y_N = x_NxE @ np.array([1.0, 2.0, 0.0, 0.0, -1.0]) + 3.0
  np.testing.assert_allclose(critic_exact.ridge_reads(x_NxE, y_N, x_NxE[:4], penalty=1e-9),
                             y_N[:4], atol=1e-6)
  # A large penalty shrinks the reads to the mean.
  np.testing.assert_allclose(critic_exact.ridge_reads(x_NxE, y_N, x_NxE[:4], penalty=1e12),
                             np.full(4, y_N.mean()), atol=1e-3)


def test_critic_update_bench_on_a_tiny_checkpoint(train_base, compile_cache, tmp_path, capsys):
  """The length-split benchmark times both layouts of the same records (two batches, fewer padded
  tokens)."""
  from ac2_jax.bench import critic_update
  c = tiny_config(train_base, 'ac2')
  rt, _, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  settings = critic_update.UpdateBenchSettings(pairs=8, repeats=1)
  contexts, records = critic_update.corpus_records(rt, settings)
  assert len(records) == 16 and all(r.weight == 0.5 for r in records)
  out = critic_update.run(rt, state, settings, rows.critic_records_batch)
  assert set(out['seconds']) == {1, 2} and out['ratio'] > 0
  lines = capsys.readouterr().out.splitlines()
  padded = {int(line.split()[-3]) for line in lines if 'padded tokens' in line}
  assert len(padded) == 2  # the split pads to fewer tokens unless all records share a bucket
  with pytest.raises(ValueError, match='length_groups'):
    critic_update.UpdateBenchSettings(length_groups=1)


def test_critic_reads_bench_on_a_tiny_checkpoint(train_base, compile_cache, tmp_path, capsys):
  """The read-layout benchmark reads the same prompts both ways: the same probabilities, and the
  sorted layout's calls, each padded to its own longest, pad fewer tokens."""
  from ac2_jax.bench import critic_reads
  c = tiny_config(train_base, 'ac2')
  rt, _, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  settings = critic_reads.ReadsBenchSettings(reads=40, rows=8, repeats=1)
  out = critic_reads.run(rt, state.params, settings)
  assert len(out['seconds']) == 2 and out['ratio'] > 0
  assert out['max_abs_difference'] < 1e-5
  lines = capsys.readouterr().out.splitlines()
  padded = [int(line.split()[-5]) for line in lines if 'padded tokens' in line]
  assert len(padded) == 2 and padded[1] < padded[0]
  shapes = critic_reads.call_shapes(rt, [np.zeros(n, np.int32) for n in (20, 3, 40, 18, 35)],
                                    max_batch=2, length_sorted=True)
  assert shapes == [(8, 48), (8, 32), (8, 16)]  # 40+35, 20+18, 3: train_bucket of the longest
  with pytest.raises(ValueError, match='reads'):
    critic_reads.ReadsBenchSettings(reads=1)


@pytest.mark.parametrize('layout', ['verdicts', 'lines', 'recompute', 'inline'])
def test_a_verdict_critic_on_a_tiny_checkpoint(train_base, compile_cache, tmp_path, layout):
  c = tiny_config(train_base, 'ac2')
  rt, _, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  settings = critic_exact.ExactSettings(pairs=16, pairs_per_update=16, eval_every=16, held_out=8,
                                        baseline_pairs=32, mistake_rate=0.5, rationale=layout)
  held = [next(it) for it in [critic_exact.prefixes(rt, settings, 'validation', seed=3)]
          for _ in range(8)]
  assert any(len(p.verdicts) > 1 for p in held)
  # The fixed-point decode writes what greedy decoding, slot after slot, writes; on fresh weights,
  # whose choices turn on the context. The host's tokens stay as they were.
  noisy = models.init_params(rt.model_config, jax.random.key(1))
  yes, no = (critic_lib.prompt.verdict_token(rt.tokenizer, v) for v in (True, False))
  digits = [rt.tokenizer.encode(str(d))[0] for d in range(10)]
  own = critic_exact.decode_rationale(rt, noisy, held, layout)
  written = []
  for p, got in zip(held, own):
    ids, at = critic_warmup.with_verdicts(rt, p, layout)
    assert len(got) == len(ids) and np.array_equal(np.delete(got, at), np.delete(ids, at))
    for slot in at:
      choices = [yes, no] if ids[slot] in (yes, no) else digits
      p_c = sampling.token_distribution(rt.model_config, noisy, [ids[:slot]], choices)[0]
      ids[slot] = choices[int(np.argmax(p_c))]
    assert np.array_equal(got, ids)
    written += got[at].tolist()
  assert {yes, no} <= set(written)  # both verdicts were written
  # The self baseline's count: lines whose written result is the policy's greedy digit there,
  # each read on the context cut just before it.
  counts = critic_exact.self_checks(rt, noisy, held)
  equals = rt.tokenizer.encode('=')[0]
  for p, count in zip(held, counts):
    at = [i + 1 for i, t in enumerate(p.context.tolist()) if t == equals][:p.lines[0]]
    by_hand = sum(digits[int(np.argmax(sampling.token_distribution(
        rt.model_config, noisy, [p.context[:i]], digits)[0]))] == p.context[i] for i in at)
    assert count == by_hand <= p.lines[0]
  curve = critic_exact.run(rt, state, settings, log=lambda *_: None)
  assert [e['pairs'] for e in curve] == [0, 16]
  for entry in curve:
    fig = entry['critic']
    assert 0.0 <= fig['verdict_accuracy'] <= 1.0 and 0.0 <= fig['wrong_lines_caught'] <= 1.0
    if layout == 'recompute':
      assert 0.0 <= fig['result_accuracy'] <= 1.0
    else:
      assert fig['result_accuracy'] is None  # no worked results to score
    assert 0.0 <= fig['oracle_mae'] <= 1.0 and 0.0 <= fig['mae'] <= 1.0
  with pytest.raises(ValueError, match='rationale'):
    critic_exact.ExactSettings(rationale='essay')
