"""The built-in task's text corpora: worked solutions for the supervised warm start, with injected
mistakes, and the text the built-in SentencePiece tokenizer is trained on.

The warm start's starting accuracy is set by two knobs: `mistake_rate` (the share of training
solutions that carry one wrong intermediate value, after which the chain continues correctly from
the wrong value, so the answer is wrong too) and how long the warm start runs. A `tiny` model that
imitates the corpus perfectly solves about 1 - mistake_rate of the problems; stopped early it
solves fewer (BUILTIN_TASK_NOTES.md: accuracy rises steeply with steps).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ac2_jax import tokenization
from ac2_jax.tasks import builtin


def sample_values(problem: builtin.ChainProblem, rng: np.random.Generator,
                  mistake_rate: float, step_mistake_rate: float = 0.0) -> list[int]:
  """Written values of one worked solution: correct, or (with `mistake_rate`) one mistake.

  With `step_mistake_rate` > 0 instead, every step is independently wrong with that probability
  (the solver carries on from whatever it wrote). A model imitating these solutions errs at about
  that rate per step, which sets its starting accuracy far more reliably than the length of the
  warm start does (accuracy jumps once the arithmetic is learned).
  """
  if not 0.0 <= mistake_rate <= 1.0:
    raise ValueError(f'mistake_rate must lie in [0, 1], got {mistake_rate}')
  if not 0.0 <= step_mistake_rate <= 1.0:
    raise ValueError(f'step_mistake_rate must lie in [0, 1], got {step_mistake_rate}')
  if step_mistake_rate > 0.0:
    out, v = [], problem.start
    for i in range(problem.steps):
      v = problem.apply(i, v)
      if rng.random() < step_mistake_rate:
        v = (v + 1 + int(rng.integers(problem.modulus - 1))) % problem.modulus
      out.append(v)
    return out
  if rng.random() >= mistake_rate:
    return problem.values()
  step = int(rng.integers(problem.steps))
  true_value = problem.values()[step]
  # Uniform over the modulus - 1 values other than the true one.
  wrong = (true_value + 1 + int(rng.integers(problem.modulus - 1))) % problem.modulus
  return builtin.written_values(problem, step, wrong)


def response_ids(tok: tokenization.Tokenizer, problem: builtin.ChainProblem,
                 values: list[int]) -> list[int]:
  """The assistant's reply after the prompt's `<think>\\n`, ending in `<|im_end|>`.

  The ids equal the tail of `render_chat` for the whole conversation, so that the warm start
  trains on exactly what sampling will produce.
  """
  thinking, content = builtin.thinking_and_answer(problem, values)
  return (tok.encode(thinking + '\n') + [tok.token_id(tokenization.THINK_CLOSE)]
          + tok.encode('\n\n') + tok.encode(content) + [tok.eos_id])


def sft_examples(task: builtin.BuiltinTask, tok: tokenization.Tokenizer, *,
                 mistake_rate: float, step_mistake_rate: float = 0.0, seed: int = 0,
                 split: str = 'train', epochs: int | None = 1
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(prompt_ids, response_ids) int32 arrays of worked solutions, in a seeded order.

  Each epoch visits every problem of `split` once in a fresh permutation, drawing fresh mistakes.
  `epochs=None` repeats forever. The same arguments give the same stream.
  """
  records = task.records(split)
  if not records:
    raise ValueError(f'the built-in task has no {split!r} problems')
  if not 0.0 <= mistake_rate <= 1.0:
    raise ValueError(f'mistake_rate must lie in [0, 1], got {mistake_rate}')
  if epochs is not None and epochs < 1:
    raise ValueError(f'epochs must be >= 1 or None, got {epochs}')
  rng = np.random.default_rng(seed)
  problems = [builtin.parse_problem(r.prompt) for r in records]
  prompts = [np.asarray(task.prompt_ids(tok, r), np.int32) for r in records]
  epoch = 0
  while epochs is None or epoch < epochs:
    for i in rng.permutation(len(records)):
      values = sample_values(problems[i], rng, mistake_rate, step_mistake_rate)
      yield prompts[i], np.asarray(response_ids(tok, problems[i], values), np.int32)
    epoch += 1


def tokenizer_corpus(task: builtin.BuiltinTask, *, max_problems: int = 4000, seed: int = 0
                     ) -> Iterator[str]:
  """Texts to train the built-in tokenizer on: prompts, worked solutions (some with mistakes),
  critic instructions with and without a reference, critic answers, and the chat role names."""
  rng = np.random.default_rng(seed)
  yield 'system\nuser\nassistant\n'
  for record in task.records('train')[:max_problems]:
    problem = builtin.parse_problem(record.prompt)
    yield record.prompt
    yield builtin.response_text(problem, sample_values(problem, rng, 0.5))
  reference = task.records('train')[0].reference_solution
  yield task.critic_instruction(None)
  yield task.critic_instruction(reference)
  for value in builtin.VALUE_GRID:
    yield f'{builtin.CRITIC_STEM} {value}'

