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

`--curriculum=1:12000,2:6000,0:12000` trains in stages, each (cut_lines, pairs), as the run's critic
warm-up does (train/critic_warmup.py, `config.critic.warmup`); the held-out prefixes are cut as the
last stage cuts, and the critic is also read on prefixes cut as each earlier stage cuts. With a
config whose `critic.warmup` is set, the critic starts warmed up (`--pairs=0` reads it as it is).

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
from ac2_jax.learner import rows as rollouts
from ac2_jax.train import critic_warmup

LABELS = critic_warmup.LABELS


@dataclasses.dataclass(frozen=True)
class ExactSettings:
  pairs: int = 6_400
  pairs_per_update: int = 32
  eval_every: int = 1_280
  learning_rate: float = 1e-3
  mistake_rate: float = 0.3     # per-step mistake rate of the corpus the prefixes come from
  # The corpus's blind facts, as the warm-up's (critic_warmup.WarmupSettings): without them a
  # blind-fact setting's corpus at mistake_rate 0 has one value for every prefix. -1: the
  # config's sft.blind_fraction (`main` resolves it; 0 where no config names one).
  blind_fraction: float = -1.0
  held_out: int = 512           # prefixes of validation problems
  baseline_pairs: int = 4_000   # training prefixes the baselines' tables are built from
  with_reference: float = 1.0   # share of critic prompts that carry the reference solution
  labels: str = 'value'         # 'value' | 'start' | 'state' | 'state_lines' (the controls)
  # 0: cut at a uniform token of the reasoning; N: right after 1..N whole lines (uniform), the
  # easiest case, where the value turns on one or two lines only.
  cut_lines: int = 0
  # Stages 'cut_lines:pairs,...' (critic_warmup.parse_curriculum) instead of (cut_lines, pairs):
  # the warm-up's curriculum. Held out: prefixes at every stage's cut, read after each report.
  curriculum: str = ''
  # 'verdicts' | 'lines' | 'recompute' | 'inline': the critic writes y/n per line of the attempt
  # before its value (a thinking critic, a departure from the paper's "Don't think"; 'lines'
  # repeats each line before its verdict, 'recompute' has the critic work each step out before
  # judging it, 'inline' puts the verdict inside the attempt after each result:
  # critic_warmup.with_verdicts). Its reads decode its tokens greedily, then read the value; the
  # report adds the verdicts' accuracy and the reads with the true rationale written in (oracle).
  rationale: str = ''
  seed: int = 0

  def __post_init__(self):
    if self.rationale not in critic_warmup.RATIONALES:
      raise ValueError(f'rationale must be one of {critic_warmup.RATIONALES}, got '
                       f'{self.rationale!r}')
    if self.labels not in LABELS:
      raise ValueError(f'labels must be one of {LABELS}, got {self.labels!r}')
    if not 0.0 <= self.mistake_rate < 1.0:
      raise ValueError(f'mistake_rate must lie in [0, 1), got {self.mistake_rate}')
    if not (self.blind_fraction == -1.0 or 0.0 <= self.blind_fraction < 1.0):
      raise ValueError(f'blind_fraction must be -1 (the config\'s) or lie in [0, 1), got '
                       f'{self.blind_fraction}')
    if self.cut_lines < 0:
      raise ValueError(f'cut_lines must be >= 0, got {self.cut_lines}')
    if min(self.pairs_per_update, self.eval_every, self.held_out) < 1 or self.pairs < 0:
      raise ValueError('pairs >= 0 and pairs_per_update, eval_every, held_out >= 1 required')
    self.warmup()  # a malformed curriculum fails here

  def stages(self) -> tuple[tuple[int, int], ...]:
    return (critic_warmup.parse_curriculum(self.curriculum) if self.curriculum
            else ((self.cut_lines, self.pairs),) if self.pairs else ())

  def warmup(self) -> critic_warmup.WarmupSettings:
    """The warm-up these settings run (its stages, rate, batch and corpus)."""
    return critic_warmup.WarmupSettings(
        curriculum=self.stages(), learning_rate=self.learning_rate,
        pairs_per_update=self.pairs_per_update, mistake_rate=self.mistake_rate,
        with_reference=self.with_reference, blind_fraction=self.blind(), seed=self.seed)

  def blind(self) -> float:
    return max(self.blind_fraction, 0.0)


def prefixes(rt, settings: ExactSettings, split: str, seed: int, cut_lines: int | None = None
             ) -> Iterator[critic_warmup.ExactPrefix]:
  """Corpus prefixes of `split`'s problems with exact values (or the control's labels), forever."""
  return critic_warmup.exact_prefixes(
      rt, split, seed, cut_lines=settings.cut_lines if cut_lines is None else cut_lines,
      mistake_rate=settings.mistake_rate, with_reference=settings.with_reference,
      blind_fraction=settings.blind(), labels=settings.labels)


def _table_baseline(train: Sequence[critic_warmup.ExactPrefix], key) -> callable:
  mean = float(np.mean([p.value for p in train]))
  groups: dict = {}
  for p in train:
    groups.setdefault(key(p), []).append(p.value)
  table = {k: float(np.mean(v)) for k, v in groups.items()}
  return lambda p: table.get(key(p), mean)


def figures(reads: np.ndarray, held: Sequence[critic_warmup.ExactPrefix], constant: float
            ) -> dict:
  values = np.array([p.value for p in held])
  return {'mae': float(np.abs(reads - values).mean()),
          'mae_constant': float(np.abs(values - constant).mean()),
          'corr': probe._corr(reads, values), 'spread': float(reads.std()),
          'value_spread': float(values.std()),
          'corr_within': probe._corr(*within_position(reads, values, held))}


def within_position(reads: np.ndarray, values: np.ndarray,
                    held: Sequence[critic_warmup.ExactPrefix]) -> tuple[np.ndarray, np.ndarray]:
  """Reads and values less their means over prefixes of the same position (the lookup key's
  first part: lines written; the walk's moves left): what is left is what a chunk's lines
  change, the part of a value that a reader of the attempt's length alone cannot know."""
  position = np.array([p.lines[0] for p in held])
  out = []
  for x in (reads, values):
    means = {k: x[position == k].mean() for k in set(position.tolist())}
    out.append(x - np.array([means[k] for k in position.tolist()]))
  return out[0], out[1]


def expected_reads(rt, params, held: Sequence[critic_warmup.ExactPrefix],
                   contexts: Sequence[np.ndarray] | None = None) -> np.ndarray:
  """The expectation readout over the grid tokens (one forward per prefix)."""
  grid_ids = [critic_lib.value_target_ids(rt.tokenizer, v)[0] for v in critic_lib.GRID]
  contexts = [p.context for p in held] if contexts is None else contexts
  probs_NxM = sampling.token_distribution(rt.model_config, params, contexts, grid_ids,
                                          renormalize=True, mesh=rt.mesh)
  return probs_NxM @ np.asarray(critic_lib.GRID, np.float64)


def decode_rationale(rt, params, held: Sequence[critic_warmup.ExactPrefix], layout: str
                     ) -> list[np.ndarray]:
  """Each prefix's critic prompt with the rationale's critic-written tokens (`with_verdicts`
  positions) chosen by the critic: greedy over the slot's own kind (a verdict y/n, or a digit for
  a worked result; the host writes the rest). Every slot is read in one forward and refilled with
  its argmax until none changes (`sampling.token_distributions_at`): what greedy decoding, slot
  after slot, would write, in at most one pass per slot."""
  tok = rt.tokenizer
  verdict_ids = [critic_lib.prompt.verdict_token(tok, v) for v in (True, False)]
  digit_ids = [tok.encode(str(d))[0] for d in range(10)]
  candidates = verdict_ids + digit_ids
  forms = [critic_warmup.with_verdicts(rt, p, layout) for p in held]
  # A slot's kind is its true token's: candidates[:2] for a verdict, [2:] for a digit.
  kinds = [np.array([ids[k] in verdict_ids for k in at], bool) for ids, at in forms]
  contexts = [ids.copy() for ids, _ in forms]
  for c, (_, at), verdict in zip(contexts, forms, kinds):
    c[at] = np.where(verdict, verdict_ids[0], digit_ids[0])
  todo = [i for i, (_, at) in enumerate(forms) if at]
  for _ in range(max((len(at) for _, at in forms), default=0) + 1):
    if not todo:
      break
    probs = sampling.token_distributions_at(rt.model_config, params, [contexts[i] for i in todo],
                                            [forms[i][1] for i in todo], candidates, mesh=rt.mesh)
    changed = []
    for i, p_WxC in zip(todo, probs):
      said = np.where(kinds[i], np.take(verdict_ids, p_WxC[:, :2].argmax(-1)),
                      np.take(digit_ids, p_WxC[:, 2:].argmax(-1)))
      if (contexts[i][forms[i][1]] != said).any():
        contexts[i][forms[i][1]] = said
        changed.append(i)
    todo = changed
  return contexts


def rationale_reads(rt, params, held: Sequence[critic_warmup.ExactPrefix], layout: str
                    ) -> tuple[np.ndarray, dict]:
  """A verdict critic's reads (its own rationale written, then the value read) and, beside them,
  its verdicts' accuracy over the held-out lines, its worked results' ('recompute'), and its
  reads with the true rationale written in (oracle)."""
  own = decode_rationale(rt, params, held, layout)
  truth = [critic_warmup.with_verdicts(rt, p, layout) for p in held]
  yes, no = (critic_lib.prompt.verdict_token(rt.tokenizer, v) for v in (True, False))
  said = np.concatenate([c[at] for c, (_, at) in zip(own, truth)] + [np.zeros(0, np.int32)])
  right = np.concatenate([ids[at] for ids, at in truth] + [np.zeros(0, np.int32)])
  verdict = np.isin(right, [yes, no])
  wrong = right == no
  mean = lambda x: float(np.mean(x)) if len(x) else 1.0
  extra = {'verdict_accuracy': mean(said[verdict] == right[verdict]),
           'wrong_lines_caught': mean(said[wrong] == no),
           'result_accuracy': (mean(said[~verdict] == right[~verdict]) if (~verdict).any()
                               else None),  # None: the layout has no worked results
           'oracle_reads': expected_reads(rt, params, held, [ids for ids, _ in truth])}
  return expected_reads(rt, params, held, own), extra


def self_checks(rt, params, prefixes: Sequence[critic_warmup.ExactPrefix]) -> list[int]:
  """How many of each chain prefix's written lines the policy itself would have written: its
  greedy digits at each line's result, read in the attempt's own context (the start of the critic
  prompt), are the written ones (`rows.self_check_verdicts`). With the lines written, what the
  policy's generation already knows about a prefix's value: the `self` baseline."""
  return [sum(verdicts) for _, verdicts in
          rollouts.self_check_verdicts(rt, params, [p.context for p in prefixes])]


def self_check_accuracy(rt, params, prefixes: Sequence[critic_warmup.ExactPrefix]) -> float:
  """The share of the prefixes' written lines whose self-check verdict (`critic.self_check`,
  read with `params`) is the line's local check."""
  said, right = [], []
  for p, (_, verdicts) in zip(prefixes, rollouts.self_check_verdicts(
      rt, params, [p.context for p in prefixes])):
    if len(verdicts) == len(p.verdicts):
      said += verdicts
      right += p.verdicts
  return float(np.mean(np.array(said) == np.array(right))) if said else float('nan')


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


def run(rt, state, settings: ExactSettings, *, log=print, on_report=None, on_trained=None
        ) -> list[dict]:
  """Trains the critic alone on exact-valued corpus prefixes (`critic_warmup.train`: the stages of
  `settings.stages()`); evaluates on held-out problems, cut as the last stage cuts (the baselines'
  figures too) and as each earlier stage cuts (`by_cut`: the critic's figures alone)."""
  if rt.critic_marks and settings.rationale:
    raise ValueError('critic.self_check / critic.reference_check mark the lines themselves: run '
                     'without --rationale')
  stages = settings.stages()
  final_cut = stages[-1][0] if stages else settings.cut_lines
  cuts = sorted({cut for cut, _ in stages} - {final_cut})
  held_out = lambda cut: [next(it) for it in [prefixes(rt, settings, 'validation',
                                                       settings.seed + 1, cut)]
                          for _ in range(settings.held_out)]
  held = held_out(final_cut)
  held_by_cut = {cut: held_out(cut) for cut in cuts}
  base = prefixes(rt, settings, 'train', settings.seed + 2, final_cut)
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
  if all(len(p.verdicts) == p.lines[0] for p in base_set + held):  # the chain: lines to check
    checked = self_checks(rt, state.params, base_set + held)
    key = dict(zip(map(id, base_set + held), checked))
    table = _table_baseline(base_set, lambda p: (p.lines[0], key[id(p)]))
    base_figs['self'] = figures(np.array([table(p) for p in held]), held, constant)
  curve, start = [], time.time()

  def read(params, policy, h):
    if rt.critic_marks:  # the prompts as the run's critic reads them
      checked = rollouts.self_checked(rt, policy, [p.context for p in h])
      return {**figures(expected_reads(rt, params, h, checked), h, constant),
              'self_check_accuracy': self_check_accuracy(rt, policy, h)}
    if not settings.rationale:
      return figures(expected_reads(rt, params, h), h, constant)
    reads, extra = rationale_reads(rt, params, h, settings.rationale)
    oracle = figures(extra.pop('oracle_reads'), h, constant)
    return {**figures(reads, h, constant), **extra, 'oracle_corr': oracle['corr'],
            'oracle_mae': oracle['mae']}

  def report(state, done):
    params = rt.critic_params(state)
    fig = read(params, state.params, held)
    by_cut = {critic_warmup.stage_name(cut): read(params, state.params, h)
              for cut, h in held_by_cut.items()}
    entry = {'pairs': done, 'seconds': round(time.time() - start, 1), 'critic': fig, **base_figs,
             **({'by_cut': by_cut} if by_cut else {})}
    curve.append(entry)
    if on_report is not None:
      on_report(curve)
    corrs = ', '.join(f'{k} {base_figs[k]["corr"]:+.3f}' for k in ('lookup', 'position', 'linear',
                                                                    'self') if k in base_figs)
    earlier = ''.join(f'  [cut_lines={cut}: corr {f["corr"]:+.3f} (within {f["corr_within"]:+.3f}),'
                      f' MAE {f["mae"]:.3f}]' for cut, f in by_cut.items())
    verdicts = ''
    if 'self_check_accuracy' in fig:
      verdicts = f'  self-check verdicts right {fig["self_check_accuracy"]:.3f}'
    if settings.rationale:
      worked = ('' if fig['result_accuracy'] is None
                else f', worked results {fig["result_accuracy"]:.3f}')
      verdicts = (f'  verdicts: accuracy {fig["verdict_accuracy"]:.3f}, wrong lines caught '
                  f'{fig["wrong_lines_caught"]:.3f}{worked}; with the true rationale corr '
                  f'{fig["oracle_corr"]:+.3f}, MAE {fig["oracle_mae"]:.3f}')
    log(f'pairs {done:6d} ({entry["seconds"]:6.1f}s)  critic MAE {fig["mae"]:.3f} (constant '
        f'{fig["mae_constant"]:.3f}, lookup {base_figs["lookup"]["mae"]:.3f})  corr '
        f'{fig["corr"]:+.3f} ({corrs}; within a position {fig["corr_within"]:+.3f}, lookup '
        f'{base_figs["lookup"]["corr_within"]:+.3f})  spread {fig["spread"]:.3f} (values '
        f'{fig["value_spread"]:.3f}){verdicts}{earlier}')

  def on_pairs(state, done):
    if done // settings.eval_every > curve[-1]['pairs'] // settings.eval_every:
      report(state, done)

  report(state, 0)
  warmup = settings.warmup()
  state = critic_warmup.train(rt, state, warmup, labels=settings.labels,
                              rationale=settings.rationale, on_pairs=on_pairs)
  if curve[-1]['pairs'] != warmup.pairs:
    report(state, warmup.pairs)
  if on_trained is not None:
    on_trained(state)
  return curve


def keep_as_warmup(config, workdir: str, rt, settings: ExactSettings, log=print):
  """`on_trained` that saves a curriculum's critic where a run of `config` with the same
  critic.warmup* finds its warm-up (train/critic_warmup.py), so a probe or a run reuses it."""
  from ac2_jax.train import experiment

  def keep(state):
    if (config.critic.warmup or not settings.curriculum or settings.labels != 'value'
        or settings.rationale):
      # The run's own warm-up trained further, a single stage, a control's labels, or a critic
      # that writes a rationale (runs read the paper's critic, which does not).
      return
    c = config.copy_and_resolve_references()
    c.critic.warmup = settings.curriculum
    c.critic.warmup_learning_rate = settings.learning_rate
    c.critic.warmup_pairs_per_update = settings.pairs_per_update
    c.critic.warmup_mistake_rate = settings.mistake_rate
    warmup = experiment.critic_warmup_settings(c)
    if warmup != settings.warmup():
      log(f'not kept as a warm-up: a run with critic.warmup={settings.curriculum!r} would train '
          f'{warmup}, this trained {settings.warmup()}')
      return
    checkpoint = experiment.initial_checkpoint(c, workdir, rt.task, rt.tokenizer, log=log)
    key = experiment.critic_warmup_key(c, checkpoint)
    critic_warmup.save(state, workdir, key, warmup)
    log(f'kept as the warm-up of --config.critic.warmup={settings.curriculum} '
        f'--config.critic.warmup_learning_rate={settings.learning_rate:g} '
        f'--config.critic.warmup_pairs_per_update={settings.pairs_per_update} '
        f'--config.critic.warmup_mistake_rate={settings.mistake_rate:g}: '
        f'{critic_warmup.directory(workdir, key)}')
  return keep


def main(argv: Sequence[str]) -> None:
  args, config, settings, rt, state = probe.build_from_args(
      'bench.py critic_exact', __doc__, ExactSettings, 'task.builtin_scoring=leading', argv)
  if settings.blind_fraction < 0:
    settings = dataclasses.replace(settings, blind_fraction=config.sft.blind_fraction)
  run(rt, state, settings, on_report=probe.curve_writer(args, settings),
      on_trained=keep_as_warmup(config, args.workdir, rt, settings))
