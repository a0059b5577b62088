"""The built-in planning task: walk to a goal number with a few moves, avoiding dead ends.

  prompt:    Start at 13, reach 100 in at most 6 moves of +1, +5 or *2; never land above 100 or
             on a number ending in 7.
             Write each move and the moves left, then the last number in <answer></answer>.
  response:  13*2=26 (5 left)     (inside the thinking section the prompt opened)
             26*2=52 (4 left)
             ...
             </think>

             <answer>100</answer>

Why this task exists beside the chain (ac2_jax/tasks/builtin.py): AC2's critic must judge a
prefix, and in the chain a prefix's value turns only on which written lines hold an arithmetic
slip, a relation between tokens that a tiny policy never represents (BENCHMARKS.md, "Can the critic
learn the value at all?"), while the future of every prefix is the same. Here the solver chooses:
each move leads to a state whose value, the chance of still reaching the goal in the moves left,
is a function of the state the attempt wrote last (the number and the moves left, both in its last
line). Some states are dead ends (above the goal, ending in the trap digit, or too far for the
moves left), so continuations of one prefix differ in value, and a critic that reads the last line
can tell a good chunk from a bad one. The arithmetic is easy on purpose: what is learned is the
plan.

Scoring (0..7, parsing only). The walk is read line by line; it ends at the first line that is
not a legal move from the number written before it (the move from the prompt's menu, the result
right, the moves left counted down), at the goal, at a dead end, or when the moves run out. With a
complete answer block after `</think>`: 7 when the walk reached the goal and the answer is the
goal; otherwise 2 points fewer than 6 for each move the walk's end still needs (6 - 2 d, at least
0; a dead end scores 0). Without an answer block: 0, as for a proof without a proof block.

Problems are every (start, budget) pair: a start whose shortest walk takes `min_distance` ..
`max_distance` moves, and a budget of that many moves plus 0 .. `slack`. One problem in
`validation_every` (by a hash of its content) belongs to validation. The policy's plan is a
function of the state, so what it learns on training problems carries over to the validation ones.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from typing import Sequence

import numpy as np

from ac2_jax import tokenization
from ac2_jax.judges import grading
from ac2_jax.tasks import base
from ac2_jax.tasks import builtin

NAME = 'builtin_walk'
ANSWER_OPEN, ANSWER_CLOSE = builtin.ANSWER_OPEN, builtin.ANSWER_CLOSE
SPECIAL_SYMBOLS = builtin.SPECIAL_SYMBOLS
# The chain's 'beside' layout pairs worked lines with a reference's; a walk's value is its last
# line's state, so the walk keeps the two plain layouts.
CRITIC_PROMPTS = ('long', 'short')
UNREACHABLE = 10 ** 6  # the distance of a dead end

_PROMPT = ('Start at {start}, reach {goal} in at most {budget} moves of {menu}; never land above '
           '{goal}{trap}.\nWrite each move and the moves left, then the last number in '
           '<answer></answer>.')
_TRAP = ' or on a number ending in {digit}'
_PROMPT_RE = re.compile(r'Start at (\d+), reach (\d+) in at most (\d+) moves of (.+?); never '
                        r'land above \d+(?: or on a number ending in (\d))?\.\n')
_MOVE_RE = re.compile(r'([+*])(\d+)')
_LINE_RE = re.compile(r'(\d{1,4})([+*])(\d{1,4})=(\d{1,5}) \((\d{1,3}) left\)')
_ANSWER_RE = re.compile(r'\d{1,5}')

_CRITIC = ('Pause here and estimate how much credit this attempt will earn if you continue it to '
           'the end: 0 means no credit, 1 means it reaches the goal, and values in between mean '
           'partial credit.{reference}\nAnswer with a single line: Q value: z where z is one of '
           '0, 0.1, ..., 1.')
_CRITIC_REFERENCE = '\nCompare with a correct solution:\n{reference}'


def _parse_menu(text: str) -> tuple[tuple[str, int], ...]:
  moves = tuple((op, int(a)) for op, a in _MOVE_RE.findall(text))
  if not moves:
    raise ValueError(f'no moves in {text!r}; write them as "+1 +5 *2"')
  return moves


def menu_text(moves: Sequence[tuple[str, int]]) -> str:
  names = [f'{op}{a}' for op, a in moves]
  return names[0] if len(names) == 1 else f'{", ".join(names[:-1])} or {names[-1]}'


@dataclasses.dataclass(frozen=True)
class WalkSettings:
  """The rules of the walk and the range of problems."""

  goal: int = 100
  moves: str = '+1 +5 *2'  # the menu: '+a' and '*a' moves, space-separated
  trap_digit: int = 7  # numbers ending in this digit are dead ends; -1: none
  min_distance: int = 2  # starts whose shortest walk takes min..max moves
  max_distance: int = 8
  slack: int = 2  # budget = shortest walk + 0..slack moves
  validation_every: int = 4
  critic_prompt: str = 'short'  # 'long' | 'short' critic instruction (as the chain's)

  def __post_init__(self):
    menu = _parse_menu(self.moves)
    if ' '.join(f'{op}{a}' for op, a in menu) != ' '.join(self.moves.split()):
      raise ValueError(f'moves must be "+a" or "*a" separated by spaces, got {self.moves!r}')
    if len(set(menu)) != len(menu) or any(a < 1 or (op == '*' and a < 2) for op, a in menu):
      raise ValueError(f'moves must be distinct, +a with a >= 1 or *a with a >= 2: '
                       f'{self.moves!r}')
    if not 2 <= self.goal <= 9999:
      raise ValueError(f'goal must lie in 2..9999, got {self.goal}')
    if self.trap_digit != -1 and not (0 <= self.trap_digit <= 9
                                      and self.trap_digit != self.goal % 10):
      raise ValueError(f'trap_digit must be -1 or a digit other than the goal\'s last one, got '
                       f'{self.trap_digit}')
    if not 1 <= self.min_distance <= self.max_distance:
      raise ValueError(f'need 1 <= min_distance <= max_distance, got {self.min_distance}, '
                       f'{self.max_distance}')
    if self.slack < 0 or self.validation_every < 2:
      raise ValueError(f'need slack >= 0 and validation_every >= 2, got {self.slack}, '
                       f'{self.validation_every}')
    if self.critic_prompt not in CRITIC_PROMPTS:
      raise ValueError(f'critic_prompt must be one of {CRITIC_PROMPTS}, got '
                       f'{self.critic_prompt!r}')

  @property
  def menu(self) -> tuple[tuple[str, int], ...]:
    return _parse_menu(self.moves)


@dataclasses.dataclass(frozen=True)
class WalkProblem:
  start: int
  budget: int
  goal: int
  menu: tuple[tuple[str, int], ...]
  trap_digit: int

  def dead(self, x: int) -> bool:
    return x > self.goal or (x != self.goal and self.trap_digit >= 0
                             and x % 10 == self.trap_digit)

  def apply(self, x: int, move: tuple[str, int]) -> int:
    op, a = move
    return x + a if op == '+' else x * a

  def distance(self, x: int) -> int:
    """Moves the shortest walk from x to the goal takes (UNREACHABLE from a dead end)."""
    return _distances(self.goal, self.menu, self.trap_digit).get(x, UNREACHABLE)

  def best_moves(self, x: int) -> list[tuple[str, int]]:
    """The moves that bring x one move closer to the goal (none from a dead end)."""
    d = self.distance(x)
    return [m for m in self.menu if d < UNREACHABLE and self.distance(self.apply(x, m)) == d - 1]

  def key(self) -> str:
    return (f'{self.goal}|{self.start}|{self.budget}|{" ".join(f"{o}{a}" for o, a in self.menu)}'
            f'|{self.trap_digit}')

  def problem_id(self) -> str:
    return f'walk-{hashlib.sha256(self.key().encode()).hexdigest()[:16]}'

  def prompt(self) -> str:
    trap = _TRAP.format(digit=self.trap_digit) if self.trap_digit >= 0 else ''
    return _PROMPT.format(start=self.start, goal=self.goal, budget=self.budget,
                          menu=menu_text(self.menu), trap=trap)


@functools.lru_cache(maxsize=16)
def _distances(goal: int, menu: tuple[tuple[str, int], ...], trap_digit: int) -> dict[int, int]:
  """Shortest walk to the goal from every live number 1..goal (dead ends left out)."""
  probe = WalkProblem(1, 1, goal, menu, trap_digit)
  d = {goal: 0}
  changed = True
  while changed:  # Bellman-Ford over at most `goal` numbers: instant at these sizes
    changed = False
    for x in range(goal - 1, 0, -1):
      if probe.dead(x):
        continue
      best = min((d[y] + 1 for y in (probe.apply(x, m) for m in menu) if y in d),
                 default=UNREACHABLE)
      if best < d.get(x, UNREACHABLE):
        d[x], changed = best, True
  return d


def parse_problem(prompt: str) -> WalkProblem:
  """The problem stated by a walk prompt; ValueError when the text is not one."""
  m = _PROMPT_RE.match(prompt)
  if m is None:
    raise ValueError(f'not a built-in walk prompt: {prompt[:80]!r}')
  trap = int(m.group(5)) if m.group(5) is not None else -1
  return WalkProblem(start=int(m.group(1)), budget=int(m.group(3)), goal=int(m.group(2)),
                     menu=_parse_menu(m.group(4)), trap_digit=trap)


def line_text(x: int, move: tuple[str, int], y: int, left: int) -> str:
  return f'{x}{move[0]}{move[1]}={y} ({left} left)'


def walk_text(problem: WalkProblem, path: Sequence[int], moves: Sequence[tuple[str, int]]
              ) -> str:
  """The reasoning lines of a walk through `path` (the numbers after each move)."""
  previous = [problem.start, *path[:-1]]
  return '\n'.join(line_text(x, m, y, problem.budget - i - 1)
                   for i, (x, m, y) in enumerate(zip(previous, moves, path)))


def thinking_and_answer(problem: WalkProblem, path: Sequence[int],
                        moves: Sequence[tuple[str, int]]) -> tuple[str, str]:
  """The assistant turn's thinking section and its content (the answer block)."""
  last = path[-1] if path else problem.start
  return walk_text(problem, path, moves), builtin.answer_text(last)


def reference_text(problem: WalkProblem) -> str:
  """A shortest walk as the critic sees it (the first best move at each step), then the answer."""
  path, moves, x = [], [], problem.start
  while x != problem.goal:
    move = problem.best_moves(x)[0]
    x = problem.apply(x, move)
    path.append(x)
    moves.append(move)
  return f'{walk_text(problem, path, moves)}\n{builtin.answer_text(problem.goal)}'


def walk_of(problem: WalkProblem, response: str) -> list[int]:
  """The numbers of the response's legal moves, in order (read up to the first illegal line).

  A line is legal when it moves from the number written before it (the start for the first
  line) by a move of the menu, with the right result and the moves left counted down. The walk
  stops at the goal, at a dead end and when the moves run out; lines after that are not read.
  """
  x, path = problem.start, []
  for i, line in enumerate(builtin.thinking_lines(response)):
    if i >= problem.budget or x == problem.goal or problem.dead(x):
      break
    m = _LINE_RE.fullmatch(line)
    if m is None:
      break
    prev, result, left = int(m.group(1)), int(m.group(4)), int(m.group(5))
    move = (m.group(2), int(m.group(3)))
    if (prev != x or move not in problem.menu or result != problem.apply(x, move)
        or left != problem.budget - i - 1):
      break
    x = result
    path.append(x)
  return path


def end_points(problem: WalkProblem, x: int) -> int:
  """Points of a walk that ends at x, before the answer is checked: 6 - 2 d (at least 0)."""
  return max(0, 6 - 2 * problem.distance(x))


def score_response(problem: WalkProblem, response: str) -> grading.Grade:
  """Points 0..7 for one response (parsing only); see the module docstring for the rules."""
  block = base.answer_block(response, ANSWER_OPEN, ANSWER_CLOSE)
  if block is None:
    return grading.no_answer_grade()
  path = walk_of(problem, response)
  end = path[-1] if path else problem.start
  answer = block.strip()
  answer_right = _ANSWER_RE.fullmatch(answer) is not None and int(answer) == problem.goal
  reached = end == problem.goal
  points = 7 if reached and answer_right else end_points(problem, end)
  return grading.Grade(points=points, status=grading.STATUS_OK,
                       detail=f'{len(path)} legal moves, ends at {end}'
                              f'{" (dead end)" if problem.dead(end) else ""}, answer '
                              f'{"right" if answer_right else "wrong"}')


def state_of(problem: WalkProblem, prefix_text: str) -> tuple[int, int]:
  """(number, moves left) after the legal lines of a partial response.

  A line counts once its `(k left)` is written, even before its line break: a cut inside a line
  leaves the state of the line before.
  """
  path = walk_of(problem, prefix_text)
  return (path[-1] if path else problem.start), problem.budget - len(path)


@functools.lru_cache(maxsize=64)
def blind_numbers(goal: int, fraction: float) -> frozenset[int]:
  """The numbers 1..goal - 1 where a blind solver does not know the best move (a fixed share
  `fraction` of them, picked by a hash of the number alone: the same for every problem and seed)."""
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f'blind fraction must lie in [0, 1], got {fraction}')
  return frozenset(x for x in range(1, goal) if base.unit_hash(f'blind|{x}') < fraction)


def sample_walk(problem: WalkProblem, rng: np.random.Generator, noise: float,
                blind: float = 0.0) -> tuple[list[int], list[tuple[str, int]]]:
  """A solver's walk: each move a best one (uniform among them), or with probability `noise` a
  uniform move of the menu; on the `blind_numbers(goal, blind)` always a uniform move. It stops at
  the goal, at a dead end or when the moves run out."""
  if not 0.0 <= noise <= 1.0:
    raise ValueError(f'noise must lie in [0, 1], got {noise}')
  unknown = blind_numbers(problem.goal, blind)
  x, path, moves = problem.start, [], []
  while len(path) < problem.budget and x != problem.goal and not problem.dead(x):
    best = problem.best_moves(x)
    pool = problem.menu if (x in unknown or rng.random() < noise or not best) else best
    move = pool[int(rng.integers(len(pool)))]
    x = problem.apply(x, move)
    path.append(x)
    moves.append(move)
  return path, moves


@functools.lru_cache(maxsize=1024)
def state_values(problem: WalkProblem, noise: float, blind: float = 0.0) -> np.ndarray:
  """V[x, k]: expected points / 7 of `sample_walk`'s solver (`noise`, `blind`) from number x with
  k moves left.

  Indexed for x in 0..goal (dead ends above the goal read through `value_at`). Cached per
  problem (the corpus streams value every prefix they cut), so the array comes back read-only."""
  goal, budget = problem.goal, problem.budget
  unknown = blind_numbers(goal, blind)
  v = np.zeros((goal + 1, budget + 1))
  for x in range(1, goal + 1):
    v[x, 0] = 1.0 if x == goal else end_points(problem, x) / 7
  for k in range(1, budget + 1):
    for x in range(1, goal + 1):
      if x == goal:
        v[x, k] = 1.0
        continue
      if problem.dead(x):
        continue
      after = [value_at(v, problem, problem.apply(x, m), k - 1) for m in problem.menu]
      best = [value_at(v, problem, problem.apply(x, m), k - 1) for m in problem.best_moves(x)]
      greedy = float(np.mean(best)) if best and x not in unknown else float(np.mean(after))
      v[x, k] = (1 - noise) * greedy + noise * float(np.mean(after))
  v.flags.writeable = False
  return v


def value_at(v: np.ndarray, problem: WalkProblem, x: int, k: int) -> float:
  return 0.0 if problem.dead(x) or x > problem.goal else float(v[x, k])


def prefix_value(problem: WalkProblem, prefix_text: str, noise: float, blind: float = 0.0
                 ) -> float:
  """Expected points / 7 for finishing a partial response with `sample_walk`'s solver."""
  x, left = state_of(problem, prefix_text)
  return value_at(state_values(problem, noise, blind), problem, x, left)


def critic_instruction(reference: str | None, prompt: str = 'short') -> str:
  """The chain's critic question ('short'), or a long one that says what credit means here."""
  return builtin.format_instruction(reference, prompt, long=(_CRITIC, _CRITIC_REFERENCE))


def generate(settings: WalkSettings) -> dict[str, list[WalkProblem]]:
  """Every problem of the settings, split by a hash of its content (deterministic, disjoint)."""
  menu, out = settings.menu, {'train': [], 'validation': []}
  d = _distances(settings.goal, menu, settings.trap_digit)
  for start in range(1, settings.goal):
    if not settings.min_distance <= d.get(start, UNREACHABLE) <= settings.max_distance:
      continue
    for extra in range(settings.slack + 1):
      problem = WalkProblem(start, d[start] + extra, settings.goal, menu, settings.trap_digit)
      digest = int(hashlib.sha256(problem.key().encode()).hexdigest()[:8], 16)
      out['validation' if digest % settings.validation_every == 0 else 'train'].append(problem)
  if not out['train'] or not out['validation']:
    raise ValueError(f'{settings} gives {len(out["train"])} training and '
                     f'{len(out["validation"])} validation problems; widen the distances')
  return out


def to_record(problem: WalkProblem, split: str) -> base.ProblemRecord:
  return base.ProblemRecord(id=problem.problem_id(), split=split, prompt=problem.prompt(),
                            reference_solution=reference_text(problem))


class WalkTask(builtin.BuiltinTask):
  """The walk task over fixed problem records (see `builtin_tfds.build_builtin`): the chain's
  records, answer block and batch scoring, with the walk's rules."""

  @classmethod
  def generate(cls, settings: WalkSettings) -> 'WalkTask':
    problems = generate(settings)
    return cls(settings, {s: [to_record(p, s) for p in problems[s]] for s in base.SPLITS})

  @property
  def name(self) -> str:
    return NAME

  critic_sees_response = False

  def critic_instruction(self, reference: str | None, response: str = '') -> str:
    return critic_instruction(reference, self.settings.critic_prompt)

  def score(self, record: base.ProblemRecord, response_text: str) -> grading.Grade:
    return score_response(parse_problem(record.prompt), response_text)
