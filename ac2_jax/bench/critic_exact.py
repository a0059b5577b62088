"""Can the critic learn exact prefix values at all? (`python launch/bench.py critic_exact`)

The critic probe (`bench/critic.py`) trains on Monte Carlo labels of the policy's own prefixes, so a
critic that stays near a constant there may lack data, be drowned by label noise, or be unable to
compute the value at all. This benchmark takes the noise and the policy out: prefixes of the
warm-start corpus (each step wrong with probability `mistake_rate`, the solver carrying on from
what it wrote), cut inside the reasoning, labelled with their exact expected value
(`builtin_sft.prefix_value`), trained through the real critic prompt, loss and update, and read on
prefixes of held-out (validation) problems. It prints, every `eval_every` pairs:

- the critic's MAE against the constant predictor's, the correlation of its reads with the exact
  values, and the spread of its reads (a critic that answers one value has spread 0);
- once, before training: `linear`, a ridge regression from the critic's final hidden state at its
  answer position to the value (fitted on the baselines' training prefixes): whether the warm
  start already represents the value where the critic must read it;
- two baselines on the same held-out prefixes: `lookup`, the mean training value of prefixes with
  the same (lines written, lines credited), which needs the lines checked; and `position`, the same
  by lines written alone, which a reader that only counts lines could reach. On the walk task
  (task.name=walk) `lookup` keys on the state itself (moves left, number reached: exact) and
  `position` on the moves left alone; `mistake_rate` is the corpus's share of off-plan moves.

Two controls swap the values for labels that need no checking of the lines: `--labels=start`, the
start value / 10 (a token of the prompt: shows the update itself can move the critic's reads), and
`--labels=state`, the last value the attempt wrote / 10 (the start value before any line: a token
of the attempt, the state a planning task's value would depend on); `--labels=state_lines`, a fixed
random table of (last value, lines written), the shape of a planning task's V(state, steps left).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator, Sequence

import jax
import numpy as np

from ac2_jax import critic as critic_lib
from ac2_jax import models
from ac2_jax import sampling
from ac2_jax.bench import critic as probe
from ac2_jax.tasks import builtin_sft, walk

LABELS = ('value', 'start', 'state', 'state_lines')


@dataclasses.dataclass(frozen=True)
class ExactSettings:
  pairs: int = 6_400
  pairs_per_update: int = 32
  eval_every: int = 1_280
  learning_rate: float = 1e-3
  mistake_rate: float = 0.3     # per-step mistake rate of the corpus the prefixes come from
  held_out: int = 512           # prefixes of validation problems
  baseline_pairs: int = 4_000   # training prefixes the baselines' tables are built from
  with_reference: float = 1.0   # share of critic prompts that carry the reference solution
  labels: str = 'value'         # 'value' | 'start' | 'state' | 'state_lines' (the controls)
  # 0: cut at a uniform token of the reasoning; N: right after 1..N whole lines (uniform), the
  # easiest case, where the value turns on one or two lines only.
  cut_lines: int = 0
  seed: int = 0

  def __post_init__(self):
    if self.labels not in LABELS:
      raise ValueError(f'labels must be one of {LABELS}, got {self.labels!r}')
    if not 0.0 <= self.mistake_rate < 1.0:
      raise ValueError(f'mistake_rate must lie in [0, 1), got {self.mistake_rate}')
    if self.cut_lines < 0:
      raise ValueError(f'cut_lines must be >= 0, got {self.cut_lines}')
    if min(self.pairs_per_update, self.eval_every, self.held_out) < 1 or self.pairs < 0:
      raise ValueError('pairs >= 0 and pairs_per_update, eval_every, held_out >= 1 required')


@dataclasses.dataclass(frozen=True)
class ExactPrefix:
  context: np.ndarray           # the critic prompt's token ids
  value: float                  # exact expected points / 7 (or the control's label)
  lines: tuple[int, int]        # `critic.lookup_key`: chain (lines written, lines credited),
                                # walk (moves left, number reached)


def prefixes(rt, settings: ExactSettings, split: str, seed: int) -> Iterator[ExactPrefix]:
  """Corpus prefixes of `split`'s problems, cut at a uniform token of the reasoning, forever."""
  tok, task = rt.tokenizer, rt.task
  is_walk = isinstance(task, walk.WalkTask)
  if is_walk and settings.labels != 'value':
    raise ValueError(f'labels={settings.labels!r} is a control of the chain task; the walk '
                     f'measures its values (labels=value)')
  corpus = builtin_sft.corpus_of(task, step_mistake_rate=settings.mistake_rate)
  records = task.records(split)
  rng = np.random.default_rng(seed)
  think_close = tok.token_id('</think>')
  line_break = tok.encode('\n')[-1]
  while True:
    record = records[int(rng.integers(len(records)))]
    problem = corpus.parse(record.prompt)
    solution = corpus.sample(problem, rng)
    response = builtin_sft.reply_ids(tok, *corpus.texts(problem, solution))
    reasoning = response[:response.index(think_close)]
    if settings.cut_lines:
      breaks = [i for i, t in enumerate(reasoning) if t == line_break]
      prefix = response[:breaks[min(int(rng.integers(settings.cut_lines)), len(breaks) - 1)] + 1]
    else:
      prefix = response[:int(rng.integers(len(reasoning) + 1))]
    reference = (record.reference_solution if rng.random() < settings.with_reference else None)
    context = rt.critic_context(np.asarray(task.prompt_ids(tok, record), np.int32),
                                np.asarray(prefix, np.int32), reference)
    if context is None:
      raise ValueError(f'a critic prompt of {split} problem {record.id} does not fit the context')
    text = tok.decode(prefix)
    lines = probe.lookup_key(task, record, text)
    if settings.labels == 'start':
      value = problem.start / 10
    elif settings.labels in ('state', 'state_lines'):
      state = solution[lines[0] - 1] if lines[0] else problem.start
      value = state / 10 if settings.labels == 'state' else state_lines_value(state, lines[0])
    else:
      value = corpus.value(problem, solution, text)
    yield ExactPrefix(context, float(value), lines)


def state_lines_value(state: int, lines: int) -> float:
  """A fixed pseudo-random grid value of (state, lines written): the `state_lines` control."""
  return critic_lib.GRID[(state * 7 + lines * 3 + state * lines) % len(critic_lib.GRID)]


def _table_baseline(train: Sequence[ExactPrefix], key) -> callable:
  mean = float(np.mean([p.value for p in train]))
  groups: dict = {}
  for p in train:
    groups.setdefault(key(p), []).append(p.value)
  table = {k: float(np.mean(v)) for k, v in groups.items()}
  return lambda p: table.get(key(p), mean)


def figures(reads: np.ndarray, held: Sequence[ExactPrefix], constant: float) -> dict:
  values = np.array([p.value for p in held])
  return {'mae': float(np.abs(reads - values).mean()),
          'mae_constant': float(np.abs(values - constant).mean()),
          'corr': probe._corr(reads, values), 'spread': float(reads.std()),
          'value_spread': float(values.std())}


def expected_reads(rt, params, held: Sequence[ExactPrefix]) -> np.ndarray:
  """The expectation readout over the grid tokens (one forward per prefix)."""
  grid_ids = [critic_lib.value_target_ids(rt.tokenizer, v)[0] for v in critic_lib.GRID]
  probs_NxM = sampling.token_distribution(rt.model_config, params, [p.context for p in held],
                                          grid_ids, renormalize=True, mesh=rt.mesh)
  return probs_NxM @ np.asarray(critic_lib.GRID, np.float64)


def last_hidden(rt, params, contexts: Sequence[np.ndarray], rows: int = 64) -> np.ndarray:
  """The final (normed) hidden state at each context's last position, float64 [N, E]."""
  forward = jax.jit(lambda p, t, n: models.forward(rt.model_config, p, t, lengths_B=n,
                                                   output='hidden')[0])
  T = sampling.bucket(max(len(c) for c in contexts))
  out = []
  for i in range(0, len(contexts), rows):
    chunk = contexts[i:i + rows]
    tokens_BxT = np.zeros((rows, T), np.int32)
    lengths_B = np.ones((rows,), np.int32)
    for b, c in enumerate(chunk):
      tokens_BxT[b, :len(c)], lengths_B[b] = c, len(c)
    hidden_BxTxE = np.asarray(forward(params, tokens_BxT, lengths_B), np.float64)
    out.extend(hidden_BxTxE[b, len(c) - 1] for b, c in enumerate(chunk))
  return np.stack(out)


def ridge_reads(x_train_NxE, y_train_N, x_NxE, penalty: float = 1.0) -> np.ndarray:
  """Ridge regression fitted on (x_train, y_train), read on x."""
  mean_E, y_mean = x_train_NxE.mean(0), y_train_N.mean()
  a_NxE = x_train_NxE - mean_E
  w_E = np.linalg.solve(a_NxE.T @ a_NxE + penalty * np.eye(a_NxE.shape[1]),
                        a_NxE.T @ (y_train_N - y_mean))
  return (x_NxE - mean_E) @ w_E + y_mean


def run(rt, state, settings: ExactSettings, *, records_batch, log=print, on_report=None
        ) -> list[dict]:
  """Trains the critic alone on exact-valued corpus prefixes; evaluates on held-out problems."""
  held = [next(it) for it in [prefixes(rt, settings, 'validation', settings.seed + 1)]
          for _ in range(settings.held_out)]
  base = prefixes(rt, settings, 'train', settings.seed + 2)
  base_set = [next(base) for _ in range(settings.baseline_pairs)]
  constant = float(np.mean([p.value for p in base_set]))
  baselines = {'lookup': _table_baseline(base_set, lambda p: p.lines),
               'position': _table_baseline(base_set, lambda p: p.lines[0])}
  base_figs = {name: figures(np.array([f(p) for p in held]), held, constant)
               for name, f in baselines.items()}
  linear = ridge_reads(last_hidden(rt, state.params, [p.context for p in base_set]),
                       np.array([p.value for p in base_set]),
                       last_hidden(rt, state.params, [p.context for p in held]))
  base_figs['linear'] = figures(linear, held, constant)
  stream = prefixes(rt, settings, 'train', settings.seed + 3)
  curve, done, start = [], 0, time.time()

  def report():
    fig = figures(expected_reads(rt, rt.critic_params(state), held), held, constant)
    entry = {'pairs': done, 'seconds': round(time.time() - start, 1), 'critic': fig, **base_figs}
    curve.append(entry)
    if on_report is not None:
      on_report(curve)
    corrs = ', '.join(f'{k} {base_figs[k]["corr"]:+.3f}' for k in ('lookup', 'position', 'linear'))
    log(f'pairs {done:6d} ({entry["seconds"]:6.1f}s)  critic MAE {fig["mae"]:.3f} (constant '
        f'{fig["mae_constant"]:.3f}, lookup {base_figs["lookup"]["mae"]:.3f})  corr '
        f'{fig["corr"]:+.3f} ({corrs})  spread {fig["spread"]:.3f} (values '
        f'{fig["value_spread"]:.3f})')

  report()
  lr = np.float32(settings.learning_rate)
  while done < settings.pairs:
    batch_prefixes = [next(stream) for _ in range(settings.pairs_per_update)]
    records = [probe._Record('', p.context[:0], None, critic_lib.round_to_grid(p.value), 1.0)
               for p in batch_prefixes]
    batch = records_batch(rt, [p.context for p in batch_prefixes], records)
    state, _ = rt.critic_step(state, batch, lr)
    done += len(batch_prefixes)
    if done // settings.eval_every != (done - len(batch_prefixes)) // settings.eval_every:
      report()
  if curve[-1]['pairs'] != done:
    report()
  return curve


def main(argv: Sequence[str]) -> None:
  from ac2_jax.learner import rows
  args, _, settings, rt, state = probe.build_from_args(
      'bench.py critic_exact', __doc__, ExactSettings, 'task.builtin_scoring=leading', argv)
  run(rt, state, settings, records_batch=rows.critic_records_batch,
      on_report=probe.curve_writer(args, settings))
