"""The critic warm-up: before RL, the critic alone learns exact prefix values, one cut depth at a time.

AC2's critic is the policy asked by prompt, and RL gives it few examples (32 pairs a step, about
2,600 in an 80-step run) at a rate tuned for tracking, not for learning a new skill. On the built-in
chain, the skill is checking the attempt's lines, and measured alone (`launch/bench.py
critic_exact`, BENCHMARKS.md "Session 17") the tiny critic learns it only at a low rate (3e-4; at
3e-3 it stays a constant through 48,000 pairs) and only after 12,000-18,000 pairs, and only where
the value turns on one line at a fixed place (a cut right after the first line); on cuts anywhere
it is still a constant after 24,000. Hence a warm-up as long as the policy's own SFT, with a
curriculum over the cut: `curriculum` is a list of stages (cut_lines, pairs), where cut_lines N
cuts each corpus solution right after one of its first N whole lines (uniform) and 0 at a uniform
token of its reasoning (every cut the controller can draw). A tail stage ('tN:pairs', stored as
cut_lines -N) cuts right after any whole line and lets only the last N lines before the cut be
wrong: its values turn on where the attempt ends and on its last lines, the part of a chunk's end
state that differs between the chunks of one group.

The prefixes come from the warm-start corpus (each step wrong with `mistake_rate`, the solver
carrying on from what it wrote; the walk: off-plan moves), labelled with their exact expected value
(`builtin_sft` corpora): no rollouts, no label noise. They go through the real critic prompt, loss
and update (`rt.critic_step`), so the warm-up trains what the run's critic update trains: the
adapter (`critic.adapter_rank`), or the shared weights (then the policy moves too).

The result is cached in the workdir under a key of everything that shapes it, written as an orbax
checkpoint of the trained field and the critic's Adam moments; a rerun or a resumed run restores it
instead of training again, and starts RL exactly as the run that trained it did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Callable, Iterator

import numpy as np

from ac2_jax import critic as critic_lib
from ac2_jax.learner import critic_adapter
from ac2_jax.learner import rows
from ac2_jax.tasks import builtin, builtin_sft, walk
from ac2_jax.train import checkpointing

LABELS = ('value', 'start', 'state', 'state_lines')
DIRECTORY = 'critic_warmup'


@dataclasses.dataclass(frozen=True)
class WarmupSettings:
  curriculum: tuple[tuple[int, int], ...] = ()  # stages (cut_lines, pairs); () = no warm-up
  learning_rate: float = 3e-4
  pairs_per_update: int = 64
  mistake_rate: float = 0.3      # per-step mistake rate of the corpus the prefixes come from
  with_reference: float = 1.0    # share of critic prompts that carry the reference solution
  blind_fraction: float = 0.0    # the corpus's blind facts (numbers), as its SFT had them
  seed: int = 0

  def __post_init__(self):
    for stage in self.curriculum:
      if len(stage) != 2 or stage[1] < 1:
        raise ValueError(f'a curriculum stage is (cut_lines, pairs >= 1), got {stage}')
    if not 0.0 <= self.mistake_rate < 1.0:
      raise ValueError(f'mistake_rate must lie in [0, 1), got {self.mistake_rate}')
    if self.pairs_per_update < 1 or self.learning_rate <= 0:
      raise ValueError('pairs_per_update >= 1 and learning_rate > 0 required')

  @property
  def pairs(self) -> int:
    return sum(p for _, p in self.curriculum)


def parse_curriculum(text: str) -> tuple[tuple[int, int], ...]:
  """'1:12000,t2:6000,0:12000' -> ((1, 12000), (-2, 6000), (0, 12000)); '' -> ()."""
  stages = []
  for part in filter(None, (p.strip() for p in text.split(','))):
    cut, _, pairs = part.partition(':')
    tail = cut.startswith('t')
    try:
      cut, pairs = int(cut[1:] if tail else cut), int(pairs)
    except ValueError:
      raise ValueError(f'curriculum stage {part!r} is not cut_lines:pairs or tN:pairs (e.g. '
                       f'1:12000, t2:6000)') from None
    if cut < 0 or (tail and cut < 1):
      raise ValueError(f'curriculum stage {part!r}: cut_lines >= 0, a tail of N >= 1 lines')
    stages.append((-cut if tail else cut, pairs))
  return tuple(stages)


def stage_name(cut_lines: int) -> str:
  """A stage's cut as the curriculum writes it: '2', or 't2' for a tail stage (cut_lines -2)."""
  return f't{-cut_lines}' if cut_lines < 0 else str(cut_lines)


@dataclasses.dataclass(frozen=True)
class ExactPrefix:
  context: np.ndarray           # the critic prompt's token ids
  value: float                  # exact expected points / max points (or a control's label)
  lines: tuple[int, int]        # `builtin_sft.lookup_key`: chain (lines written, lines credited),
                                # walk (moves left, number reached)
  verdicts: tuple[bool, ...] = ()  # chain: each written line locally right (a rationale's targets)
  line_texts: tuple[str, ...] = ()  # chain: the written lines
  line_results: tuple[int, ...] = ()  # chain: each line's step worked out from its written input


def exact_prefixes(rt, split: str, seed: int, *, cut_lines: int = 0, mistake_rate: float = 0.3,
                   with_reference: float = 1.0, blind_fraction: float = 0.0,
                   labels: str = 'value') -> Iterator[ExactPrefix]:
  """Corpus prefixes of `split`'s problems with their exact values, forever.

  `labels` other than 'value' are the chain's controls of `launch/bench.py critic_exact`, labels
  that need no checking of the lines: 'start' (the start value / 10), 'state' (the last written
  value / 10) and 'state_lines' (a fixed random table of (last value, lines written)).
  """
  if labels not in LABELS:
    raise ValueError(f'labels must be one of {LABELS}, got {labels!r}')
  tok, task = rt.tokenizer, rt.task
  if isinstance(task, walk.WalkTask) and labels != 'value':
    raise ValueError(f'labels={labels!r} is a control of the chain task; the walk measures its '
                     f'values (labels=value)')
  corpus = builtin_sft.corpus_of(task, step_mistake_rate=mistake_rate,
                                 blind_fraction=blind_fraction)
  if cut_lines < 0 and (isinstance(task, walk.WalkTask) or blind_fraction):
    raise ValueError('a tail stage (cut_lines < 0) writes a chain whose lines before its tail are '
                     'right: the chain task without blind facts')
  records = task.records(split)
  rng = np.random.default_rng(seed)
  think_close = tok.token_id('</think>')
  line_break = tok.encode('\n')[-1]
  while True:
    record = records[int(rng.integers(len(records)))]
    problem = corpus.parse(record.prompt)
    last_line = int(rng.integers(1, problem.steps + 1)) if cut_lines < 0 else 0
    solution = (tail_values(problem, rng, last_line, -cut_lines, mistake_rate) if last_line
                else corpus.sample(problem, rng))
    response = builtin_sft.reply_ids(tok, *corpus.texts(problem, solution))
    reasoning = response[:response.index(think_close)]
    if last_line:
      breaks = [i for i, t in enumerate(reasoning) if t == line_break]
      prefix = response[:breaks[min(last_line, len(breaks)) - 1] + 1]
    elif cut_lines:
      breaks = [i for i, t in enumerate(reasoning) if t == line_break]
      prefix = response[:breaks[min(int(rng.integers(cut_lines)), len(breaks) - 1)] + 1]
    else:
      prefix = response[:int(rng.integers(len(reasoning) + 1))]
    reference = record.reference_solution if rng.random() < with_reference else None
    context = rt.critic_context(np.asarray(task.prompt_ids(tok, record), np.int32),
                                np.asarray(prefix, np.int32), reference)
    if context is None:
      raise ValueError(f'a critic prompt of {split} problem {record.id} does not fit the context')
    text = tok.decode(prefix)
    lines = builtin_sft.lookup_key(task, record, text)
    chain = not isinstance(task, walk.WalkTask)
    verdicts = line_verdicts(problem, text, lines[0]) if chain else ()
    line_texts = tuple(text.partition('</think>')[0].split('\n')[:lines[0]]) if chain else ()
    if labels == 'start':
      value = problem.start / 10
    elif labels in ('state', 'state_lines'):
      state = solution[lines[0] - 1] if lines[0] else problem.start
      value = state / 10 if labels == 'state' else state_lines_value(state, lines[0])
    else:
      value = corpus.value(problem, solution, text)
    yield ExactPrefix(context, float(value), lines, verdicts, line_texts,
                      line_results(problem, line_texts) if chain else ())


def line_verdicts(problem, response_text: str, written: int) -> tuple[bool, ...]:
  """Whether each of the first `written` lines of a chain attempt is locally right (its written
  input, operation and result agree), whatever the task's scoring credits."""
  thinking = response_text.partition('</think>')[0]
  complete = '\n'.join(thinking.split('\n')[:written])
  return tuple(builtin.line_credits(problem, complete, 'local')[:written])


def tail_values(problem, rng: np.random.Generator, last_line: int, tail: int, mistake_rate: float
                ) -> list[int]:
  """A chain's written values, each step wrong with `mistake_rate` among lines last_line - tail + 1
  .. last_line (1-based; the solver carrying on from what it wrote) and right everywhere else."""
  values, v = [], problem.start
  for i in range(problem.steps):
    v = problem.apply(i, v)
    if last_line - tail <= i < last_line and rng.random() < mistake_rate:
      v = builtin_sft.wrong_value(v, problem.modulus, rng)
    values.append(v)
  return values


def state_lines_value(state: int, lines: int) -> float:
  """A fixed pseudo-random grid value of (state, lines written): the `state_lines` control."""
  return critic_lib.GRID[(state * 7 + lines * 3 + state * lines) % len(critic_lib.GRID)]


@dataclasses.dataclass(frozen=True)
class _Record:
  """What `rows.critic_records_batch` reads from a critic-buffer record."""
  target: float
  weight: float = 1.0
  value: float | None = None  # the unrounded target (two-hot targets spread it)


# '' (the paper's critic: the value alone), 'verdicts' (y/n per line, then the value), 'lines'
# (each line repeated by the host, the critic's y/n after it, then the value), 'recompute' (per
# line the critic works the line's step out itself, then judges the written result against it),
# 'inline' (the critic's y/n inside the attempt, right after each line's result: where the
# policy's own forward computes that result).
RATIONALES = ('', 'verdicts', 'lines', 'recompute', 'inline')


def with_verdicts(rt, prefix: ExactPrefix, layout: str = 'verdicts'
                  ) -> tuple[np.ndarray, list[int]]:
  """The prefix's critic prompt with its true rationale written before the value (teacher-forced;
  `layout` one of RATIONALES), and the positions of the tokens the critic writes in it."""
  if layout == 'inline':
    return inline_verdicts(rt.tokenizer, prefix)
  if layout == 'recompute':
    rationale, offsets = recompute_rationale(rt.tokenizer, prefix)
  else:
    lines = prefix.line_texts if layout == 'lines' else None
    rationale, offsets = critic_lib.verdict_rationale(rt.tokenizer, prefix.verdicts, lines)
  ids, start = critic_lib.with_rationale(rt.tokenizer, prefix.context, rationale)
  return np.asarray(ids, np.int32), [start + o for o in offsets]


def inline_verdicts(tok, prefix: ExactPrefix) -> tuple[np.ndarray, list[int]]:
  """The critic prompt with a verdict token after each written line's result, before its line
  break, inside the attempt (its lines are the first '=' ... '\n' spans of the prompt), and the
  verdicts' positions."""
  context = prefix.context.tolist()
  equals, line_break = tok.encode('=')[0], tok.encode('\n')[-1]
  ids, positions, i = [], [], 0
  for verdict in prefix.verdicts:
    i = context.index(equals, i)
    i = context.index(line_break, i)
    ids += context[len(ids) - len(positions):i]
    positions.append(len(ids))
    ids.append(critic_lib.prompt.verdict_token(tok, verdict))
  ids += context[len(ids) - len(positions):]
  return np.asarray(ids, np.int32), positions


def recompute_rationale(tok, prefix: ExactPrefix) -> tuple[list[int], list[int]]:
  """Per written line 'a op b=c', the rationale line 'a op b=r c v': the host writes the step as
  the attempt wrote it, the critic its own result r (what the policy writes after 'a op b=' in its
  own reasoning; measured in the critic's reply, the warm start gets 39% right: BENCHMARKS.md,
  "Session 20"), the host the attempt's result c, the critic its verdict v (r = c: a comparison of
  neighbours).
  Returns (ids, offsets of r and v)."""
  ids, offsets = [], []
  for line, result, verdict in zip(prefix.line_texts, prefix.line_results, prefix.verdicts):
    step, _, written = line.partition('=')
    ids += tok.encode(step + '=')
    offsets.append(len(ids))
    ids += tok.encode(str(result))
    ids += tok.encode(' ' + written)
    offsets.append(len(ids))
    ids.append(critic_lib.prompt.verdict_token(tok, verdict))
    ids += tok.encode('\n')
  return ids, offsets


def line_results(problem, line_texts) -> tuple[int, ...]:
  """Each chain line's step worked out from the input it wrote ('5*2=0' -> 5*2 mod p = 3)."""
  results = []
  for i, line in enumerate(line_texts):
    m = builtin.LINE_RE.fullmatch(line)
    if m is None:
      raise ValueError(f'not a chain line: {line!r}')
    results.append(problem.apply(i, int(m.group(1))))
  return tuple(results)


def train(rt, state, settings: WarmupSettings, *, labels: str = 'value', rationale: str = '',
          on_pairs: Callable[[object, int], None] | None = None):
  """Runs the curriculum through `rt.critic_step`; returns the state. `on_pairs(state, done)` is
  called after every update (a benchmark evaluates there). With a `rationale` (RATIONALES) the
  critic writes a verdict per line of the attempt before its value (`with_verdicts`), trained
  with it."""
  if rationale not in RATIONALES:
    raise ValueError(f'rationale must be one of {RATIONALES}, got {rationale!r}')
  lr = np.float32(settings.learning_rate)
  done = 0
  for i, (cut_lines, pairs) in enumerate(settings.curriculum):
    stream = exact_prefixes(rt, 'train', settings.seed + 3 + 1000 * i, cut_lines=cut_lines,
                            mistake_rate=settings.mistake_rate,
                            with_reference=settings.with_reference,
                            blind_fraction=settings.blind_fraction, labels=labels)
    end = done + pairs
    while done < end:
      batch = [next(stream) for _ in range(min(settings.pairs_per_update, end - done))]
      records = [_Record(critic_lib.round_to_grid(p.value), value=p.value) for p in batch]
      if rationale:
        contexts, spans = zip(*(with_verdicts(rt, p, rationale) for p in batch))
        device_batch = rows.critic_records_batch(rt, contexts, records, rationales=spans)
      else:
        # Marked as the run's critic reads them, when it self-checks.
        contexts = rows.self_checked(rt, state.params, [p.context for p in batch])
        kept = [i for i, c in enumerate(contexts) if c is not None]
        device_batch = rows.critic_records_batch(rt, [contexts[i] for i in kept],
                                                 [records[i] for i in kept])
      state, _ = rt.critic_step(state, device_batch, lr)
      done += len(batch)
      if on_pairs is not None:
        on_pairs(state, done)
  return state


def cache_key(settings: WarmupSettings, model_checkpoint: str, config_key: str) -> str:
  blob = json.dumps([dataclasses.asdict(settings), os.path.abspath(model_checkpoint), config_key],
                    sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warm_up(rt, state, settings: WarmupSettings, workdir: str, key: str, log=print):
  """`state` with the warmed-up critic: restored from `workdir` when this key was trained there
  before, else trained (progress logged every ~10%) and saved."""
  field = critic_adapter.trained_field(state)
  restored = restore(state, workdir, key, log=log)
  if restored is not None:
    log(f'critic warm-up: restored {settings.pairs} pairs from {directory(workdir, key)}')
    return restored
  total, start = settings.pairs, time.time()
  log(f'critic warm-up: {total} pairs of exact prefix values, curriculum '
      f'{list(settings.curriculum)} (cut_lines, pairs), lr {settings.learning_rate:g}, '
      f'training the {"adapter" if field != "params" else "shared weights"}')
  every, logged = max(1, total // 10), [0]

  def progress(_, done):
    if done // every > logged[0] or done == total:
      logged[0] = done // every
      elapsed = time.time() - start
      log(f'critic warm-up: {done}/{total} pairs ({elapsed:.0f}s, ETA '
          f'{elapsed * (total - done) / max(done, 1):.0f}s)')

  state = train(rt, state, settings, on_pairs=progress)
  save(state, workdir, key, settings)
  return state


def directory(workdir: str, key: str) -> str:
  return os.path.join(workdir, DIRECTORY, key)


def _critic_of(state) -> dict:
  """What the warm-up changes: the critic's trained field and its Adam moments (kept too, so that a
  run restoring the warm-up starts RL exactly as the run that trained it did)."""
  return {'trained': getattr(state, critic_adapter.trained_field(state)),
          'critic_opt_state': state.critic_opt_state}


def save(state, workdir: str, key: str, settings: WarmupSettings) -> None:
  """Writes the critic (the adapter or the shared weights, and its optimizer state) under `key`."""
  checkpointer = checkpointing.Checkpointer(directory(workdir, key), keep=1)
  try:
    checkpointer.save(settings.pairs, _critic_of(state),
                      {'key': key, 'settings': dataclasses.asdict(settings)})
  finally:
    checkpointer.close()


def restore(state, workdir: str, key: str, log=print):
  """`state` with the critic saved under `key`, or None when there is none."""
  checkpointer = checkpointing.Checkpointer(directory(workdir, key), keep=1)
  try:
    restored = checkpointer.restore_newest_intact(_critic_of(state), log=log)
  finally:
    checkpointer.close()
  if restored is None:
    return None
  critic = restored[1]
  return dataclasses.replace(state, critic_opt_state=critic['critic_opt_state'],
                             **{critic_adapter.trained_field(state): critic['trained']})
