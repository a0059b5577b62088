"""The built-in tasks' text corpora: worked solutions for the supervised warm start, with injected
mistakes, and the text the built-in SentencePiece tokenizer is trained on.

The warm start's starting accuracy is set by the mistakes in its corpus. In the chain
(tasks/builtin.py): `step_mistake_rate` (each worked step independently wrong, the solver carrying
on from what it wrote) or `mistake_rate` (the share of solutions with exactly one wrong value). A
`tiny` model learns the arithmetic in a sudden transition (a few hundred steps in), and it gets
there sooner on correct solutions, so the stream can begin with `clean_first` correct ones and
bring the mistakes in afterwards: the model then learns the arithmetic first and the mistake rate
second. In the walk (tasks/walk.py) `step_mistake_rate` is the share of moves drawn from the whole
menu instead of the best ones (`walk.sample_walk`); its arithmetic is never wrong.

Each task's side is a small corpus object (`ChainCorpus`, `WalkCorpus`: parse a prompt, sample a
worked solution, its text, the exact value of a prefix); the streams below are shared.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from ac2_jax import critic, tokenization
from ac2_jax.tasks import builtin, walk


def sample_values(problem: builtin.ChainProblem, rng: np.random.Generator,
                  mistake_rate: float, step_mistake_rate: float = 0.0,
                  blind: frozenset[builtin.Fact] = frozenset()) -> list[int]:
  """Written values of one worked solution: correct, or (with `mistake_rate`) one mistake.

  With `step_mistake_rate` > 0 instead, every step is independently wrong with that probability
  (the solver carries on from whatever it wrote). A model imitating these solutions errs at about
  that rate per step, which sets its starting accuracy far more reliably than the length of the
  warm start does (accuracy jumps once the arithmetic is learned). On a `blind` fact
  (`builtin.blind_facts`) the solver writes a uniform value of the modulus, step mistakes or not.
  """
  if not 0.0 <= mistake_rate <= 1.0:
    raise ValueError(f'mistake_rate must lie in [0, 1], got {mistake_rate}')
  if not 0.0 <= step_mistake_rate <= 1.0:
    raise ValueError(f'step_mistake_rate must lie in [0, 1], got {step_mistake_rate}')
  if blind and mistake_rate:
    raise ValueError('blind facts go with step mistakes (step_mistake_rate), not with '
                     'whole-solution mistakes (mistake_rate)')
  if step_mistake_rate > 0.0 or blind:
    out, v = [], problem.start
    for i in range(problem.steps):
      if builtin.step_fact(problem, i, v) in blind:
        v = int(rng.integers(problem.modulus))
      else:
        v = problem.apply(i, v)
        if step_mistake_rate > 0.0 and rng.random() < step_mistake_rate:
          v = wrong_value(v, problem.modulus, rng)
      out.append(v)
    return out
  if rng.random() >= mistake_rate:
    return problem.values()
  step = int(rng.integers(problem.steps))
  wrong = wrong_value(problem.values()[step], problem.modulus, rng)
  return builtin.written_values(problem, step, wrong)


def wrong_value(right: int, modulus: int, rng: np.random.Generator) -> int:
  """A slip: uniform over the modulus - 1 values other than the right one."""
  return (right + 1 + int(rng.integers(modulus - 1))) % modulus


def response_ids(tok: tokenization.Tokenizer, problem: builtin.ChainProblem,
                 values: list[int]) -> list[int]:
  """The assistant's reply to a chain problem after the prompt's `<think>\\n`, ending in
  `<|im_end|>` (see `reply_ids`)."""
  return reply_ids(tok, *builtin.thinking_and_answer(problem, values))


def reply_ids(tok: tokenization.Tokenizer, thinking: str, content: str) -> list[int]:
  """The assistant's reply after the prompt's `<think>\\n`, ending in `<|im_end|>`.

  The ids equal the tail of `render_chat` for the whole conversation, so that the warm start
  trains on exactly what sampling will produce.
  """
  return (tok.encode(thinking + '\n') + [tok.token_id(tokenization.THINK_CLOSE)]
          + tok.encode('\n\n') + tok.encode(content) + [tok.eos_id])


def prefix_value(problem: builtin.ChainProblem, values: list[int], prefix_text: str,
                 step_correct: float, scoring: str = 'leading',
                 blind: frozenset[builtin.Fact] = frozenset()) -> float:
  """Expected points / 7 for finishing a worked solution whose first characters are `prefix_text`.

  `values` are the values the solution writes (the prefix is a prefix of its text); each step not
  yet written is right with probability `step_correct`, as in `sample_values`, or 1 / modulus on a
  `blind` fact (under 'leading' scoring the first wrong one ends the credit; under 'local' every
  right line earns its share). A line counts as written once its value is complete.
  """
  k = problem.steps
  own_lines = builtin.steps_text(problem, values).split('\n')
  *written, last = prefix_text.partition(tokenization.THINK_CLOSE)[0].split('\n')
  if len(written) < k and last == own_lines[len(written)]:
    written.append(last)  # the value is written, only the line break is missing
  written = written[:k]
  credits = builtin.line_credits(problem, '\n'.join(written), scoring)[:len(written)]
  if blind:
    return _blind_prefix_value(problem, values[len(written) - 1] if written else problem.start,
                               credits, step_correct, scoring, blind)
  left = k - len(written)
  intact = all(credits)
  if scoring == 'local':
    expected = 6 * (sum(credits) + step_correct * left) / k
    return (expected + (step_correct ** left if intact else 0.0)) / 7

  correct = sum(credits)
  if not intact:
    return _points(correct, k, scoring) / 7
  expected = sum(step_correct ** g * (1 - step_correct) * _points(correct + g, k, scoring)
                 for g in range(left))
  return (expected + step_correct ** left * _points(k, k, scoring)) / 7


def _points(correct: float, k: int, scoring: str) -> float:
  """Points of `correct` credited lines out of `k`, the answer right when all are."""
  return builtin.line_points(correct, k, scoring) + int(correct == k)


def _blind_prefix_value(problem: builtin.ChainProblem, last_written: int, credits: list[bool],
                        step_correct: float, scoring: str, blind: frozenset[builtin.Fact]
                        ) -> float:
  """`prefix_value` when some facts are blind: a line's chance of being right then depends on
  the value written before it, so the written value's distribution is carried step by step."""
  p, k = problem.modulus, problem.steps
  truth = [problem.start, *problem.values()]

  def right(step: int, previous: int) -> float:
    return 1.0 / p if builtin.step_fact(problem, step, previous) in blind else step_correct

  # The chance that every line from here on is right: the path is then the true one.
  stay_right = [right(j, truth[j]) for j in range(len(credits), k)]
  intact = all(credits)
  if scoring in builtin.LEADING_SCORINGS:
    correct = sum(credits)
    if not intact:
      return _points(correct, k, scoring) / 7
    expected, reach = 0.0, 1.0
    for g, q in enumerate(stay_right):
      expected += reach * (1 - q) * _points(correct + g, k, scoring)
      reach *= q
    return (expected + reach * _points(k, k, scoring)) / 7
  dist_P = np.zeros(p)
  dist_P[last_written] = 1.0
  lines = float(sum(credits))
  for j in range(len(credits), k):
    next_P = np.zeros(p)
    for x in np.flatnonzero(dist_P):
      share = dist_P[x]
      if builtin.step_fact(problem, j, int(x)) in blind:  # a guess: right 1 time in p
        lines += share / p
        next_P += share / p
      else:  # right with step_correct, else any of the p - 1 wrong values
        lines += share * step_correct
        next_P += share * (1 - step_correct) / (p - 1)
        next_P[problem.apply(j, int(x))] += share * (step_correct - (1 - step_correct) / (p - 1))
    dist_P = next_P
  return (6 * lines / k + (float(np.prod(stay_right)) if intact else 0.0)) / 7


@dataclasses.dataclass(frozen=True)
class ChainCorpus:
  """Worked chain solutions with mistakes (`sample_values`), valued by `prefix_value`; the
  solver does not know the results of its `blind` share of the facts (`builtin.blind_facts`)."""

  scoring: str = 'local'
  mistake_rate: float = 0.0
  step_mistake_rate: float = 0.0
  value_step_mistake_rate: float | None = None  # the solver `value` labels for; None: this one
  blind: float = 0.0

  def parse(self, prompt: str) -> builtin.ChainProblem:
    return builtin.parse_problem(prompt)

  def sample(self, problem, rng: np.random.Generator, clean: bool = False):
    # Clean solutions make no mistakes, but a blind fact's result is unknown even then.
    return sample_values(problem, rng, 0.0 if clean else self.mistake_rate,
                         0.0 if clean else self.step_mistake_rate,
                         builtin.blind_facts(problem.modulus, self.blind))

  def tokenizer_sample(self, problem, rng: np.random.Generator):
    return sample_values(problem, rng, 0.5)

  def texts(self, problem, solution) -> tuple[str, str]:
    return builtin.thinking_and_answer(problem, solution)

  def value(self, problem, solution, prefix_text: str) -> float:
    rate = (self.step_mistake_rate if self.value_step_mistake_rate is None
            else self.value_step_mistake_rate)
    return prefix_value(problem, solution, prefix_text, 1.0 - rate, self.scoring,
                        builtin.blind_facts(problem.modulus, self.blind))


@dataclasses.dataclass(frozen=True)
class WalkCorpus:
  """Walks of a solver that takes a uniform menu move with probability `noise` (else a best
  one) and always on its `blind` share of the numbers (`walk.blind_numbers`), valued exactly by
  `walk.prefix_value` under the solver of `value_noise` (None: the same) and the same blindness."""

  noise: float = 0.0
  value_noise: float | None = None
  blind: float = 0.0

  def parse(self, prompt: str) -> walk.WalkProblem:
    return walk.parse_problem(prompt)

  def sample(self, problem, rng: np.random.Generator, clean: bool = False):
    # Clean walks make no mistakes, but a blind number's best move is unknown even then.
    return walk.sample_walk(problem, rng, 0.0 if clean else self.noise, self.blind)

  def tokenizer_sample(self, problem, rng: np.random.Generator):
    return walk.sample_walk(problem, rng, 0.5)

  def texts(self, problem, solution) -> tuple[str, str]:
    return walk.thinking_and_answer(problem, *solution)

  def value(self, problem, solution, prefix_text: str) -> float:
    del solution  # the state is in the text
    return walk.prefix_value(problem, prefix_text,
                             self.noise if self.value_noise is None else self.value_noise,
                             self.blind)


def corpus_of(task, *, mistake_rate: float = 0.0, step_mistake_rate: float = 0.0,
              value_step_mistake_rate: float | None = None, blind_fraction: float = 0.0):
  """The corpus of a built-in task (chain or walk) at the given mistake rates; its values are
  those of a solver at `value_step_mistake_rate` (None: at `step_mistake_rate`). The walk's solver
  does not know the best move on `blind_fraction` of the numbers (`walk.blind_numbers`), the
  chain's the result of `blind_fraction` of the facts (`builtin.blind_facts`)."""
  if value_step_mistake_rate is not None and not 0.0 <= value_step_mistake_rate <= 1.0:
    raise ValueError(f'value_step_mistake_rate must lie in [0, 1], got {value_step_mistake_rate}')
  if isinstance(task, walk.WalkTask):
    if mistake_rate:
      raise ValueError('the walk task has no whole-solution mistakes: set mistake_rate=0 and '
                       'step_mistake_rate (the share of off-plan moves)')
    walk.blind_numbers(task.settings.goal, blind_fraction)  # checks the fraction
    return WalkCorpus(step_mistake_rate, value_step_mistake_rate, blind_fraction)
  builtin.blind_facts(task.settings.modulus, blind_fraction)  # checks the fraction
  if blind_fraction and mistake_rate:
    raise ValueError('the chain\'s blind facts go with step mistakes: set mistake_rate=0')
  return ChainCorpus(task.settings.scoring, mistake_rate, step_mistake_rate,
                     value_step_mistake_rate, blind_fraction)


def sft_examples(task, tok: tokenization.Tokenizer, *,
                 mistake_rate: float, step_mistake_rate: float = 0.0, seed: int = 0,
                 split: str = 'train', epochs: int | None = 1, clean_first: int = 0,
                 blind_fraction: float = 0.0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(prompt_ids, response_ids) int32 arrays of worked solutions, in a seeded order.

  Each epoch visits every problem of `split` once in a fresh permutation, drawing fresh mistakes.
  The first `clean_first` solutions of the stream carry no mistakes. `epochs=None` repeats
  forever. The same arguments give the same stream.
  """
  records = task.records(split)
  if not records:
    raise ValueError(f'the built-in task has no {split!r} problems')
  if not 0.0 <= mistake_rate <= 1.0:
    raise ValueError(f'mistake_rate must lie in [0, 1], got {mistake_rate}')
  if epochs is not None and epochs < 1:
    raise ValueError(f'epochs must be >= 1 or None, got {epochs}')
  if clean_first < 0:
    raise ValueError(f'clean_first must be >= 0, got {clean_first}')
  corpus = corpus_of(task, mistake_rate=mistake_rate, step_mistake_rate=step_mistake_rate,
                     blind_fraction=blind_fraction)
  rng = np.random.default_rng(seed)
  problems = [corpus.parse(r.prompt) for r in records]
  prompts = [np.asarray(task.prompt_ids(tok, r), np.int32) for r in records]
  epoch, n = 0, 0
  while epochs is None or epoch < epochs:
    for i in rng.permutation(len(records)):
      solution = corpus.sample(problems[i], rng, clean=n < clean_first)
      yield prompts[i], np.asarray(reply_ids(tok, *corpus.texts(problems[i], solution)),
                                   np.int32)
      n += 1
    epoch += 1


def critic_examples(task, tok: tokenization.Tokenizer, *,
                    step_mistake_rate: float, seed: int = 0,
                    value_step_mistake_rate: float | None = None, blind_fraction: float = 0.0
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(critic context ids, value target ids) pairs that teach the critic's answer format, forever.

  A worked solution of the warm-start corpus is cut at a random token, framed as the critic reads
  it (half of the time with the reference solution), and labelled with its exact value, rounded to
  the grid: the value under the corpus's own mistake rate, or under `value_step_mistake_rate`
  (the values of a sharper solver, when RL will soon make the policy one).
  """
  corpus = corpus_of(task, step_mistake_rate=step_mistake_rate,
                     value_step_mistake_rate=value_step_mistake_rate,
                     blind_fraction=blind_fraction)
  records = task.records('train')
  rng = np.random.default_rng(seed)
  while True:
    record = records[int(rng.integers(len(records)))]
    problem = corpus.parse(record.prompt)
    solution = corpus.sample(problem, rng)
    response = reply_ids(tok, *corpus.texts(problem, solution))
    prefix = response[:int(rng.integers(len(response)))]
    reference = record.reference_solution if rng.random() < 0.5 else None
    text = tok.decode(prefix)
    context = critic.critic_context_ids(tok, task.prompt_ids(tok, record), prefix,
                                        instruction_text=task.critic_instruction(reference, text))
    value = corpus.value(problem, solution, text)
    yield (np.asarray(context, np.int32),
           np.asarray(critic.value_target_ids(tok, critic.round_to_grid(value)), np.int32))


def lookup_key(task, record, response_text: str) -> tuple[int, int]:
  """What the reference lookup values a partial built-in response by: in the chain (lines
  written, lines credited) under the task's scoring, in the walk (moves left, number reached)."""
  if isinstance(task, walk.WalkTask):
    x, left = walk.state_of(walk.parse_problem(record.prompt), response_text)
    return left, x
  problem = builtin.parse_problem(record.prompt)
  thinking = response_text.partition('</think>')[0]
  written = min(thinking.count('\n'), problem.steps)  # a line counts once its break is written
  complete = '\n'.join(thinking.split('\n')[:written])
  credits = builtin.line_credits(problem, complete, task.settings.scoring)
  return written, sum(credits[:written])


def tokenizer_corpus(task, *, max_problems: int = 4000, seed: int = 0) -> Iterator[str]:
  """Texts to train the built-in tokenizer on: prompts, worked solutions (some with mistakes),
  critic instructions with and without a reference, critic answers, and the chat role names."""
  corpus = corpus_of(task)
  rng = np.random.default_rng(seed)
  response = ''
  yield 'system\nuser\nassistant\n'
  for record in task.records('train')[:max_problems]:
    problem = corpus.parse(record.prompt)
    yield record.prompt
    thinking, content = corpus.texts(problem, corpus.tokenizer_sample(problem, rng))
    response = f'{thinking}\n{tokenization.THINK_CLOSE}\n\n{content}'
    yield response
  reference = task.records('train')[0].reference_solution
  yield task.critic_instruction(None)
  yield task.critic_instruction(reference, response)
  for value in builtin.VALUE_GRID:
    yield f'{builtin.CRITIC_STEM} {value}'
