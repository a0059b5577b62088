"""The built-in task: a chain of modular arithmetic with every intermediate result written out.

A problem is a start value s and K steps `op a` (op in + - *) applied modulo a prime p:

  prompt:    Start at 7 and apply modulo 13: +5 *3 -2 *7 +11 -4 *2 +9
             Write each result, then the last in <answer></answer>.
  response:  7+5=12           (inside the thinking section the prompt opened)
             12*3=10
             ...
             8+9=4
             </think>

             <answer>4</answer>

The modulus is prime and no step multiplies by 0, so every step is a bijection: one wrong
intermediate value can never end in the right answer (an early mistake dooms the result). With
digits as single tokens a K=8, p=13 response is about 66 tokens, K=12 about 95: at least four
chunks of the CPU default chunk size (16 tokens).

Scoring (0..7, like the proof judge) parses the response and never evaluates a model. A response
without a complete answer block after `</think>` scores 0 (valid), as a proof without a proof
block does. Three rules (`ChainSettings.scoring`):

- 'local' (the default): c = the number of locally correct lines, points = 6 c / K (a fraction),
  plus 1 when every line and the answer are right. Line i is locally correct when it is step i of
  the problem (operator and operand), its previous value is the one written before it (the start
  value for the first line) and its result follows from those two. A solver that slips once and
  carries on correctly keeps the credit of every later line, so a replayed prefix that already
  holds a mistake can still be continued well or badly: the continuations of one prefix differ in
  value, which is what AC2's chunk advantages and the critic's targets need.
- 'leading': c = the number of leading lines that equal the true steps, points = floor(6 c / K),
  plus 1 when the whole chain and the answer are right. This is the stricter rule of a proof
  grader (nothing after the first error counts), but a prefix that holds a wrong line fixes every
  continuation's score, so most replay groups have equal rewards (measured: 55% at K = 8).
- 'leading_fine': the credit of 'leading' on the points of 'local', 6 c / K as a fraction. At
  K = 24 'leading' pays in steps of 4 lines, and responses whose first mistakes differ by up to 3
  lines score alike: GRPO had equal rewards in 47% of its groups after step 40 ('leading_fine':
  17%; session 23, BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from typing import Mapping, Sequence

import numpy as np

from ac2_jax import tokenization
from ac2_jax.critic import values as critic_values
from ac2_jax.judges import grading
from ac2_jax.tasks import base

NAME = 'builtin_chain'
ANSWER_OPEN = '<answer>'
ANSWER_CLOSE = '</answer>'
OPS = '+-*'
SCORINGS = ('local', 'leading', 'leading_fine')
LEADING_SCORINGS = ('leading', 'leading_fine')  # nothing after the first error counts
VALUE_GRID = tuple(critic_values.format_value(v) for v in critic_values.GRID)  # '0', '0.1', ..., '1'
# The critic's answer stem (ALGORITHMS.md AC2 item 8); one token in the built-in tokenizer.
CRITIC_STEM = 'Q value:'
# Pieces that are always one token in the built-in tokenizer (the chat specials come on top).
SPECIAL_SYMBOLS = ((ANSWER_OPEN, ANSWER_CLOSE, CRITIC_STEM) + VALUE_GRID
                   + tuple(str(d) for d in range(2, 10)))

_PROMPT = ('Start at {start} and apply modulo {modulus}:{steps}\n'
           'Write each result, then the last in <answer></answer>.')
_PROMPT_RE = re.compile(r'Start at (\d+) and apply modulo (\d+): ((?:[+\-*]\d+ ?)+)\n')
# Labelled steps, one per line, so that a label is the same token in the prompt as at the start of
# its line in the response (after a line break, which is always one token).
_LABELLED_PROMPT_RE = re.compile(
    r'Start at (\d+) and apply modulo (\d+):\n((?:[a-z][+\-*]\d+\n)+)')
_STEP_RE = re.compile(r'([+\-*])(\d+)')
# One worked step: previous value, the step, the new value ('11-5=6'). Writing the previous value
# makes every step a local computation, which a small model learns in minutes. A labelled chain
# (`ChainSettings.labels`) starts line i with the letter that marks step i in the prompt
# ('b11-5=6'); the label only guides the solver and is not scored.
LINE_RE = re.compile(r'(?:[a-z])?(\d{1,4})([+\-*])(\d{1,4})=(\d{1,4})')
LABELS = 'abcdefghijklmnopqrstuvwxyz'
_ANSWER_RE = re.compile(r'\d{1,4}')

_CRITIC = ('Pause here and estimate how much credit this attempt will earn if you continue it to '
           'the end: 0 means no credit, 1 means every result and the answer are right, and values '
           'in between mean partial credit.{reference}\nAnswer with a single line: Q value: z '
           'where z is one of 0, 0.1, ..., 1.')
_CRITIC_REFERENCE = '\nCompare with a correct solution:\n{reference}'
# The short instruction leaves a tiny model's context to the attempt and the reference: the long
# one is 69 tokens of the built-in tokenizer, the short one 5 (the reference adds about 55).
_CRITIC_SHORT = 'Q value of this attempt?{reference}'
_CRITIC_SHORT_REFERENCE = '\nSolution:\n{reference}'
# 'beside': the short question, and the reference laid out line by line beside the attempt's own
# lines (`beside_reference`), so that spotting a wrong line is a comparison of two neighbours.
CRITIC_PROMPTS = ('long', 'short', 'beside')


def _is_prime(n: int) -> bool:
  return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))


@dataclasses.dataclass(frozen=True)
class ChainSettings:
  """The difficulty knob and the size of the data set."""

  steps: int = 8  # K: operations per problem
  modulus: int = 13  # a prime, so that every step is invertible
  ops: str = OPS  # the operations drawn from (a difficulty knob: '+-' is easier than '+-*')
  num_train: int = 20_000
  num_validation: int = 256
  seed: int = 0
  # One problem in `validation_every` (by a hash of its content) belongs to validation, so the
  # split of a problem never depends on the seed or the counts.
  validation_every: int = 8
  scoring: str = 'local'  # one of SCORINGS (see the module docstring)
  critic_prompt: str = 'long'  # 'long' | 'short' | 'beside' (see critic_instruction)
  # Each step's letter on its own prompt line ('a-1', 'b+2') and at the start of its response
  # line ('b4+2=6'): the solver finds step i by its letter instead of by counting steps. Without
  # it the 4-layer `tiny` policy writes the wrong step from about the 9th of 24 on (session 23,
  # BENCHMARKS.md).
  labels: bool = False

  def __post_init__(self):
    if self.critic_prompt not in CRITIC_PROMPTS:
      raise ValueError(f'critic_prompt must be one of {CRITIC_PROMPTS}, got {self.critic_prompt!r}')
    if self.scoring not in SCORINGS:
      raise ValueError(f'scoring must be one of {SCORINGS}, got {self.scoring!r}')
    if not self.ops or len(set(self.ops)) != len(self.ops) or set(self.ops) - set(OPS):
      raise ValueError(f'ops must be distinct characters of {OPS!r}, got {self.ops!r}')
    if self.steps < 1:
      raise ValueError(f'steps must be >= 1, got {self.steps}')
    if self.labels and self.steps > len(LABELS):
      raise ValueError(f'labelled chains have at most {len(LABELS)} steps, got {self.steps}')
    if not _is_prime(self.modulus) or self.modulus < 5:
      raise ValueError(f'modulus must be a prime >= 5 (so every step is invertible), '
                       f'got {self.modulus}')
    if self.num_train < 1 or self.num_validation < 1:
      raise ValueError(f'num_train and num_validation must be >= 1, got '
                       f'{self.num_train}, {self.num_validation}')
    if self.validation_every < 2:
      raise ValueError(f'validation_every must be >= 2, got {self.validation_every}')


@dataclasses.dataclass(frozen=True)
class ChainProblem:
  start: int
  ops: str  # one character per step
  operands: tuple[int, ...]
  modulus: int
  labels: bool = False  # ChainSettings.labels

  def __post_init__(self):
    if self.labels and len(self.ops) > len(LABELS):
      raise ValueError(f'labelled chains have at most {len(LABELS)} steps, got {len(self.ops)}')
    if len(self.ops) != len(self.operands) or not self.ops:
      raise ValueError(f'a chain needs as many operands as ops (>= 1): {self.ops!r} '
                       f'{self.operands}')
    if any(op not in OPS for op in self.ops):
      raise ValueError(f'ops must be drawn from {OPS!r}, got {self.ops!r}')
    if not 0 <= self.start < self.modulus:
      raise ValueError(f'start {self.start} outside 0..{self.modulus - 1}')
    for op, a in zip(self.ops, self.operands):
      if not 1 <= a < self.modulus or (op == '*' and a == 1):
        raise ValueError(f'step {op}{a} is not a nontrivial invertible step mod {self.modulus}')

  @property
  def steps(self) -> int:
    return len(self.ops)

  def step_strings(self) -> list[str]:
    return [f'{op}{a}' for op, a in zip(self.ops, self.operands)]

  def label(self, step: int) -> str:
    """The letter that marks step `step` in the prompt and its line ('' when unlabelled)."""
    return LABELS[step] if self.labels else ''

  def apply(self, step: int, value: int) -> int:
    op, a = self.ops[step], self.operands[step]
    if op == '+':
      return (value + a) % self.modulus
    if op == '-':
      return (value - a) % self.modulus
    return (value * a) % self.modulus

  def values(self) -> list[int]:
    """The true intermediate results; the last is the answer."""
    out, v = [], self.start
    for i in range(self.steps):
      v = self.apply(i, v)
      out.append(v)
    return out

  @property
  def answer(self) -> int:
    return self.values()[-1]

  def key(self) -> str:
    return f'{self.modulus}|{self.start}|{" ".join(self.step_strings())}'

  def problem_id(self) -> str:
    return f'chain-{hashlib.sha256(self.key().encode()).hexdigest()[:16]}'

  def prompt(self) -> str:
    if self.labels:
      steps = ''.join(f'\n{self.label(i)}{s}' for i, s in enumerate(self.step_strings()))
    else:
      steps = ' ' + ' '.join(self.step_strings())
    return _PROMPT.format(start=self.start, modulus=self.modulus, steps=steps)


def parse_problem(prompt: str) -> ChainProblem:
  """The problem stated by a built-in prompt; ValueError when the text is not one."""
  labelled = _LABELLED_PROMPT_RE.match(prompt)
  m = labelled or _PROMPT_RE.match(prompt)
  if m is None:
    raise ValueError(f'not a built-in chain prompt: {prompt[:80]!r}')
  steps = _STEP_RE.findall(m.group(3))
  return ChainProblem(start=int(m.group(1)), ops=''.join(op for op, _ in steps),
                      operands=tuple(int(a) for _, a in steps), modulus=int(m.group(2)),
                      labels=labelled is not None)


Fact = tuple[int, str, int]  # (x, op, a): the result of x op a modulo the problem's prime


@functools.lru_cache(maxsize=64)
def blind_facts(modulus: int, fraction: float) -> frozenset[Fact]:
  """The facts `x op a (mod modulus)` whose result a blind solver does not know.

  A fixed share of all facts of the three operations, each chosen by a hash of the fact alone,
  so that the set is the same on every seed and machine (the walk's `blind_numbers` in the
  chain): a warm start imitating a corpus that writes these results at random knows the other
  facts and has these to learn.
  """
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f'blind fraction must lie in [0, 1], got {fraction}')
  facts = [(x, op, a) for x in range(modulus) for op in OPS
           for a in range(2 if op == '*' else 1, modulus)]
  return frozenset(f for f in facts if base.unit_hash(f'blind|{modulus}|{f[0]}{f[1]}{f[2]}')
                   < fraction)


def step_fact(problem: 'ChainProblem', step: int, previous: int) -> Fact:
  """The fact step `step` of `problem` asks for when the value written before it is `previous`."""
  return previous, problem.ops[step], problem.operands[step]


def written_values(problem: ChainProblem, mistake_at: int | None = None,
                   wrong_value: int | None = None) -> list[int]:
  """The values a solver writes: the true chain, or one with a mistake at step `mistake_at`.

  After the mistake the solver carries on correctly from the wrong value, so the answer is wrong.
  """
  if mistake_at is None:
    return problem.values()
  if not 0 <= mistake_at < problem.steps:
    raise ValueError(f'mistake_at {mistake_at} outside 0..{problem.steps - 1}')
  out, v = [], problem.start
  for i in range(problem.steps):
    v = problem.apply(i, v)
    if i == mistake_at:
      if wrong_value is None or wrong_value == v or not 0 <= wrong_value < problem.modulus:
        raise ValueError(f'wrong_value {wrong_value} must differ from the true value {v} '
                         f'and lie in 0..{problem.modulus - 1}')
      v = wrong_value
    out.append(v)
  return out


def steps_text(problem: ChainProblem, values: Sequence[int]) -> str:
  previous = [problem.start, *values[:-1]]
  return '\n'.join(f'{problem.label(i)}{p}{s}={v}'
                   for i, (p, s, v) in enumerate(zip(previous, problem.step_strings(), values)))


def answer_text(value: int | str) -> str:
  return f'{ANSWER_OPEN}{value}{ANSWER_CLOSE}'


def thinking_and_answer(problem: ChainProblem, values: Sequence[int]) -> tuple[str, str]:
  """The assistant turn's thinking section and its content (the answer block)."""
  return steps_text(problem, values), answer_text(values[-1])


def response_text(problem: ChainProblem, values: Sequence[int]) -> str:
  """The text a model writes after the prompt's `<think>\\n` (end-of-turn token excluded)."""
  thinking, content = thinking_and_answer(problem, values)
  return f'{thinking}\n{tokenization.THINK_CLOSE}\n\n{content}'


def reference_text(problem: ChainProblem) -> str:
  """A correct solution as the critic sees it: the steps, then the answer block."""
  values = problem.values()
  return f'{steps_text(problem, values)}\n{answer_text(values[-1])}'


def thinking_span(response: str) -> tuple[int, int]:
  """(start, end) of the thinking section: after the last `<think>` before the first `</think>`
  (the response's start when there is none; a partial response is read as far as it goes)."""
  end = response.find(tokenization.THINK_CLOSE)
  end = len(response) if end < 0 else end
  start = response.rfind(tokenization.THINK_OPEN, 0, end)
  return (0 if start < 0 else start + len(tokenization.THINK_OPEN)), end


def thinking_lines(response: str) -> list[str]:
  start, end = thinking_span(response)
  return [line.strip() for line in response[start:end].split('\n') if line.strip()]


def thinking_line_starts(response: str) -> list[int]:
  """The character offset in `response` of each line `thinking_lines` returns, in order."""
  start, end = thinking_span(response)
  starts, offset = [], start
  for piece in response[start:end].split('\n'):
    if piece.strip():
      starts.append(offset + len(piece) - len(piece.lstrip()))
    offset += len(piece) + 1
  return starts


def replay_cut_end(problem: ChainProblem, response: str, scoring: str) -> int | None:
  """Where a replayed prefix of `response` must end at the latest (a character offset) for its
  continuations to differ in value: under a leading scoring, the start of the first line without
  credit, or of the last line when every line has it (so a continuation always writes one).
  A prefix that reaches past it holds a wrong line, which fixes every continuation's points
  (65% of replay groups tied on blind facts without it: BENCHMARKS.md, session 25). None under
  'local', where a continuation can still earn any later line's credit."""
  if scoring not in LEADING_SCORINGS:
    return None
  credited = sum(line_credits(problem, response, scoring))
  starts = thinking_line_starts(response)
  line = min(credited, problem.steps - 1)
  if line < len(starts):
    return starts[line]
  # It stopped early with every line right: the prefix may hold its whole thinking section.
  return thinking_span(response)[1]


def replay_chunk_end(problem: ChainProblem, response: str, scoring: str) -> int | None:
  """Where a ready chunk replayed from a cut at or before `replay_cut_end` should end at the
  earliest (a character offset): just past the first line without credit, with its newline. That
  is the line the score of the response turned on, so a chunk that stops before it ends in states
  the score does not yet tell apart (BENCHMARKS.md, session 27). None under 'local', and when every
  written line has credit (the chunk b then decides)."""
  if scoring not in LEADING_SCORINGS:
    return None
  credited = sum(line_credits(problem, response, scoring))
  starts = thinking_line_starts(response)
  if credited >= min(len(starts), problem.steps):
    return None
  if credited + 1 < len(starts):
    return starts[credited + 1]
  end = thinking_span(response)[1]
  newline = response.find('\n', starts[credited], end)
  return end if newline < 0 else newline + 1


def line_credits(problem: ChainProblem, response: str, scoring: str = 'local') -> list[bool]:
  """Per step of the problem, whether the response's line for it earns credit under `scoring`.

  Only the thinking section is read (a partial response is read as far as it goes).
  """
  if scoring not in SCORINGS:
    raise ValueError(f'scoring must be one of {SCORINGS}, got {scoring!r}')
  lines = thinking_lines(response)
  truth = problem.values()
  credits = []
  written = problem.start  # the value the solver wrote last
  for i, step in enumerate(problem.step_strings()):
    m = LINE_RE.fullmatch(lines[i]) if i < len(lines) else None
    if m is None:
      credits.extend([False] * (problem.steps - i))
      break
    prev, result = int(m.group(1)), int(m.group(4))
    same_step = f'{m.group(2)}{int(m.group(3))}' == step
    if scoring in LEADING_SCORINGS:
      ok = same_step and prev == ([problem.start, *truth][i]) and result == truth[i]
      if not ok:
        credits.extend([False] * (problem.steps - i))
        break
    else:
      ok = (same_step and prev == written and prev < problem.modulus
            and result == problem.apply(i, prev))
    credits.append(ok)
    written = result
  return credits


def reference_verdicts(lines: Sequence[tuple[int, str]], critic_text: str) -> list[bool] | None:
  """Whether each (index, text) line of an attempt is the reference's line of that index, by its
  input, step and result (its label aside): the check the leading scorings credit. The reference's
  lines are read from `critic_text`, the critic prompt after the attempt; None when it shows none
  (a prompt without the reference)."""
  reference = [m for m in (LINE_RE.fullmatch(line.strip()) for line in critic_text.split('\n'))
               if m is not None]
  if not reference:
    return None
  worked = lambda m: (int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)))
  out = []
  for index, text in lines:
    m = LINE_RE.fullmatch(text)
    out.append(m is not None and index < len(reference)
               and worked(m) == worked(reference[index]))
  return out


def line_points(correct: float, k: int, scoring: str) -> float:
  """The points of `correct` credited lines out of `k` (the answer's point not included)."""
  return (6 * correct) // k if scoring == 'leading' else 6 * correct / k


def score_response(problem: ChainProblem, response: str, scoring: str = 'local'
                   ) -> grading.Grade:
  """Points 0..7 for one response (parsing only); see the module docstring for the rules."""
  block = base.answer_block(response, ANSWER_OPEN, ANSWER_CLOSE)
  if block is None:
    return grading.no_answer_grade()
  credits = line_credits(problem, response, scoring)
  correct = sum(credits)
  answer = block.strip()
  answer_right = _ANSWER_RE.fullmatch(answer) is not None and int(answer) == problem.answer
  k = problem.steps
  points = line_points(correct, k, scoring) + int(correct == k and answer_right)
  return grading.Grade(points=points, status=grading.STATUS_OK,
                       detail=f'correct steps {correct}/{k}, answer '
                              f'{"right" if answer_right else "wrong"}')


def critic_instruction(reference: str | None, prompt: str = 'long', response: str = '') -> str:
  """The built-in critic instruction, with or without a reference.

  'long' is the AC2 paper's instruction, shortened; 'short' only asks, so that a tiny model's
  context holds the attempt and the reference rather than the wording of the question; 'beside'
  asks as 'short' does and shows the reference beside the lines of `response` (the attempt).
  """
  if prompt == 'beside' and reference is not None:
    reference = beside_reference(reference, response)
  return format_instruction(reference, prompt, long=(_CRITIC, _CRITIC_REFERENCE))


def beside_reference(reference: str, response: str) -> str:
  """The reference with the attempt's line i written before its line i: `attempt_i ref_i`.

  A departure from the paper's critic prompt (which shows the reference whole), kept as the
  'beside' setting: a tiny critic does not learn to align the i-th line of the attempt with the
  i-th line of a reference that stands a whole attempt away (probe: reads uncorrelated with the
  labels after 32,000 pairs), whereas here a wrong result sits a fixed few tokens from the right
  one. The reference's lines past the attempt's, and its answer block, follow alone. Measured on
  the `tiny` policy (BENCHMARKS.md, "Session 13"): no better than the plain layout (reads still a
  constant after 1,920 pairs); kept for larger policies.
  """
  attempt = thinking_lines(response)
  lines = [line.strip() for line in reference.strip().split('\n') if line.strip()]
  return '\n'.join(f'{attempt[i]} {line}' if i < len(attempt) and LINE_RE.fullmatch(line)
                   else line for i, line in enumerate(lines))


def format_instruction(reference: str | None, prompt: str, long: tuple[str, str]) -> str:
  """A built-in task's critic instruction: its `long` (template, reference template) pair, or the
  short question both tasks share; the reference placed by the reference template."""
  if prompt not in CRITIC_PROMPTS:
    raise ValueError(f'critic prompt must be one of {CRITIC_PROMPTS}, got {prompt!r}')
  template, ref_template = long if prompt == 'long' else (_CRITIC_SHORT, _CRITIC_SHORT_REFERENCE)
  if reference is None:
    return template.format(reference='')
  return template.format(reference=ref_template.format(reference=reference.strip()))


def generate(settings: ChainSettings) -> dict[str, list[ChainProblem]]:
  """Deterministic problems for both splits (disjoint: each problem has exactly one split)."""
  rng = np.random.default_rng(settings.seed)
  p, k = settings.modulus, settings.steps
  want = {'train': settings.num_train, 'validation': settings.num_validation}
  out: dict[str, list[ChainProblem]] = {'train': [], 'validation': []}
  seen: set[str] = set()
  steps_per_position = sum(p - 2 if op == '*' else p - 1 for op in settings.ops)
  capacity = p * steps_per_position ** k  # distinct problems there are
  if capacity < 2 * (want['train'] + want['validation']):
    raise ValueError(f'steps={k}, modulus={p} give only {capacity} distinct problems; ask for '
                     f'fewer than half of that')
  while any(len(out[s]) < want[s] for s in out):
    batch = 4096
    starts = rng.integers(0, p, size=batch)
    ops = rng.integers(0, len(settings.ops), size=(batch, k))
    add = rng.integers(1, p, size=(batch, k))
    mul = rng.integers(2, p, size=(batch, k))
    for b in range(batch):
      chars = ''.join(settings.ops[o] for o in ops[b])
      operands = tuple(int(mul[b, i] if chars[i] == '*' else add[b, i]) for i in range(k))
      problem = ChainProblem(int(starts[b]), chars, operands, p, settings.labels)
      key = problem.key()
      if key in seen:
        continue
      seen.add(key)
      digest = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
      split = 'validation' if digest % settings.validation_every == 0 else 'train'
      if len(out[split]) < want[split]:
        out[split].append(problem)
  return out


def to_record(problem: ChainProblem, split: str) -> base.ProblemRecord:
  return base.ProblemRecord(id=problem.problem_id(), split=split, prompt=problem.prompt(),
                            reference_solution=reference_text(problem))


class BuiltinTask:
  """The built-in task over fixed problem records (see `builtin_tfds.build_builtin`)."""

  def __init__(self, settings: ChainSettings,
               records: Mapping[str, Sequence[base.ProblemRecord]]):
    self.settings = settings
    self._records = {s: tuple(records.get(s, ())) for s in base.SPLITS}
    ids = {s: {r.id for r in self._records[s]} for s in base.SPLITS}
    shared = ids['train'] & ids['validation']
    if shared:
      raise ValueError(f'train and validation share problems, e.g. {sorted(shared)[:3]}')

  @classmethod
  def generate(cls, settings: ChainSettings) -> 'BuiltinTask':
    """Generates the problems in memory (the tfds builder stores the same records)."""
    problems = generate(settings)
    return cls(settings, {s: [to_record(p, s) for p in problems[s]] for s in base.SPLITS})

  @property
  def name(self) -> str:
    return NAME

  def records(self, split: str) -> Sequence[base.ProblemRecord]:
    return self._records[base.check_split(split)]

  def prompt_ids(self, tok: tokenization.Tokenizer, record: base.ProblemRecord) -> list[int]:
    return base.render_prompt(tok, record.prompt)

  def has_complete_answer(self, response_text: str) -> bool:
    return base.answer_block(response_text, ANSWER_OPEN, ANSWER_CLOSE) is not None

  def reference_from_response(self, response_text: str) -> str | None:
    block = base.answer_block(response_text, ANSWER_OPEN, ANSWER_CLOSE)
    if block is None:
      return None
    return '\n'.join(thinking_lines(response_text) + [answer_text(block.strip())])

  @property
  def critic_sees_response(self) -> bool:
    return self.settings.critic_prompt == 'beside'

  def critic_instruction(self, reference: str | None, response: str = '') -> str:
    return critic_instruction(reference, self.settings.critic_prompt, response)

  def reference_verdicts(self, lines: Sequence[tuple[int, str]], critic_text: str
                         ) -> list[bool] | None:
    return reference_verdicts(lines, critic_text)

  def replay_cut_end(self, record: base.ProblemRecord, response_text: str) -> int | None:
    """The latest character offset of a replayed prefix of this response (`replay_cut_end`)."""
    return replay_cut_end(parse_problem(record.prompt), response_text, self.settings.scoring)

  def replay_chunk_end(self, record: base.ProblemRecord, response_text: str) -> int | None:
    """The earliest character offset a ready chunk from this response's prefix should reach
    (`replay_chunk_end`)."""
    return replay_chunk_end(parse_problem(record.prompt), response_text, self.settings.scoring)

  def score(self, record: base.ProblemRecord, response_text: str) -> grading.Grade:
    """Points for one response; ValueError when the record is not a built-in problem."""
    return score_response(parse_problem(record.prompt), response_text, self.settings.scoring)

  def score_batch(self, records: Sequence[base.ProblemRecord], responses: Sequence[str]
                  ) -> list[grading.Grade]:
    if len(records) != len(responses):
      raise ValueError(f'{len(records)} records but {len(responses)} responses')
    grades = []
    for record, response in zip(records, responses):
      try:
        grades.append(self.score(record, response))
      except Exception as e:  # pylint: disable=broad-except
        # A bad record must not stop a training step: it becomes an invalid grade.
        grades.append(grading.invalid_grade(grading.STATUS_INTERNAL_ERROR,
                                            f'{type(e).__name__}: {e}'))
    return grades

