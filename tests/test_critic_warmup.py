"""The critic warm-up (ac2_jax/train/critic_warmup.py): its curriculum, its targets, its cache."""

import dataclasses

import jax
import numpy as np
import pytest

from ac2_jax.learner import critic_adapter
from ac2_jax.learner import rows
from ac2_jax.tasks import builtin
from ac2_jax.train import critic_warmup, experiment
from train_fixtures import compile_cache, load_config, tiny_config, train_base  # noqa: F401


def test_curriculum_parses_and_refuses_malformed_stages():
  assert critic_warmup.parse_curriculum('1:12000, 2:6000,0:100') == ((1, 12000), (2, 6000),
                                                                      (0, 100))
  assert critic_warmup.parse_curriculum('') == ()
  assert critic_warmup.parse_curriculum('1:64,t2:32') == ((1, 64), (-2, 32))
  assert critic_warmup.stage_name(-2) == 't2' and critic_warmup.stage_name(0) == '0'
  with pytest.raises(ValueError, match='tail of N >= 1'):
    critic_warmup.parse_curriculum('t0:64')
  with pytest.raises(ValueError, match='cut_lines:pairs'):
    critic_warmup.parse_curriculum('1-12000')
  with pytest.raises(ValueError, match='pairs >= 1'):
    critic_warmup.WarmupSettings(curriculum=((1, 0),))
  assert critic_warmup.WarmupSettings(curriculum=((1, 64), (0, 32))).pairs == 96


def test_config_refuses_a_warmup_without_a_prompt_critic(train_base):
  c = tiny_config(train_base, 'grpo', **{'critic.warmup': '1:64'})
  with pytest.raises(experiment.ConfigError, match='critic.warmup'):
    experiment.validate(c)
  c = tiny_config(train_base, 'ac2', **{'critic.warmup': '1:x'})
  with pytest.raises(experiment.ConfigError, match='config.critic: .*cut_lines:pairs'):
    experiment.validate(c)


def test_targets_after_one_line_by_hand_and_the_cache(train_base, compile_cache, tmp_path):
  c = tiny_config(train_base, 'ac2', **{'critic.adapter_rank': 4})
  rt, _, state = experiment.build(c, str(tmp_path / 'plain'), log=lambda *_: None)
  # Local scoring, K steps, each unwritten step right with q = 1 - m: a prefix of one line is
  # worth (6 (c + q (K - 1)) / K + [line right] q^(K-1)) / 7 for c = 1 if its line is right.
  k, q = rt.task.settings.steps, 0.5
  seen = set()
  stream = critic_warmup.exact_prefixes(rt, 'train', seed=0, cut_lines=1, mistake_rate=1 - q)
  for p in [next(stream) for _ in range(24)]:
    written, credited = p.lines
    assert written == 1
    by_hand = (6 * (credited + q * (k - 1)) / k + credited * q ** (k - 1)) / 7
    assert p.value == pytest.approx(by_hand)
    seen.add(credited)
  assert seen == {0, 1}  # both cases were checked
  # A tail stage ('t2', cut_lines -2): cut after any whole line, only its last two lines wrong.
  tails = critic_warmup.exact_prefixes(rt, 'train', seed=1, cut_lines=-2, mistake_rate=0.5)
  ends, misses = set(), set()
  for p in [next(tails) for _ in range(48)]:
    text = rt.tokenizer.decode(p.context.tolist())
    written, credited = p.lines
    attempt = text.split('<think>\n')[1].split('</think>')[0]
    problem = builtin.parse_problem(text[text.index('Start at'):])
    credits = builtin.line_credits(problem, attempt, 'local')[:written]
    assert all(credits[:written - 2]) and sum(credits) == credited
    ends.add(written)
    misses.add(written - credited)
  assert len(ends) > 3 and misses == {0, 1, 2}

  c.critic.warmup = '1:16,0:16'
  c.critic.warmup_pairs_per_update = 8
  logs = []
  _, _, warm = experiment.build(c, str(tmp_path / 'warm'), log=logs.append)
  assert any('critic warm-up: 32/32 pairs' in line for line in logs)
  # The update trained the adapter alone: the policy's weights are the warm start's.
  assert isinstance(warm, critic_adapter.AdapterState)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(warm.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  moved = [float(np.abs(np.asarray(a) - np.asarray(b)).max())
           for a, b in zip(jax.tree.leaves(state.critic_adapter),
                           jax.tree.leaves(warm.critic_adapter))]
  assert max(moved) > 0
  # A second build finds the warm-up in the workdir and restores it instead of training.
  logs.clear()
  _, _, again = experiment.build(c, str(tmp_path / 'warm'), log=logs.append)
  assert any('restored 32 pairs' in line for line in logs)
  assert not any('32/32 pairs' in line for line in logs)
  for a, b in zip(jax.tree.leaves((warm.critic_adapter, warm.critic_opt_state)),
                  jax.tree.leaves((again.critic_adapter, again.critic_opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_warmup_variant_takes_the_adapter_rate_in_either_order():
  for arg in ('bench,adapter,warmup', 'warmup,adapter'):
    c = load_config('ac2', arg)
    assert c.critic.warmup and c.critic.warmup_learning_rate == 1e-3
    assert c.critic.target == 'two_hot' and c.critic.readout == 'expectation'
  c = load_config('ac2', 'warmup')
  assert c.critic.warmup and c.critic.warmup_learning_rate == 3e-4
  assert critic_warmup.parse_curriculum(c.critic.warmup)[-1][0] == 0  # ends on every cut


def test_two_hot_targets_teach_the_critic_a_value_between_grid_points(train_base, compile_cache,
                                                                      tmp_path):
  """Trained on one prefix valued 0.44, the critic's expectation read lands on 0.44 with two-hot
  targets and on the rounded 0.4 with the paper's; the config refuses two-hot with greedy reads."""
  c = tiny_config(train_base, 'ac2', **{'critic.target': 'two_hot', 'critic.readout': 'greedy'})
  with pytest.raises(experiment.ConfigError, match='critic.readout=expectation'):
    experiment.validate(c)
  c.critic.readout = 'expectation'
  rt, _, state = experiment.build(c, str(tmp_path), log=lambda *_: None)
  prompt = rt.train_prompts[0]
  context = rt.critic_context(prompt, np.zeros(0, np.int32), None)
  record = critic_warmup._Record(target=0.4, value=0.44)
  batch = rows.critic_records_batch(rt, [context], [record])
  assert int(batch[0].upper_token_B[0]) == rt.tokenizer.token_id('0.5')
  assert float(batch[0].upper_weight_B[0]) == pytest.approx(0.4, abs=1e-6)
  reads = {}
  for target in ('two_hot', 'rounded'):
    run = dataclasses.replace(rt, critic_target=target)
    trained = jax.tree.map(lambda x: x.copy(), state)  # the critic step donates its state
    for _ in range(40):
      trained, _ = run.critic_step(trained, rows.critic_records_batch(run, [context], [record]),
                                   np.float32(1e-2))
    reads[target] = rows.expected_critic_reads(run, run.critic_params(trained), [prompt],
                                               [np.zeros(0, np.int32)], [None])[0]
  assert reads['two_hot'] == pytest.approx(0.44, abs=0.01)
  assert reads['rounded'] == pytest.approx(0.40, abs=0.01)


def test_line_verdicts_on_hand_written_attempts():
  problem = builtin.ChainProblem(start=3, ops='+*-', operands=(2, 3, 4), modulus=7)
  # 3+2=5 (right), 5*3=1 (right: 15 mod 7), 1-4=5 (wrong: 4); the verdict reads each line alone.
  text = '3+2=5\n5*3=1\n1-4=5\n'
  assert critic_warmup.line_verdicts(problem, text, 3) == (True, True, False)
  # A wrong line, then a line right from what was written: locally right.
  assert critic_warmup.line_verdicts(problem, '3+2=6\n6*3=4\n', 2) == (False, True)
  # Only the written lines are judged; an unfinished line is not one.
  assert critic_warmup.line_verdicts(problem, '3+2=5\n5*3', 1) == (True,)
  assert critic_warmup.line_verdicts(problem, '', 0) == ()


def test_exact_prefixes_carry_their_lines_verdicts(train_base, compile_cache, tmp_path):
  c = tiny_config(train_base, 'ac2')
  rt, _, _ = experiment.build(c, str(tmp_path), log=lambda *_: None)
  stream = critic_warmup.exact_prefixes(rt, 'train', seed=2, mistake_rate=0.5)
  for p in [next(stream) for _ in range(16)]:
    written, credited = p.lines
    assert len(p.verdicts) == written
    assert sum(p.verdicts) == credited  # the tiny config scores every locally right line
    assert len(p.line_texts) == written
    text = rt.tokenizer.decode(p.context.tolist())
    assert all(f'{line}\n' in text for line in p.line_texts)
    marks = ''.join('y' if v else 'n' for v in p.verdicts)
    ids, positions = critic_warmup.with_verdicts(rt, p)
    assert rt.tokenizer.decode(ids[positions].tolist()) == marks
    assert rt.tokenizer.decode(ids.tolist()).endswith(f'{marks}\nQ value: ')
    ids, positions = critic_warmup.with_verdicts(rt, p, 'lines')
    assert rt.tokenizer.decode(ids[positions].tolist()) == marks
    assert rt.tokenizer.decode(ids.tolist()).endswith(
        ''.join(f'{line}{m}\n' for line, m in zip(p.line_texts, marks)) + 'Q value: ')
    # Inline: each verdict inside the attempt, after its line's result; the prompt otherwise kept.
    ids, positions = critic_warmup.with_verdicts(rt, p, 'inline')
    assert rt.tokenizer.decode(ids[positions].tolist()) == marks
    assert np.array_equal(np.delete(ids, positions), p.context)
    assert ''.join(f'{line}{m}\n' for line, m in zip(p.line_texts, marks)) in (
        rt.tokenizer.decode(ids.tolist()))
    # Worked out: 'a op b=r c v' per line, r the step's result from the written input a.
    ids, positions = critic_warmup.with_verdicts(rt, p, 'recompute')
    worked = ''
    for line, m in zip(p.line_texts, marks):
      step, written_result = line.split('=')
      a, b = int(step[0]), int(step[2:])
      r = {'+': a + b, '-': a - b, '*': a * b}[step[1]] % rt.task.settings.modulus
      worked += f'{step}={r} {written_result}{m}\n'
      assert (r == int(written_result)) == (m == 'y')
    assert rt.tokenizer.decode(ids.tolist()).endswith(worked + 'Q value: ')
    assert rt.tokenizer.decode(ids[positions].tolist()) == ''.join(
        w.split('=')[1][0] + w[-1] for w in worked.splitlines())
