"""The critic's self-check (`critic.self_check`, critic/self_check.py): each worked line of the
attempt marked with whether the policy's own greedy result there is the one written."""

import dataclasses

import jax
import numpy as np
import pytest

from ac2_jax import models, sampling
from ac2_jax.bench import critic_exact
from ac2_jax.critic import self_check
from ac2_jax.learner import rows
from ac2_jax.train import experiment, loop
from train_fixtures import (compile_cache, length_credit_build_task, load_config,  # noqa: F401
                            read_records, tiny_config, train_base)


@pytest.fixture(scope='module')
def built(train_base, tmp_path_factory):
  c = tiny_config(train_base, 'ac2', critic__self_check=True)
  return experiment.build(c, str(tmp_path_factory.mktemp('self_check')), log=lambda *_: None)


def _context(rt, response: str, reference: str | None = None):
  prompt = rt.train_prompts[0]
  return rt.critic_context(prompt, rt.tokenizer.encode(response), reference)


def test_result_spans_and_verdicts_on_a_hand_written_attempt(built):
  rt, _, _ = built
  tok = rt.tokenizer
  # Two whole lines and a third cut after its result, before its break: two results to check.
  # The reference (after the attempt in the prompt) has lines of its own, which are not checked.
  context = _context(rt, '3+2=5\n5*3=12\n1-4=5', reference='3+2=5\n5*3=1\n')
  spans = self_check.result_spans(tok, context)
  assert [tok.decode(context[a:b].tolist()) for a, b in spans] == ['5', '12']
  assert all(tok.decode([int(context[b])]) == '\n' for _, b in spans)
  ids, positions = self_check.with_verdicts(tok, context, spans, [True, False])
  assert '3+2=5y\n5*3=12n\n1-4=5' in tok.decode(ids.tolist())
  assert tok.decode(ids[positions].tolist()) == 'yn'
  assert np.array_equal(np.delete(ids, positions), context)
  # A line is right when every digit of its result is the predicted one.
  predicted = np.array([context[spans[0][0]], context[spans[1][0]], 0])
  assert self_check.verdicts_from(context, spans, predicted) == [True, False]
  with pytest.raises(ValueError, match='2 lines'):
    self_check.with_verdicts(tok, context, spans, [True])
  assert self_check.result_spans(tok, _context(rt, '')) == []


def test_self_checked_prompts_carry_the_policys_greedy_check(built):
  rt, _, state = built
  tok = rt.tokenizer
  digits = self_check.digit_ids(tok)
  noisy = models.init_params(rt.model_config, jax.random.key(3))

  def greedy(response: str) -> str:  # the digit these weights would write next
    context = rt.train_prompts[0].tolist() + tok.encode(response)
    p = sampling.token_distribution(rt.model_config, noisy, [np.asarray(context)], digits)[0]
    return tok.decode([digits[int(np.argmax(p))]])

  # One line as these weights would write it, one not: both verdicts appear.
  agreed = '3+2=' + greedy('3+2=') + '\n'
  other = str((int(greedy(agreed + '5*3=')) + 1) % 10)
  responses = [agreed + '5*3=' + other + '\n1-4=5\n', '0+1=1\n1*2=2\n2-6=3\n3+3=6\n',
               '4-4=0\n0', '']
  contexts = [_context(rt, r) for r in responses]
  checked = rows.self_checked(rt, noisy, contexts)
  yes, no = (tok.encode(v)[0] for v in 'yn')
  said = []
  for context, got in zip(contexts, checked):
    spans = self_check.result_spans(tok, context)
    by_hand = []
    for first, end in spans:  # each result digit read on the context cut just before it
      by_hand.append(all(
          digits[int(np.argmax(sampling.token_distribution(
              rt.model_config, noisy, [context[:i]], digits)[0]))] == context[i]
          for i in range(first, end)))
    ids, _ = self_check.with_verdicts(tok, context, spans, by_hand)
    assert np.array_equal(got, ids)
    said += by_hand
  assert True in said and False in said
  # The paper's critic: prompts as they are.
  plain = dataclasses.replace(rt, critic_marks='')
  assert all(a is b for a, b in zip(rows.self_checked(plain, noisy, contexts), contexts))
  # A prompt that no longer fits once marked is dropped, like one that never fit; None stays.
  tight = dataclasses.replace(rt, max_total_len=len(contexts[1]) + sampling.MAX_VALUE_TOKENS)
  out = rows.self_checked(tight, noisy, [contexts[1], None, contexts[3]])
  assert out[0] is None and out[1] is None and np.array_equal(out[2], contexts[3])
  # The readers build their prompts this way.
  built_here = rows.critic_contexts(rt, noisy, [rt.train_prompts[0]] * 2,
                                    [tok.encode(r) for r in responses[:2]], [None, None])
  assert all(np.array_equal(a, b) for a, b in zip(built_here, checked[:2]))
  # The exact probe's `self` count is the number of lines whose verdict is y.
  assert [sum(v) for _, v in rows.self_check_verdicts(rt, noisy, contexts)] == [
      list(c).count(yes) - list(x).count(yes) for c, x in zip(checked, contexts)]
  del no, state


def test_a_self_checking_run_trains_and_reads_marked_prompts(train_base, tmp_path, monkeypatch):
  """Two AC2 steps with the adapter: the critic's reads and its update build their prompts through
  `rows.self_checked` (the real function, counted) on a runtime whose critic self-checks (the
  3-step warm start writes no whole lines yet: the marking itself is checked above)."""
  monkeypatch.setattr(experiment, 'build_task', length_credit_build_task(experiment.build_task))
  calls = []
  real = rows.self_checked

  def counted(rt, params, contexts):
    calls.append(rt.critic_marks)
    return real(rt, params, contexts)

  monkeypatch.setattr(rows, 'self_checked', counted)
  c = tiny_config(train_base, 'ac2', 'adapter', num_steps=2, critic__self_check=True)
  assert loop.train(c, str(tmp_path), log=lambda *_: None).last_step == 2
  records = read_records(str(tmp_path))
  assert all(records[s]['critic/pairs'] > 0 and np.isfinite(records[s]['critic/loss'])
             for s in (1, 2))
  assert len(calls) >= 4 and all(calls)  # each step's reads and its update


def test_self_check_is_a_setting_of_the_chain_and_of_ac2(train_base):
  c = load_config('ac2', 'bench,adapter,self_check')
  assert c.critic.self_check and c.critic.target == 'two_hot'
  assert c.critic.warmup and c.critic.warmup_learning_rate == 1e-3  # the adapter's rate
  experiment.validate(c)
  plain = c.copy_and_resolve_references()
  plain.critic.self_check = False  # a warm-up on unmarked prompts is another critic
  assert (experiment.critic_warmup_key(c, '/ckpt')
          != experiment.critic_warmup_key(plain, '/ckpt'))
  with pytest.raises(experiment.ConfigError, match='critic.self_check'):
    experiment.validate(tiny_config(train_base, 'grpo', critic__self_check=True))
  with pytest.raises(experiment.ConfigError, match='critic.self_check'):
    experiment.validate(tiny_config(train_base, 'ac2', 'walk', critic__self_check=True))


def test_exact_probe_reports_the_self_check(built):
  rt, _, state = built
  settings = critic_exact.ExactSettings(pairs=16, pairs_per_update=16, eval_every=16, held_out=8,
                                        baseline_pairs=32, mistake_rate=0.5)
  curve = critic_exact.run(rt, state, settings, log=lambda *_: None)
  assert [e['pairs'] for e in curve] == [0, 16]
  assert all(0.0 <= e['critic']['self_check_accuracy'] <= 1.0 for e in curve)
  with pytest.raises(ValueError, match='without --rationale'):
    critic_exact.run(rt, state, dataclasses.replace(settings, rationale='inline'),
                     log=lambda *_: None)


def test_reference_marks_say_which_lines_are_the_references(built):
  """`critic.reference_check`: a line is marked y when its input, step and result are the
  reference's line of the same index; lines are indexed as the scorer reads the thinking."""
  rt, _, _ = built
  tok = rt.tokenizer
  marking = dataclasses.replace(rt, critic_marks='reference')
  reference = '3+2=5\n5*3=1\n1-4=4\n<answer>4</answer>'
  # Right, a wrong result, a right result of the wrong step, and an unfinished line (not checked).
  context = _context(rt, '3+2=5\n5*3=2\n1-3=4\n4-1', reference=reference)
  got = rows.self_checked(marking, None, [context])[0]
  assert '3+2=5y\n5*3=2n\n1-3=4n\n4-1' in tok.decode(got.tolist())
  # A line without a result still counts as a line: the next one is compared with line 2.
  context = _context(rt, '3+2=5\n5+1\n1-4=4\n', reference=reference)
  spans = self_check.result_spans(tok, context)
  assert self_check.attempt_lines(tok, context, spans) == [(0, '3+2=5'), (2, '1-4=4')]
  assert rows.reference_verdicts(marking, [context])[0][1] == [True, True]
  # Past the reference's last line, or with no reference in the prompt: unmarked or wrong.
  context = _context(rt, '3+2=5\n5*3=1\n1-4=4\n4+1=5\n', reference=reference)
  assert rows.reference_verdicts(marking, [context])[0][1] == [True, True, True, False]
  bare = _context(rt, '3+2=5\n', reference=None)
  assert rows.reference_verdicts(marking, [bare])[0][1] is None
  assert np.array_equal(rows.self_checked(marking, None, [bare])[0], bare)


def test_reference_check_is_a_setting_of_the_chain_and_of_ac2(train_base):
  c = load_config('ac2', 'bench,adapter,reference_check')
  assert c.critic.reference_check and not c.critic.self_check and c.critic.warmup
  experiment.validate(c)
  assert experiment.critic_marks(c) == 'reference'
  assert experiment.critic_marks(load_config('ac2', 'bench,self_check')) == 'self'
  other = c.copy_and_resolve_references()
  other.critic.reference_check, other.critic.self_check = False, True
  assert (experiment.critic_warmup_key(c, '/ckpt')
          != experiment.critic_warmup_key(other, '/ckpt'))
  with pytest.raises(experiment.ConfigError, match='set one'):
    experiment.validate(_both(other))
  with pytest.raises(experiment.ConfigError, match='critic.reference_check'):
    experiment.validate(tiny_config(train_base, 'grpo', critic__reference_check=True))


def _both(c):
  c = c.copy_and_resolve_references()
  c.critic.reference_check = c.critic.self_check = True
  return c
