"""The built-in chain-arithmetic task: generation, splits, scoring, tfds build, tokenizer, SFT."""

import dataclasses
import hashlib
import os
import sys

import numpy as np
import pytest

from ac2_jax import tokenization as T
from ac2_jax.judges import grading
from ac2_jax.tasks import base
from ac2_jax.tasks import builtin
from ac2_jax.tasks import builtin_sft
from ac2_jax.tasks import builtin_tfds

SMALL = builtin.ChainSettings(num_train=1500, num_validation=64)
LEADING = dataclasses.replace(SMALL, scoring='leading')
# Start 11, modulo 13: 11-5=6, 6+3=9, 9+2=11, 11*4=5, 5*12=8, 8+1=9, 9+12=8, 8-3=5.
PROBLEM = builtin.ChainProblem(start=11, ops='-++**++-', operands=(5, 3, 2, 4, 12, 1, 12, 3),
                               modulus=13)
RIGHT = ('11-5=6\n6+3=9\n9+2=11\n11*4=5\n5*12=8\n8+1=9\n9+12=8\n8-3=5\n</think>\n\n'
         '<answer>5</answer>')


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp('builtin_data'))
  task, tok = builtin_tfds.build_builtin(data_dir, SMALL)
  return data_dir, task, tok


@pytest.fixture(scope='module')
def record():
  return builtin.to_record(PROBLEM, 'validation')


def test_problem_arithmetic_and_prompt_round_trip():
  assert PROBLEM.values() == [6, 9, 11, 5, 8, 9, 8, 5]
  assert PROBLEM.answer == 5
  assert builtin.parse_problem(PROBLEM.prompt()) == PROBLEM
  assert builtin.response_text(PROBLEM, PROBLEM.values()) == RIGHT
  with pytest.raises(ValueError, match='not a built-in chain prompt'):
    builtin.parse_problem('What is 2+2?')
  with pytest.raises(ValueError, match='invertible'):
    builtin.ChainProblem(start=1, ops='*', operands=(13,), modulus=13)


LABELLED = builtin.ChainProblem(start=11, ops='-++**++-', operands=(5, 3, 2, 4, 12, 1, 12, 3),
                                modulus=13, labels=True)


def test_labelled_chain_prompt_lines_and_scoring(tmp_path):
  prompt = LABELLED.prompt()
  assert prompt.startswith('Start at 11 and apply modulo 13:\na-5\nb+3\nc+2\nd*4\n')
  assert builtin.parse_problem(prompt) == LABELLED
  text = builtin.response_text(LABELLED, LABELLED.values())
  assert text == '\n'.join(c + line for c, line in zip('abcdefgh', RIGHT.split('\n'))) + \
      RIGHT[RIGHT.index('\n</think>'):]
  assert builtin.score_response(LABELLED, text, 'leading_fine').points == 7
  # The label guides and is not scored: a wrong letter keeps the line, a wrong step loses it.
  assert builtin.line_credits(LABELLED, text.replace('c9+2', 'x9+2'), 'leading') == [True] * 8
  assert builtin.line_credits(LABELLED, text.replace('c9+2', 'c9+3'), 'leading') == \
      [True] * 2 + [False] * 6
  assert builtin_sft.prefix_value(LABELLED, LABELLED.values(), text[:text.index('d')], 1.0,
                                  'leading_fine') == 1.0
  with pytest.raises(ValueError, match='at most 26 steps'):
    builtin.ChainSettings(steps=27, labels=True)
  settings = builtin.ChainSettings(num_train=300, num_validation=32, labels=True)
  assert builtin_tfds.config_for(settings).name == builtin_tfds.config_for(
      dataclasses.replace(settings, labels=False)).name + '_l'
  # One per line, a step's letter is the same token in the prompt as at the start of its line.
  task, tok = builtin_tfds.build_builtin(str(tmp_path), settings)
  record = task.records('validation')[0]
  problem = builtin.parse_problem(record.prompt)
  assert problem.labels
  prompt_ids = tok.encode(record.prompt)
  response_ids = tok.encode(builtin.response_text(problem, problem.values()))
  for i in range(problem.steps):
    letter = tok.encode('\n' + problem.label(i))[1:]
    assert len(letter) == 1 and letter[0] in prompt_ids and letter[0] in response_ids


def test_generation_is_deterministic_and_seeded():
  a, b = builtin.generate(SMALL), builtin.generate(SMALL)
  assert a == b
  other = builtin.generate(builtin.ChainSettings(num_train=1500, num_validation=64, seed=1))
  assert [p.key() for p in other['train']] != [p.key() for p in a['train']]
  assert len(a['train']) == 1500 and len(a['validation']) == 64


def test_splits_are_disjoint_and_stable():
  problems = builtin.generate(SMALL)
  keys = {s: {p.key() for p in problems[s]} for s in base.SPLITS}
  assert len(keys['train']) == 1500 and len(keys['validation']) == 64  # no duplicates
  assert not keys['train'] & keys['validation']
  # A problem's split depends on its content only, so no seed can move it to the other split.
  for split, ps in problems.items():
    for p in ps:
      digest = int(hashlib.sha256(p.key().encode()).hexdigest()[:8], 16)
      assert (digest % SMALL.validation_every == 0) == (split == 'validation')
  task = builtin.BuiltinTask.generate(SMALL)
  ids = {s: {r.id for r in task.records(s)} for s in base.SPLITS}
  assert not ids['train'] & ids['validation']
  with pytest.raises(ValueError, match='share problems'):
    builtin.BuiltinTask(SMALL, {'train': task.records('validation'),
                                'validation': task.records('validation')})
  with pytest.raises(ValueError, match='unknown split'):
    task.records('test')


def test_difficulty_knob():
  hard = builtin.generate(builtin.ChainSettings(steps=12, modulus=11, num_train=50,
                                                num_validation=10))
  for p in hard['train']:
    assert p.steps == 12 and p.modulus == 11
    assert all(0 <= v < 11 for v in p.values())
  with pytest.raises(ValueError, match='prime'):
    builtin.ChainSettings(modulus=12)
  with pytest.raises(ValueError, match='steps'):
    builtin.ChainSettings(steps=0)
  with pytest.raises(ValueError, match='distinct problems'):
    builtin.generate(builtin.ChainSettings(steps=1, modulus=5, num_train=100, num_validation=10))


def test_every_mistake_dooms_the_answer():
  for p in builtin.generate(builtin.ChainSettings(num_train=20, num_validation=5))['train']:
    truth = p.values()
    for step in range(p.steps):
      for wrong in range(p.modulus):
        if wrong != truth[step]:
          assert builtin.written_values(p, step, wrong)[-1] != p.answer


def _score(task, record, text):
  grade = task.score(record, text)
  assert grade.valid
  return grade.points


def test_leading_scoring_hand_written_solutions(record):
  task = builtin.BuiltinTask.generate(LEADING)
  assert _score(task, record, RIGHT) == 7
  assert _score(task, record, RIGHT + '<|im_end|>') == 7
  # Early mistake: 11-5 written as 7; carried on correctly from 7, the answer is wrong.
  early = ('11-5=7\n7+3=10\n10+2=12\n12*4=9\n9*12=4\n4+1=5\n5+12=4\n4-3=1\n</think>\n\n'
           '<answer>1</answer>')
  assert _score(task, record, early) == 0
  # Late mistake: only the last step is wrong: floor(6 * 7 / 8) = 5.
  late = RIGHT.replace('-3=5\n', '-3=4\n').replace('<answer>5', '<answer>4')
  assert _score(task, record, late) == 5
  # Mistake in the middle: 4 right steps: floor(6 * 4 / 8) = 3.
  middle = ('11-5=6\n6+3=9\n9+2=11\n11*4=5\n5*12=7\n7+1=8\n8+12=7\n7-3=4\n</think>\n\n'
            '<answer>4</answer>')
  assert _score(task, record, middle) == 3
  # All steps right but the answer copied wrongly: 6.
  assert _score(task, record, RIGHT.replace('<answer>5', '<answer>6')) == 6
  # A right answer after a broken chain earns nothing for the answer.
  assert _score(task, record, early.replace('<answer>1', '<answer>5')) == 0
  # A step with the wrong operand breaks the prefix even when its value is right: 2 right steps.
  assert _score(task, record, RIGHT.replace('+2=11', '+1=11')) == 1
  # So does a wrongly copied previous value: 3 right steps.
  assert _score(task, record, RIGHT.replace('\n11*4=5', '\n10*4=5')) == 2


# Four right lines, then a wrong fifth ('5*12=7') and lines that follow from it.
MIDDLE = ('11-5=6\n6+3=9\n9+2=11\n11*4=5\n5*12=7\n7+1=8\n8+12=7\n7-3=4\n</think>\n\n'
          '<answer>4</answer>')


def test_replay_cut_end_is_the_start_of_the_first_line_without_credit(record, built):
  _, _, tok = built
  fine = builtin.BuiltinTask.generate(dataclasses.replace(SMALL, scoring='leading_fine'))
  middle = MIDDLE
  # Four right lines, the fifth ('5*12=7') is the first without credit.
  assert fine.replay_cut_end(record, middle) == middle.index('5*12=7')
  assert fine.replay_cut_end(record, middle) == len('11-5=6\n6+3=9\n9+2=11\n11*4=5\n')
  assert fine.replay_cut_end(record, '11-5=7\n7+3=10\n') == 0
  # All right: the start of the last line, so a continuation still writes one.
  assert fine.replay_cut_end(record, RIGHT) == RIGHT.index('8-3=5')
  # Stopped after three right lines: the whole thinking section may be kept.
  stopped = '11-5=6\n6+3=9\n9+2=11\n</think>\n\n<answer>11</answer>'
  assert fine.replay_cut_end(record, stopped) == stopped.index('</think>')
  assert builtin.BuiltinTask.generate(LEADING).replay_cut_end(record, middle) == len(
      '11-5=6\n6+3=9\n9+2=11\n11*4=5\n')
  # Local credit: a continuation can earn any later line, so there is no end.
  assert builtin.BuiltinTask.generate(SMALL).replay_cut_end(record, middle) is None
  # In tokens: the prefix of that many ids is the four right lines, the next id starts line 5.
  ids = tok.encode(middle)
  t = T.tokens_within(tok, ids, fine.replay_cut_end(record, middle))
  assert tok.decode(ids[:t]) == '11-5=6\n6+3=9\n9+2=11\n11*4=5\n'
  assert tok.decode(ids[t:]).startswith('5*12=7')
  assert T.tokens_within(tok, ids, 0) == 0 and T.tokens_within(tok, ids, 10_000) == len(ids)


def test_replay_chunk_end_is_just_past_the_first_line_without_credit(record, built):
  _, _, tok = built
  fine = builtin.BuiltinTask.generate(dataclasses.replace(SMALL, scoring='leading_fine'))
  middle = MIDDLE
  # The fifth line ('5*12=7') is the first without credit: the chunk reaches past its newline.
  assert fine.replay_chunk_end(record, middle) == middle.index('7+1=8')
  assert fine.replay_chunk_end(record, '11-5=7\n7+3=10\n') == len('11-5=7\n')
  # The first uncredited line is the last one written: its newline, else the thinking's end.
  assert fine.replay_chunk_end(record, '11-5=6\n6+3=8\n') == len('11-5=6\n6+3=8\n')
  assert fine.replay_chunk_end(record, '11-5=6\n6+3=8</think>') == len('11-5=6\n6+3=8')
  # Every written line right (all of them, or stopped early): no line to reach.
  assert fine.replay_chunk_end(record, RIGHT) is None
  assert fine.replay_chunk_end(record, '11-5=6\n6+3=9\n</think>\n\n<answer>9</answer>') is None
  assert builtin.BuiltinTask.generate(SMALL).replay_chunk_end(record, middle) is None
  # In tokens, rounded up: the prefix of that many ids holds the whole fifth line.
  ids = tok.encode(middle)
  t = T.tokens_reaching(tok, ids, fine.replay_chunk_end(record, middle))
  assert tok.decode(ids[:t]).startswith('11-5=6\n6+3=9\n9+2=11\n11*4=5\n5*12=7\n')
  assert len(tok.decode(ids[:t - 1])) < middle.index('7+1=8')
  assert T.tokens_reaching(tok, ids, 0) == 0 and T.tokens_reaching(tok, ids, 10_000) == len(ids)


def test_local_scoring_hand_written_solutions(record):
  task = builtin.BuiltinTask.generate(SMALL)
  assert task.settings.scoring == 'local'
  assert _score(task, record, RIGHT) == 7
  # Early mistake (11-5 written as 7), then 7 lines that follow from what was written: 6 * 7 / 8.
  early = ('11-5=7\n7+3=10\n10+2=12\n12*4=9\n9*12=4\n4+1=5\n5+12=4\n4-3=1\n</think>\n\n'
           '<answer>1</answer>')
  assert _score(task, record, early) == 5.25
  # The right answer after a broken chain still earns nothing for the answer.
  assert _score(task, record, early.replace('<answer>1', '<answer>5')) == 5.25
  # A slip in the middle (5*12 written as 7) keeps the credit of the lines after it.
  middle = ('11-5=6\n6+3=9\n9+2=11\n11*4=5\n5*12=7\n7+1=8\n8+12=7\n7-3=4\n</think>\n\n'
            '<answer>4</answer>')
  assert _score(task, record, middle) == 5.25
  assert _score(task, record, RIGHT.replace('<answer>5', '<answer>6')) == 6
  # A wrong operand loses that line only.
  assert _score(task, record, RIGHT.replace('+2=11', '+1=11')) == 5.25
  # A wrongly copied previous value loses its line even when its arithmetic holds (10*4=1), and
  # the next line, which starts from the true 5 instead of the written 1, loses its line too.
  assert _score(task, record, RIGHT.replace('\n11*4=5', '\n10*4=1')) == 4.5
  # Two lines and an answer: 6 * 2 / 8.
  assert _score(task, record, '11-5=6\n6+3=9\n</think>\n\n<answer>9</answer>') == 1.5
  assert builtin.line_credits(PROBLEM, middle) == [True] * 4 + [False] + [True] * 3
  assert builtin.line_credits(PROBLEM, middle, 'leading') == [True] * 4 + [False] * 4
  # A partial response is read as far as it goes.
  assert builtin.line_credits(PROBLEM, '11-5=6\n6+3=8\n9+2') == [True, False] + [False] * 6
  with pytest.raises(ValueError, match='scoring'):
    dataclasses.replace(SMALL, scoring='best')


def test_scoring_malformed_truncated_empty(record):
  task = builtin.BuiltinTask.generate(LEADING)
  malformed = 'let me think\nthe answer is five\n</think>\n\n<answer>five</answer>'
  assert task.score(record, malformed) == grading.Grade(
      points=0, status=grading.STATUS_OK, detail='correct steps 0/8, answer wrong')
  assert _score(task, record, RIGHT.replace('<answer>5', '<answer>5.0')) == 6
  assert _score(task, record, RIGHT.replace('*4=5', '*4 = five')) == 2  # 3 right steps
  # The same credit on fine points: 6 * 3 / 8, where 'leading' pays floor(18 / 8).
  fine = builtin.BuiltinTask.generate(dataclasses.replace(SMALL, scoring='leading_fine'))
  assert _score(fine, record, RIGHT.replace('*4=5', '*4 = five')) == 2.25
  assert _score(fine, record, RIGHT) == 7
  assert builtin.line_credits(PROBLEM, RIGHT.replace('+2=11', '+1=11'), 'leading_fine') == \
      [True] * 2 + [False] * 6
  for text in ('', RIGHT[:20], RIGHT.split('</think>')[0],  # truncated inside the thinking
               RIGHT[:-len('</answer>')],  # answer block never closed
               RIGHT.replace('</think>', ''),  # no thinking section end
               '<answer>5</answer>'):  # an answer inside the thinking section
    grade = task.score(record, text)
    assert grade == grading.no_answer_grade(), text
    assert not task.has_complete_answer(text)
  assert task.has_complete_answer(RIGHT)


def test_score_batch_never_raises(record):
  task = builtin.BuiltinTask.generate(SMALL)
  alien = base.ProblemRecord(id='x', split='train', prompt='Prove that 1 + 1 = 2.')
  grades = task.score_batch([record, alien, record], [RIGHT, RIGHT, ''])
  assert [g.points for g in grades] == [7, None, 0]
  assert grades[1].status == grading.STATUS_INTERNAL_ERROR
  assert 'not a built-in chain prompt' in grades[1].detail


def test_beside_layout_pairs_each_written_line_with_the_references():
  """'beside': attempt line i then reference line i, the reference's later lines and its answer
  alone; the plain layouts and the instruction without a reference do not read the response."""
  reference = RIGHT.replace('\n</think>\n\n', '\n')
  attempt = '11-5=6\n6+3=2\n2+2=4\n4*'  # a wrong second line carried on, a partial fourth
  text = builtin.beside_reference(reference, attempt)
  assert text.split('\n')[:5] == ['11-5=6 11-5=6', '6+3=2 6+3=9', '2+2=4 9+2=11', '4* 11*4=5',
                                   '5*12=8']
  assert text.endswith('8-3=5\n<answer>5</answer>')
  assert builtin.beside_reference(reference, '') == reference
  task = builtin.BuiltinTask.generate(dataclasses.replace(SMALL, critic_prompt='beside'))
  assert task.critic_sees_response
  assert task.critic_instruction(reference, attempt) == (
      'Q value of this attempt?\nSolution:\n' + text)
  assert task.critic_instruction(None, attempt) == task.critic_instruction(None)
  short = builtin.BuiltinTask.generate(dataclasses.replace(SMALL, critic_prompt='short'))
  assert not short.critic_sees_response
  assert short.critic_instruction(reference, attempt) == short.critic_instruction(reference)


def test_task_protocol_reference_and_critic(record):
  task = builtin.BuiltinTask.generate(SMALL)
  assert isinstance(task, base.Task)
  assert task.name == 'builtin_chain'
  assert task.reference_from_response(RIGHT + '<|im_end|>') == record.reference_solution
  assert task.reference_from_response(RIGHT[:30]) is None
  plain = task.critic_instruction(None)
  with_ref = task.critic_instruction(record.reference_solution)
  assert 'Q value: z' in plain and 'Q value: z' in with_ref
  assert record.reference_solution in with_ref and record.reference_solution not in plain
  # The critic module substitutes its own '{reference}' slot into the text.
  assert task.critic_instruction('{reference}').count('{reference}') == 1


def test_answer_block_helper():
  assert base.answer_block('x</think>\n<proof>P</proof>', '<proof>', '</proof>') == 'P'
  assert base.answer_block('<proof>P</proof></think>', '<proof>', '</proof>') is None
  assert base.answer_block('</think><proof>P', '<proof>', '</proof>') is None
  assert base.after_thinking('abc') is None
  with pytest.raises(ValueError, match='empty prompt'):
    base.ProblemRecord(id='a', split='train', prompt='')


def test_build_builtin_tfds(built):
  data_dir, task, tok = built
  assert 'tensorflow' not in sys.modules
  expected = builtin.BuiltinTask.generate(SMALL)
  for split in base.SPLITS:
    assert list(task.records(split)) == list(expected.records(split))
  config_dir = os.path.join(data_dir, 'builtin_chain', builtin_tfds.config_for(SMALL).name)
  files = [f for _, _, fs in os.walk(config_dir) for f in fs]
  assert any('train.array_record' in f for f in files)
  assert any('validation.array_record' in f for f in files)
  # A second build reuses the data set and the tokenizer file.
  model = os.path.join(data_dir, 'builtin_chain_tokenizer',
                       builtin_tfds.config_for(SMALL).name + '_v512.model')
  stamp = os.stat(model).st_mtime_ns
  task2, tok2 = builtin_tfds.build_builtin(data_dir, SMALL)
  assert os.stat(model).st_mtime_ns == stamp
  assert tok2.serialized_model == tok.serialized_model
  assert task2.records('validation') == task.records('validation')


def test_builtin_tokenizer(built):
  _, task, tok = built
  assert tok.vocab_size <= 512
  for piece in builtin.SPECIAL_SYMBOLS + tuple('0123456789'):
    assert tok.encode(piece) == [tok.token_id(piece)], piece
  assert tok.encode('Q value: ') + tok.encode('0.3') == tok.encode('Q value: 0.3')
  assert tok.encode('0.3') == [tok.token_id('0.3')]
  assert tok.encode('1') == [tok.token_id('1')]
  r = task.records('validation')[0]
  assert tok.decode(task.prompt_ids(tok, r)) == (
      f'<|im_start|>user\n{r.prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n')
  # The whole critic instruction stays short (it is in every critic prompt).
  assert len(tok.encode(task.critic_instruction(None))) < 100


def test_sft_examples(built):
  _, task, tok = built
  stream = list(builtin_sft.sft_examples(task, tok, mistake_rate=0.0, seed=3))
  assert len(stream) == len(task.records('train'))
  again = list(builtin_sft.sft_examples(task, tok, mistake_rate=0.0, seed=3))
  assert all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(stream, again))
  by_prompt = {tuple(task.prompt_ids(tok, r)): r for r in task.records('train')}
  lengths = []
  for prompt_ids, response_ids in stream[:300]:
    assert prompt_ids.dtype == np.int32 and response_ids.dtype == np.int32
    assert response_ids[-1] == tok.eos_id
    record = by_prompt[tuple(prompt_ids.tolist())]
    assert task.score(record, tok.decode(response_ids)).points == 7
    lengths.append(len(response_ids))
  # K = 8 steps: 40-80 response tokens, at least four chunks of 10 tokens.
  assert 40 <= min(lengths) and max(lengths) <= 80
  # Prompt + response equals the whole conversation rendered by the chat template.
  record = by_prompt[tuple(stream[0][0].tolist())]
  problem = builtin.parse_problem(record.prompt)
  thinking, content = builtin.thinking_and_answer(problem, problem.values())
  chat = T.render_chat(tok, [T.Turn('user', record.prompt),
                             T.Turn('assistant', content, thinking=thinking)],
                       generation_prompt=False)
  assert list(stream[0][0]) + list(stream[0][1]) == chat[:-len(tok.encode('\n'))]


def test_sft_mistake_rate(built):
  _, task, tok = built
  records = {tuple(task.prompt_ids(tok, r)): r for r in task.records('train')}

  def solved_share(rate, step_rate=0.0):
    stream = builtin_sft.sft_examples(task, tok, mistake_rate=rate, step_mistake_rate=step_rate,
                                      seed=0)
    points = [task.score(records[tuple(p.tolist())], tok.decode(r)).points
              for p, r in list(stream)[:400]]
    return np.mean([p == 7 for p in points])

  assert solved_share(1.0) == 0.0
  assert 0.6 < solved_share(0.3) < 0.8
  # Independent mistakes per step: (1 - 0.2) ** 8 = 0.17 of the solutions stay right.
  assert 0.11 < solved_share(0.0, 0.2) < 0.23
  with pytest.raises(ValueError, match='step_mistake_rate'):
    next(builtin_sft.sft_examples(task, tok, mistake_rate=0.0, step_mistake_rate=-0.1))
  forever = builtin_sft.sft_examples(task, tok, mistake_rate=0.1, epochs=None)
  assert sum(1 for _ in zip(range(2 * len(records) + 5), forever)) == 2 * len(records) + 5
  with pytest.raises(ValueError, match='mistake_rate'):
    next(builtin_sft.sft_examples(task, tok, mistake_rate=1.5))


def test_sft_clean_first(built):
  _, task, tok = built
  records = {tuple(task.prompt_ids(tok, r)): r for r in task.records('train')}
  stream = builtin_sft.sft_examples(task, tok, mistake_rate=0.0, step_mistake_rate=0.5, seed=0,
                                    clean_first=100)
  points = [task.score(records[tuple(p.tolist())], tok.decode(r)).points
            for p, r in list(stream)[:300]]
  assert all(p == 7 for p in points[:100])
  # Half of the steps wrong: (1/2) ** 8 of the later solutions are right.
  assert np.mean([p == 7 for p in points[100:]]) < 0.05
  with pytest.raises(ValueError, match='clean_first'):
    next(builtin_sft.sft_examples(task, tok, mistake_rate=0.0, clean_first=-1))


def test_prefix_value_by_hand():
  truth = PROBLEM.values()
  right = builtin.response_text(PROBLEM, truth)

  def value(text, q, values=truth):
    return builtin_sft.prefix_value(PROBLEM, values, text, q) * 7

  # Nothing written, every step right with probability 1 or 0.
  assert value('', 1.0) == pytest.approx(7) and value('', 0.0) == pytest.approx(0)
  # q = 1/2 from the start: c = g with probability 2^-(g+1), c = 8 with 2^-8; points floor(6c/8).
  pts = [(6 * c) // 8 for c in range(8)]
  expected = sum(0.5 ** (g + 1) * pts[g] for g in range(8)) + 0.5 ** 8 * 7
  assert value('', 0.5) == pytest.approx(expected)
  # Three right lines written (the third without its line break yet): c >= 3.
  three = right[:right.index('11\n') + 2]
  assert three.endswith('9+2=11')
  expected3 = sum(0.5 ** (g + 1) * pts[3 + g] for g in range(5)) + 0.5 ** 5 * 7
  assert value(three, 0.5) == pytest.approx(expected3)
  # '9+2=1' is not yet a complete line (the true value has two digits): c >= 2 only.
  expected2 = sum(0.5 ** (g + 1) * pts[2 + g] for g in range(6)) + 0.5 ** 6 * 7
  assert value(three[:-1], 0.5) == pytest.approx(expected2)
  # A wrong third value fixes the credit at two lines whatever follows.
  wrong = builtin.written_values(PROBLEM, 2, 12)
  text = builtin.response_text(PROBLEM, wrong)
  assert value(text[:text.index('=12') + 3], 0.9, wrong) == pytest.approx(pts[2])
  assert value(text, 0.9, wrong) == pytest.approx(pts[2])
  assert value(right, 0.0) == pytest.approx(7)


def test_prefix_value_local_scoring_by_hand():
  def value(text, q, values):
    return builtin_sft.prefix_value(PROBLEM, values, text, q, 'local') * 7

  truth = PROBLEM.values()
  # Nothing written, q = 1/2: 6 * (8 / 2) / 8 for the lines, the bonus with probability 2^-8.
  assert value('', 0.5, truth) == pytest.approx(3 + 0.5 ** 8)
  # A wrong third value costs its line only; the bonus is gone.
  wrong = builtin.written_values(PROBLEM, 2, 12)
  text = builtin.response_text(PROBLEM, wrong)
  assert value(text[:text.index('=12') + 3], 0.9, wrong) == pytest.approx(6 * (2 + 0.9 * 5) / 8)
  assert value(text, 0.9, wrong) == pytest.approx(6 * 7 / 8)
  assert value(builtin.response_text(PROBLEM, truth), 0.0, truth) == pytest.approx(7)


def test_critic_examples_frame_the_critic_prompt(built):
  from ac2_jax import critic
  _, task, tok = built
  stream = builtin_sft.critic_examples(task, tok, step_mistake_rate=0.3, seed=1)
  targets, with_reference = [], 0
  for _, (context, target) in zip(range(200), stream):
    text = tok.decode(context.tolist())
    assert text.endswith(critic.prompt.ANSWER_STEM)
    assert text.startswith('<|im_start|>user\nStart at ')
    with_reference += 'Compare with a correct solution' in text
    assert target[-1] == tok.eos_id
    targets.append(critic.parse_value(tok.decode(target[:-1].tolist())))
  assert None not in targets
  assert 60 < with_reference < 140
  # The targets spread: late cuts of clean solutions, and cuts after several mistakes (under the
  # default local scoring a mistake costs its own line only).
  assert len(set(targets)) >= 4 and max(targets) - min(targets) >= 0.4
  # The same seed gives the same stream.
  a, b = (next(builtin_sft.critic_examples(task, tok, step_mistake_rate=0.3, seed=1))
          for _ in range(2))
  assert (a[0] == b[0]).all() and (a[1] == b[1]).all()


def test_a_build_prints_one_plain_line_and_no_download(tmp_path, capfd):
  builtin_tfds.build_builtin(str(tmp_path), SMALL)
  out = capfd.readouterr()
  printed = out.out + out.err
  assert f'data set builtin_chain/{builtin_tfds.config_for(SMALL).name} written to ' in printed
  # tfds's own banners (bold, and about a download that never happens) are gone; its progress
  # bars are the launchers' to switch off (console.quiet_progress_bars).
  assert 'Downloading and preparing' not in printed and 'downloaded and prepared' not in printed


def test_blind_facts_are_a_fixed_share_of_all_facts():
  every = builtin.blind_facts(7, 1.0)
  assert len(every) == 7 * (6 + 6 + 5)  # x in 0..6; + and - by 1..6, * by 2..6
  assert builtin.blind_facts(7, 0.0) == frozenset()
  some, more = builtin.blind_facts(7, 0.3), builtin.blind_facts(7, 0.6)
  assert some < more < every  # one hash per fact: a larger share keeps the smaller one's facts
  many = builtin.blind_facts(101, 0.3)
  assert abs(len(many) / (101 * 299) - 0.3) < 0.02
  assert (3, '*', 1) not in every and (0, '+', 0) not in every
  with pytest.raises(ValueError, match='blind fraction'):
    builtin.blind_facts(7, 1.5)


def test_blind_sample_values_guess_there_and_carry_on():
  blind = frozenset({(11, '-', 5)})  # step 0 of PROBLEM from its start
  rng = np.random.default_rng(0)
  firsts = []
  for _ in range(1300):
    values = builtin_sft.sample_values(PROBLEM, rng, 0.0, 0.0, blind)
    firsts.append(values[0])
    # Every later step follows from the value written before it (no step mistakes).
    assert all(PROBLEM.apply(i, v) == values[i] for i, v in enumerate(values[:-1], 1))
  counts = np.bincount(firsts, minlength=13)
  assert counts.min() > 60 and counts.max() < 140  # uniform over 0..12 (100 each)
  # A fact the chain never meets changes nothing.
  assert builtin_sft.sample_values(PROBLEM, rng, 0.0, 0.0, frozenset({(0, '*', 2)})) == \
      PROBLEM.values()
  with pytest.raises(ValueError, match='step mistakes'):
    builtin_sft.sample_values(PROBLEM, rng, 0.5, 0.0, blind)


def test_blind_prefix_value_by_hand():
  truth = PROBLEM.values()
  right = builtin.response_text(PROBLEM, truth)

  def value(text, q, scoring, blind, values=truth):
    return builtin_sft.prefix_value(PROBLEM, values, text, q, scoring, frozenset(blind)) * 7

  start_blind = {(11, '-', 5)}
  # Step 0 is a guess (right 1 time in 13); the value it writes fixes nothing later.
  assert value('', 1.0, 'local', start_blind) == pytest.approx(6 * (7 + 1 / 13) / 8 + 1 / 13)
  assert value('', 1.0, 'leading', start_blind) == pytest.approx(7 / 13)
  # Once the guess is written the rest is sure (q = 1), and a wrong guess keeps its line only.
  wrong = builtin.written_values(PROBLEM, 0, 12)
  wrong_text = builtin.response_text(PROBLEM, wrong)
  assert value(wrong_text[:wrong_text.index('\n')], 1.0, 'local', start_blind, wrong) == \
      pytest.approx(6 * 7 / 8)
  assert value(right[:right.index('\n')], 1.0, 'local', start_blind) == pytest.approx(7)
  # A blind fact met only off the true path: step 1 from 12 (true: 6), q = 0.9. Step 0 writes 12
  # with probability 0.1 / 12; step 1 is then right 1 time in 13, else with probability 0.9.
  off = 0.1 / 12
  step1 = (1 - off) * 0.9 + off / 13
  assert value('', 0.9, 'local', {(12, '+', 3)}) == pytest.approx(
      6 * (0.9 + step1 + 6 * 0.9) / 8 + 0.9 ** 8)
  assert value('', 0.9, 'leading', {(12, '+', 3)}) == pytest.approx(value('', 0.9, 'leading', ()))
  # A fact no path meets gives the closed forms, for every prefix and both scorings.
  never = {(0, '*', 2)}
  for cut in (0, 10, right.index('11\n') + 2, len(right)):
    for scoring in builtin.SCORINGS:
      for values in (truth, wrong):
        text = builtin.response_text(PROBLEM, values)[:cut]
        assert value(text, 0.7, scoring, never, values) == pytest.approx(
            value(text, 0.7, scoring, (), values))


def test_blind_prefix_value_is_the_mean_score_of_the_corpus():
  problem = builtin.ChainProblem(start=3, ops='*+-*+-*+-*+-', operands=(2, 4, 6, 3, 1, 2, 5, 6,
                                                                        3, 4, 1, 5), modulus=7)
  blind = builtin.blind_facts(7, 0.5)
  rng = np.random.default_rng(1)
  samples = [builtin_sft.sample_values(problem, rng, 0.0, 0.3, blind) for _ in range(4000)]
  for scoring in builtin.SCORINGS:
    scores = np.asarray([builtin.score_response(problem, builtin.response_text(problem, v),
                                                scoring).points / 7 for v in samples])
    exact = builtin_sft.prefix_value(problem, samples[0], '', 0.7, scoring, blind)
    assert abs(scores.mean() - exact) < 4 * scores.std() / np.sqrt(len(scores)) + 1e-9
    # After the first line: the samples that wrote the same first value.
    first = samples[0][0]
    kept = np.asarray([v[0] == first for v in samples])
    text = builtin.response_text(problem, samples[0])
    exact1 = builtin_sft.prefix_value(problem, samples[0], text[:text.index('\n')], 0.7, scoring,
                                      blind)
    assert abs(scores[kept].mean() - exact1) < 4 * scores[kept].std() / np.sqrt(kept.sum()) + 1e-9


def test_chain_corpus_with_blind_facts(built):
  _, task, _ = built
  corpus = builtin_sft.corpus_of(task, step_mistake_rate=0.2, blind_fraction=1.0)
  problem = corpus.parse(task.records('train')[0].prompt)
  rng = np.random.default_rng(0)
  # Every fact blind: even clean solutions are guesses, so they are seldom right.
  right = [corpus.sample(problem, rng, clean=True) == problem.values() for _ in range(50)]
  assert sum(right) <= 2
  assert corpus.value(problem, problem.values(), '') == pytest.approx(
      (6 / 13 + 13 ** -8) / 7)  # SMALL: K = 8, modulus 13; every line a 1-in-13 guess
  with pytest.raises(ValueError, match='blind facts go with step mistakes'):
    builtin_sft.corpus_of(task, mistake_rate=0.1, blind_fraction=0.5)
