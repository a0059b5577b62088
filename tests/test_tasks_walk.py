"""The built-in walk task: rules, hand-scored responses, exact state values, data set, corpora."""

import numpy as np
import pytest

from ac2_jax import critic
from ac2_jax import tokenization as T
from ac2_jax.judges import grading
from ac2_jax.tasks import builtin_sft, builtin_tfds, walk

SETTINGS = walk.WalkSettings()
MENU = SETTINGS.menu  # +1 +5 *2 to 100, traps end in 7


def problem(start=12, budget=4):
  return walk.WalkProblem(start, budget, 100, MENU, 7)


def answer(text, value):
  return f'{text}\n{T.THINK_CLOSE}\n\n<answer>{value}</answer>'


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  return builtin_tfds.build_builtin(str(tmp_path_factory.mktemp('walk')), SETTINGS, vocab_size=512)


def test_distances_by_hand():
  p = problem()
  assert p.distance(100) == 0 and p.distance(50) == 1 and p.distance(99) == 1
  assert p.distance(95) == 1  # +5
  assert p.distance(25) == 2  # *2 *2
  assert p.distance(24) == 3 and p.best_moves(24) == [('+', 1)]  # 25 50 100
  assert p.distance(12) == 4 and p.best_moves(12) == [('*', 2)]  # 24 25 50 100 (12+5 is a trap)
  assert p.distance(101) == walk.UNREACHABLE and p.distance(47) == walk.UNREACHABLE
  assert p.dead(47) and p.dead(101) and not p.dead(100) and not p.dead(46)
  assert p.best_moves(47) == []


def test_distance_is_shortest_by_brute_force():
  p = problem()
  for start in range(1, 100):
    frontier, d = {start}, 0
    while 100 not in frontier and d < 30 and frontier:
      frontier = {p.apply(x, m) for x in frontier for m in MENU if not p.dead(p.apply(x, m))}
      d += 1
    expected = d if 100 in frontier else walk.UNREACHABLE
    if p.dead(start):
      continue
    assert p.distance(start) == expected, start


def test_prompt_round_trip_and_split():
  problems = walk.generate(SETTINGS)
  train, val = problems['train'], problems['validation']
  assert {q.key() for q in train}.isdisjoint({q.key() for q in val})
  for q in train[:20] + val[:5]:
    assert walk.parse_problem(q.prompt()) == q
    assert SETTINGS.min_distance <= q.distance(q.start) <= SETTINGS.max_distance
    assert q.distance(q.start) <= q.budget <= q.distance(q.start) + SETTINGS.slack
  assert walk.generate(SETTINGS) == problems
  with pytest.raises(ValueError, match='not a built-in walk prompt'):
    walk.parse_problem('Start at 7 and apply modulo 13: +5\n')


def test_reference_is_a_shortest_walk_that_scores_7():
  for q in walk.generate(SETTINGS)['validation'][:30]:
    ref = walk.reference_text(q)
    lines = ref.split('\n')
    assert len(lines) - 1 == q.distance(q.start)
    assert walk.score_response(q, answer('\n'.join(lines[:-1]), 100)).points == 7


def test_hand_written_responses():
  p = problem(start=24, budget=4)  # 24+1=25, 25*2=50, 50*2=100: 3 moves
  good = '24+1=25 (3 left)\n25*2=50 (2 left)\n50*2=100 (1 left)'
  assert walk.score_response(p, answer(good, 100)).points == 7
  assert walk.score_response(p, answer(good, 99)).points == 6  # reached, wrong answer
  # Stopped one move short: 6 - 2 x 1.
  assert walk.score_response(p, answer(good.rsplit('\n', 1)[0], 50)).points == 4
  # A trap (27 ends in 7) is a dead end: 0, and nothing after it is read.
  trap = '24+1=25 (3 left)\n25+1=26 (2 left)\n26+1=27 (1 left)\n27+1=28 (0 left)'
  assert walk.walk_of(p, trap) == [25, 26, 27]
  assert walk.score_response(p, answer(trap, 28)).points == 0
  # Above the goal: dead.
  over = '24+1=25 (3 left)\n25*2=50 (2 left)\n50+5=55 (1 left)\n55*2=110 (0 left)'
  assert walk.score_response(p, answer(over, 110)).points == 0
  # Wrong arithmetic ends the walk at the line before: 25 is 2 moves away -> 2 points.
  slip = '24+1=25 (3 left)\n25*2=51 (2 left)\n51*2=102 (1 left)'
  assert walk.walk_of(p, slip) == [25]
  assert walk.score_response(p, answer(slip, 100)).points == 2
  # A miscounted "left", a move off the menu, a wrong previous number: the walk ends there.
  assert walk.walk_of(p, '24+1=25 (2 left)') == []
  assert walk.walk_of(p, '24+2=26 (3 left)') == []
  assert walk.walk_of(p, '23+1=24 (3 left)') == []
  # The budget: moves past it are not read.
  tight = problem(start=24, budget=2)
  assert walk.score_response(tight, answer(
      '24+1=25 (1 left)\n25*2=50 (0 left)\n50*2=100 (-1 left)', 100)).points == 4
  # No answer block: 0 points, valid.
  grade = walk.score_response(p, good)
  assert grade.points == 0 and grade.valid


def test_state_values_by_hand():
  # From 50 with 1 move left: the best move *2 reaches 100; the others (51, 55) end 1 and 2 moves
  # short (points 4 and 2). Noise 0.3 takes a uniform menu move.
  p = problem(start=50, budget=1)
  d51, d55 = p.distance(51), p.distance(55)
  end = lambda d: max(0, 6 - 2 * d) / 7
  expected = 0.7 * 1.0 + 0.3 * (end(d51) + end(d55) + 1.0) / 3
  assert walk.prefix_value(p, '', 0.3) == pytest.approx(expected)
  # A dead state is worth 0; a cut inside a line leaves the state of the line before.
  q = problem(start=24, budget=4)
  assert walk.prefix_value(q, '24+1=25 (3 left)\n25+1=26 (2 left)\n26+1=27 (1 left)', 0.3) == 0
  assert walk.state_of(q, '24+1=25 (3 left)\n25*2=5') == (25, 3)
  assert walk.state_of(q, '24+1=25 (3 left)') == (25, 3)
  # Without noise the solver always finishes a reachable walk.
  assert walk.prefix_value(q, '', 0.0) == 1.0


def test_state_values_match_the_solver():
  rng = np.random.default_rng(0)
  q = problem(start=13, budget=6)
  points = []
  for _ in range(4000):
    path, moves = walk.sample_walk(q, rng, 0.4)
    thinking, content = walk.thinking_and_answer(q, path, moves)
    points.append(walk.score_response(q, f'{thinking}\n{T.THINK_CLOSE}\n\n{content}').points / 7)
  assert np.mean(points) == pytest.approx(walk.prefix_value(q, '', 0.4), abs=0.025)


def test_blind_numbers():
  share = walk.blind_numbers(100, 0.4)
  assert share == walk.blind_numbers(100, 0.4) and share <= set(range(1, 100))
  assert 20 <= len(share) <= 60  # a hash of the number: about 40 of 99
  assert walk.blind_numbers(100, 0.0) == frozenset()
  assert walk.blind_numbers(100, 1.0) == frozenset(range(1, 100))
  assert walk.blind_numbers(100, 0.2) <= share  # one hash, so a smaller share is a subset
  with pytest.raises(ValueError, match='blind fraction'):
    walk.blind_numbers(100, 1.5)


def test_blind_solver_values():
  """Blind on every number is the uniform solver; on some, the values lie between the two, and the
  recursion matches simulated walks."""
  q = problem(start=13, budget=6)
  np.testing.assert_array_equal(walk.state_values(q, 0.0, 1.0), walk.state_values(q, 1.0))
  sharp, blind, uniform = (walk.prefix_value(q, '', *a) for a in ((0.0,), (0.0, 0.4), (1.0,)))
  assert uniform < blind < sharp
  rng = np.random.default_rng(1)
  points, moves_at_blind, best_at_blind = [], 0, 0
  unknown = walk.blind_numbers(q.goal, 0.4)
  for _ in range(4000):
    path, moves = walk.sample_walk(q, rng, 0.1, blind=0.4)
    for x, move in zip([q.start] + path, moves):
      if x in unknown:
        moves_at_blind += 1
        best_at_blind += move in q.best_moves(x)
    thinking, content = walk.thinking_and_answer(q, path, moves)
    points.append(walk.score_response(q, f'{thinking}\n{T.THINK_CLOSE}\n\n{content}').points / 7)
  assert np.mean(points) == pytest.approx(walk.prefix_value(q, '', 0.1, 0.4), abs=0.025)
  # On a blind number the move is uniform: a best move only as often as the menu holds one.
  assert moves_at_blind > 500 and best_at_blind / moves_at_blind < 0.6


def test_build_tfds_and_tokenizer(built):
  task, tok = built
  assert task.name == 'builtin_walk' and isinstance(task, walk.WalkTask)
  problems = walk.generate(SETTINGS)
  assert [r.prompt for r in task.records('validation')] == [
      q.prompt() for q in problems['validation']]
  assert all(r.reference_solution for r in task.records('train'))
  for d in '0123456789':
    assert len(tok.encode(d)) == 1


def test_sft_and_critic_examples(built):
  task, tok = built
  examples = builtin_sft.sft_examples(task, tok, mistake_rate=0.0, step_mistake_rate=0.3,
                                      epochs=1)
  n = 0
  for prompt_ids, response_ids in examples:
    text = tok.decode(list(prompt_ids) + list(response_ids))
    record_prompt = tok.decode(list(prompt_ids))
    q = walk.parse_problem(record_prompt.split('user\n', 1)[1])
    grade = walk.score_response(q, tok.decode(list(response_ids)))
    assert grade.status == grading.STATUS_OK and text.endswith('<|im_end|>')
    n += 1
  assert n == len(task.records('train'))
  with pytest.raises(ValueError, match='whole-solution mistakes'):
    next(builtin_sft.sft_examples(task, tok, mistake_rate=0.1))
  pairs = builtin_sft.critic_examples(task, tok, step_mistake_rate=0.3, seed=1)
  for _ in range(20):
    context, target = next(pairs)
    assert 'Q value' in tok.decode(list(context))
    assert tok.decode(list(target)).strip().startswith(('0', '1'))


def test_critic_examples_valued_by_a_sharper_solver(built):
  """`value_step_mistake_rate` relabels the same critic contexts with a sharper solver's values:
  never lower (a less noisy solver loses less), higher where choices remain."""
  task, tok = built
  own = builtin_sft.critic_examples(task, tok, step_mistake_rate=0.3, seed=3)
  sharp = builtin_sft.critic_examples(task, tok, step_mistake_rate=0.3, seed=3,
                                      value_step_mistake_rate=0.05)
  higher = 0
  for _ in range(40):
    (context, target), (context_sharp, target_sharp) = next(own), next(sharp)
    np.testing.assert_array_equal(context, context_sharp)
    value, value_sharp = (float(tok.decode(list(t)).replace('<|im_end|>', '')) for t in
                          (target, target_sharp))
    assert value_sharp >= value
    higher += value_sharp > value
  assert higher >= 10
  with pytest.raises(ValueError, match='value_step_mistake_rate'):
    builtin_sft.corpus_of(task, step_mistake_rate=0.3, value_step_mistake_rate=1.5)


def test_blind_corpus(built):
  """Even the clean walks of a blind corpus move at random on the blind numbers, and its critic
  examples carry the blind solver's values."""
  task, tok = built
  corpus = builtin_sft.corpus_of(task, step_mistake_rate=0.2, blind_fraction=1.0)
  rng = np.random.default_rng(0)
  off_plan = 0
  for record in task.records('train')[:20]:
    q = corpus.parse(record.prompt)
    path, moves = corpus.sample(q, rng, clean=True)
    off_plan += sum(m not in q.best_moves(x) for x, m in zip([q.start] + path, moves))
  assert off_plan > 0
  sharp = builtin_sft.corpus_of(task, step_mistake_rate=0.2)
  assert sharp.sample(q, rng, clean=True)[0][-1] == q.goal  # not blind: clean walks arrive
  pairs = builtin_sft.critic_examples(task, tok, step_mistake_rate=0.0, seed=3, blind_fraction=1.0)
  for _ in range(20):
    context, target = next(pairs)
    text = tok.decode(list(context))
    q = walk.parse_problem(text.split('user\n', 1)[1])
    prefix = text.split('<think>\n', 1)[1].split('</think>', 1)[0]
    value = float(tok.decode(list(target)).replace('<|im_end|>', ''))
    assert value == pytest.approx(critic.round_to_grid(walk.prefix_value(q, prefix, 1.0)))
